package bench

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Multi-turn sessions (--sessions S --turns T): S conversations of a system
// message and T user turns. Turn k sends the whole history so far — system,
// user 1, assistant 1, …, user k — where assistant i is what the endpoint
// answered on turn i, read from its stream: the workload in which a
// conversation's next turn should go where its history is cached. A
// session's turns are sequential; sessions run side by side, at most
// --concurrency at once, started in shuffled order (by --seed). With
// --compare-url both endpoints run the same sessions, each with its own
// answers. Request i of the run is session i/T, turn i%T+1.

// sessionSpec is one conversation before it runs: its system message and
// user turns. The assistant turns come from the endpoint.
type sessionSpec struct {
	system    string
	users     []string
	outputLen int
}

// makeSessions makes n sessions of turns user turns of inputLen words each,
// in shuffled order. The system messages are prefixLen words: one for all
// sessions, or with groups > 0 that many, session i getting system prompt i
// mod groups (groups = n: each session its own), drawn as --prefix-groups
// draws its prefixes.
func makeSessions(seed uint64, n, turns, prefixLen, inputLen, outputLen, groups int) []sessionSpec {
	rng := rand.New(rand.NewPCG(seed, 4))
	systems := []string{sharedPrefix(seed, prefixLen)}
	if groups > 0 {
		systems = make([]string, groups)
		for g := range systems {
			systems[g] = sharedPrefix(seed+uint64(g)*0x9e3779b97f4a7c15, prefixLen)
		}
	}
	out := make([]sessionSpec, n)
	for i := range out {
		s := sessionSpec{system: systems[i%len(systems)], users: make([]string, turns), outputLen: outputLen}
		for k := range s.users {
			var b strings.Builder
			randomWords(&b, rng, inputLen)
			s.users[k] = b.String()
		}
		out[i] = s
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// sessionPlaceholders are the run's prompts in session mode, one per turn,
// carrying only the prompt-size estimate used when usage is missing: the
// words of the history (an answer counted as outputLen words).
func sessionPlaceholders(sess []sessionSpec) []promptSpec {
	var out []promptSpec
	for _, s := range sess {
		est := len(strings.Fields(s.system))
		for _, u := range s.users {
			est += len(strings.Fields(u))
			out = append(out, promptSpec{outputLen: s.outputLen, inputEst: est})
			est += s.outputLen
		}
	}
	return out
}

// historyMessages is the messages array of turn k (0-based) of a session:
// the system message (if any), then user 1, assistant 1, …, user k+1, where
// answers[i] is the endpoint's answer to turn i (len(answers) >= k).
func historyMessages(system string, users, answers []string, k int) json.RawMessage {
	msgs := make([]chatMessage, 0, 2*k+2)
	if system != "" {
		msgs = append(msgs, chatMessage{Role: "system", Content: system})
	}
	for i := 0; i < k; i++ {
		msgs = append(msgs, chatMessage{Role: "user", Content: users[i]}, chatMessage{Role: "assistant", Content: answers[i]})
	}
	msgs = append(msgs, chatMessage{Role: "user", Content: users[k]})
	b, _ := json.Marshal(msgs)
	return b
}

// runSessionPhase runs sessions [lo, hi) against e, session i starting at
// arrival offset arr[i-lo], at most --concurrency sessions at once, each one
// request at a time. A turn that fails ends its session (later turns are not
// sent: there is no answer to build them on). A budget > 0 caps the phase as
// in runPhase.
func runSessionPhase(ctx context.Context, e *endpoint, cfg *config, sess []sessionSpec, lo, hi int, arr []time.Duration, budget time.Duration, prog *progress) {
	paced(ctx, e, cfg, lo, hi, arr, budget, func(pctx context.Context, i int, at time.Duration) {
		began := time.Now() // at, on the load clock
		s := &sess[i]
		turns := len(s.users)
		answers := make([]string, 0, turns)
		for k := 0; k < turns && pctx.Err() == nil; k++ {
			p := promptSpec{messages: historyMessages(s.system, s.users, answers, k), outputLen: s.outputLen}
			body := buildBody(p, e.model, "chat", cfg.stream, cfg.usage, cfg.ignEOS)
			rec := &e.recs[i*turns+k]
			rec.Start = at + time.Since(began)
			prog.inflight.Add(1)
			e.c.do(pctx, body, rec)
			prog.inflight.Add(-1)
			prog.finish(rec)
			if !rec.ok() {
				return
			}
			answers = append(answers, schemas.String(rec.Text))
			rec.Text = nil // the history holds it now
		}
	})
}

// TurnStats are the figures of one turn of the sessions (Turn ≥ 1), or of
// every turn after the first (Turn 0, "later turns"): where the history is
// there to be reused.
type TurnStats struct {
	Turn         int  `json:"turn"` // 0: turns ≥ 2 together
	Completed    int  `json:"completed"`
	InputTokens  int  `json:"input_tokens"`
	CachedTokens int  `json:"cached_input_tokens"`
	TTFT         Dist `json:"ttft_ms"`
}

// turnStats sums the completed records by turn (record.Turn, 1-based), then
// turns ≥ 2 together; nil when the records have no turns (not a session run).
func turnStats(recs []record, turns int) (byTurn []TurnStats, later *TurnStats) {
	if turns <= 0 {
		return nil, nil
	}
	byTurn = make([]TurnStats, turns)
	ttft := make([][]float64, turns)
	later = &TurnStats{}
	var laterTTFT []float64
	for i := range recs {
		r := &recs[i]
		if !r.ok() || r.Turn < 1 || r.Turn > turns {
			continue
		}
		t := &byTurn[r.Turn-1]
		t.Completed++
		t.InputTokens += r.PromptTokens
		t.CachedTokens += r.CachedTokens
		ttft[r.Turn-1] = append(ttft[r.Turn-1], ms(r.TTFT()))
		if r.Turn > 1 {
			later.Completed++
			later.InputTokens += r.PromptTokens
			later.CachedTokens += r.CachedTokens
			laterTTFT = append(laterTTFT, ms(r.TTFT()))
		}
	}
	for k := range byTurn {
		byTurn[k].Turn = k + 1
		byTurn[k].TTFT = summarize(ttft[k])
	}
	later.TTFT = summarize(laterTTFT)
	return byTurn, later
}
