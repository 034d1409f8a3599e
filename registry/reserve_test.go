package registry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// Concurrent requests reserve at admission, so however many race, the
// tokens admitted exceed TPM by at most one request's reservation.
func testTokensPerMinuteReserved(t *testing.T, b *backend) {
	s := b.store(t)
	l, _ := newLimiter(s)
	k := registry.Key{ID: "key_tpm_race", KeySpec: registry.KeySpec{TPM: 200}}
	const reserve = 52 // e.g. 2 prompt tokens + max_tokens 50
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := l.Admit(context.Background(), k, registry.Admission{Requests: 1, Tokens: reserve})
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	// t < 200 admits: 0, 52, 104, 156 pass, 208 does not.
	if n := admitted.Load(); n*reserve > 200+reserve || n != 4 {
		t.Fatalf("%d requests of %d tokens admitted under TPM 200", n, reserve)
	}
}

// Settling replaces the reservation with the real count in the
// reservation's window, and only there; a redelivered record counts once.
func testSettle(t *testing.T, b *backend) {
	s := b.store(t)
	l, clock := newLimiter(s)
	ctx := context.Background()
	k := registry.Key{ID: "key_settle", KeySpec: registry.KeySpec{TPM: 100, RPM: 10}}
	d, err := l.Admit(ctx, k, registry.Admission{Requests: 1, Tokens: 60})
	if err != nil || !d.Allowed || d.Reserved != 60 || d.Window == 0 || d.Tokens != 0 {
		t.Fatalf("%+v %v", d, err)
	}
	rec := schemas.UsageRecord{RequestID: "req-1", KeyID: k.ID, Model: "m",
		Usage: schemas.Usage{PromptTokens: 5, CompletionTokens: 10}, Reserved: d.Reserved, Window: d.Window}
	for i, wantDup := range []bool{false, true, true} {
		dup, err := l.Record(ctx, rec)
		if err != nil || dup != wantDup {
			t.Fatalf("record %d: dup %v, %v", i, dup, err)
		}
	}
	if d, err := l.Admit(ctx, k, registry.Admission{Requests: 1, Tokens: 0}); err != nil || d.Tokens != 15 || d.Requests != 2 {
		t.Fatalf("after settling: %+v %v", d, err)
	}
	rows, err := s.Usage(ctx, k.ID, "")
	if err != nil || len(rows) != 1 || rows[0].Requests != 1 || rows[0].TotalTokens != 15 {
		t.Fatalf("usage %+v %v", rows, err)
	}
	// A reservation of a past window settles nothing in the current one.
	d, _ = l.Admit(ctx, k, registry.Admission{Requests: 1, Tokens: 50})
	clock.add(time.Minute)
	if _, err := l.Record(ctx, schemas.UsageRecord{RequestID: "req-2", KeyID: k.ID, Model: "m",
		Usage: schemas.Usage{PromptTokens: 1, CompletionTokens: 1}, Reserved: d.Reserved, Window: d.Window}); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Admit(ctx, k, registry.Admission{Requests: 1}); err != nil || d.Tokens != 0 || d.Requests != 1 {
		t.Fatalf("new window: %+v %v", d, err)
	}
}

// n prompts count n requests against RPM; a request that would pass the
// limit is refused whole.
func testPromptsCountAsRequests(t *testing.T, b *backend) {
	s := b.store(t)
	l, _ := newLimiter(s)
	k := registry.Key{ID: "key_prompts", KeySpec: registry.KeySpec{RPM: 5}}
	for i, tc := range []struct {
		prompts int
		allowed bool
		count   int
	}{{3, true, 3}, {3, false, 3}, {2, true, 5}, {1, false, 5}} {
		d, err := l.Admit(context.Background(), k, registry.Admission{Requests: tc.prompts})
		if err != nil || d.Allowed != tc.allowed || d.Requests != tc.count {
			t.Fatalf("step %d: %+v %v", i, d, err)
		}
	}
}

func TestAdmissionOf(t *testing.T) {
	for _, tc := range []struct {
		name     string
		kind     schemas.Kind
		body     string
		maxToks  int
		requests int
		gen      int // tokens reserved for completions
	}{
		{"max_tokens", schemas.KindCompletion, `{"model":"m","prompt":"hello","max_tokens":50}`, 4096, 1, 50},
		{"capped by the model", schemas.KindCompletion, `{"model":"m","prompt":"hello","max_tokens":50000}`, 4096, 1, 4096},
		{"absent: the model's cap", schemas.KindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 300, 1, 300},
		{"max_completion_tokens", schemas.KindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":7}`, 300, 1, 7},
		{"n choices", schemas.KindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"n":3}`, 300, 1, 30},
		{"prompt array", schemas.KindCompletion, `{"model":"m","prompt":["a","b","c","d"],"max_tokens":10,"n":2}`, 300, 4, 80},
		{"token ids", schemas.KindCompletion, `{"model":"m","prompt":[1,2,3],"max_tokens":10}`, 300, 1, 10},
		{"token id lists", schemas.KindCompletion, `{"model":"m","prompt":[[1],[2]],"max_tokens":10}`, 300, 2, 20},
		// Nothing is generated: the prompt estimate only, one request per input.
		{"embedding", schemas.KindEmbedding, `{"model":"m","input":"hello"}`, 300, 1, 0},
		{"embedding inputs", schemas.KindEmbedding, `{"model":"m","input":["a","b","c"],"max_tokens":99}`, 300, 3, 0},
		{"embedding token id lists", schemas.KindEmbedding, `{"model":"m","input":[[1],[2]]}`, 300, 2, 0},
		{"tokenize", schemas.KindTokenize, `{"model":"m","prompt":"hello"}`, 300, 1, 0},
		{"detokenize", schemas.KindDetokenize, `{"model":"m","tokens":[1,2]}`, 300, 1, 0},
	} {
		req, perr := schemas.ReadRequest(tc.kind, []byte(tc.body), "")
		if perr != nil {
			t.Fatalf("%s: %v", tc.name, perr)
		}
		a := registry.AdmissionOf(req, tc.maxToks)
		want := registry.Admission{Requests: tc.requests, Tokens: (len(tc.body)+3)/4 + tc.gen}
		if a != want {
			t.Errorf("%s: %+v, want %+v", tc.name, a, want)
		}
	}
}

// With Redis stopped (SIGSTOP: connections hang, nothing is refused) a call
// waits no longer than the breaker's timeout, and once the breaker is open
// not at all; after SIGCONT a probe closes it again.
func TestBreakerOnStoppedRedis(t *testing.T) {
	s, r := openStore(t)
	var mu sync.Mutex
	var changes []string
	br := registry.NewBreaker(registry.BreakerConfig{Timeout: 50 * time.Millisecond, Failures: 3, Cooldown: 200 * time.Millisecond,
		OnChange: func(from, to registry.BreakerState) {
			mu.Lock()
			changes = append(changes, from.String()+">"+to.String())
			mu.Unlock()
		}})
	s.UseBreaker(br)
	l := registry.NewLimiter(s)
	k := registry.Key{ID: "key_br", KeySpec: registry.KeySpec{RPM: 1000}}
	ctx := context.Background()
	if _, err := l.Admit(ctx, k, registry.Admission{}); err != nil {
		t.Fatal(err)
	}
	pid := r.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	defer cont()
	for i := range 10 {
		start := time.Now()
		_, err := l.Admit(ctx, k, registry.Admission{})
		took := time.Since(start)
		if !errors.Is(err, registry.ErrUnavailable) {
			t.Fatalf("call %d: %v", i, err)
		}
		limit := 150 * time.Millisecond // the 50ms bound, with room for a busy machine
		if i >= 3 {
			limit = 20 * time.Millisecond // open: no Redis wait (50ms) at all
		}
		if took > limit {
			t.Fatalf("call %d took %s with Redis stopped (limit %s)", i, took, limit)
		}
	}
	if br.State() != registry.BreakerOpen {
		t.Fatalf("state %s", br.State())
	}
	cont()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if _, err := l.Admit(ctx, k, registry.Admission{}); err != nil {
			return err
		}
		if st := br.State(); st != registry.BreakerClosed {
			return errors.New("breaker " + st.String())
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(changes) < 3 || changes[0] != "closed>open" || changes[len(changes)-1] != "half_open>closed" {
		t.Fatalf("transitions %v", changes)
	}
}

// While Redis is down a cached key is served, but only for MaxStale after
// Redis last confirmed it.
func TestKeyCacheMaxStale(t *testing.T) {
	s, r := openStore(t)
	ctx := context.Background()
	k, secret, err := s.CreateKey(ctx, registry.KeySpec{Name: "stale", Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	c := registry.NewKeyCache(s, time.Nanosecond, nil) // every lookup asks Redis
	c.MaxStale = 300 * time.Millisecond
	if got, err := c.Lookup(ctx, secret); err != nil || got.ID != k.ID {
		t.Fatalf("%+v %v", got, err)
	}
	r.Stop()
	if got, err := c.Lookup(ctx, secret); err != nil || got.ID != k.ID {
		t.Fatalf("Redis down, just confirmed: %+v %v", got, err)
	}
	testenv.WaitFor(t, 5*time.Second, func() error {
		if _, err := c.Lookup(ctx, secret); !errors.Is(err, registry.ErrUnavailable) {
			return fmt.Errorf("still served past MaxStale: %v", err)
		}
		return nil
	})
}

// A batch counts as its records recorded one by one would (summed by key,
// model and reservation window: a reservation of a past window settles
// nothing, one of the current window does), each record once by its id.
func testRecordBatchSumsAsSingles(t *testing.T, b *backend) {
	ctx := context.Background()
	k := registry.Key{ID: "key_b1", KeySpec: registry.KeySpec{TPM: 10_000}}
	// state: usage rows of every key and the tokens k's current window holds.
	state := func(s *registry.Store, l *registry.Limiter, now time.Time) ([]registry.UsageRow, []registry.HourlyUsageRow, int) {
		rows, err := s.Usage(ctx, "", "")
		if err != nil {
			t.Fatal(err)
		}
		hourly, err := s.UsageHourly(ctx, "", "", now.Add(-time.Hour), now)
		if err != nil {
			t.Fatal(err)
		}
		d, err := l.Admit(ctx, k, registry.Admission{})
		if err != nil {
			t.Fatal(err)
		}
		return rows, hourly, d.Tokens
	}
	run := func(batch bool) ([]registry.UsageRow, []registry.HourlyUsageRow, int) {
		s := b.store(t)
		l, clock := newLimiter(s)
		old, err := l.Admit(ctx, k, registry.Admission{Requests: 1, Tokens: 40})
		if err != nil {
			t.Fatal(err)
		}
		clock.add(time.Minute) // old's window is past
		cur, err := l.Admit(ctx, k, registry.Admission{Requests: 2, Tokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		u := func(p, c int) schemas.Usage { return schemas.Usage{PromptTokens: p, CompletionTokens: c} }
		recs := []schemas.UsageRecord{
			{RequestID: "r1", KeyID: k.ID, Model: "m", Usage: u(10, 20), Reserved: 50, Window: cur.Window},
			{RequestID: "r2", KeyID: k.ID, Model: "m", Usage: u(5, 5), Reserved: 50, Window: cur.Window},
			{RequestID: "r3", KeyID: k.ID, Model: "m", Usage: u(7, 7), Reserved: 40, Window: old.Window},
			{RequestID: "r4", KeyID: k.ID, Model: "m", Usage: u(1, 2)},
			{RequestID: "r5", KeyID: k.ID, Model: "other", Usage: u(3, 3)},
			{RequestID: "r6", KeyID: "key_b2", Model: "m", Usage: u(4, 4)},
			{RequestID: "r7", Model: "m", Usage: u(9, 9)}, // no key: anonymous
		}
		if batch {
			// Delivered twice, and with a record in it twice (a request run
			// again): each counted once.
			for i, want := range []int{1, len(recs) + 1} {
				if dups, err := l.RecordBatch(ctx, append(recs, recs[0])); err != nil || dups != want {
					t.Fatalf("batch, delivery %d: %d dups, %v; want %d", i+1, dups, err, want)
				}
			}
		} else {
			for _, rec := range recs {
				if _, err := l.Record(ctx, rec); err != nil {
					t.Fatal(err)
				}
			}
		}
		return state(s, l, clock.now())
	}
	rows1, hourly1, tokens1 := run(false)
	rows2, hourly2, tokens2 := run(true)
	// 100 reserved, settled to 30 + 10; r3's old window settles nothing here;
	// r4 and r5 (no reservation) add 3 + 6.
	if tokens1 != 49 || tokens2 != tokens1 {
		t.Fatalf("window tokens: one by one %d, as a batch %d; want 49", tokens1, tokens2)
	}
	if fmt.Sprint(rows1) != fmt.Sprint(rows2) || len(rows1) != 4 {
		t.Fatalf("usage one by one %+v\nas a batch %+v", rows1, rows2)
	}
	if fmt.Sprint(hourly1) != fmt.Sprint(hourly2) || len(hourly1) != 4 {
		t.Fatalf("hourly one by one %+v\nas a batch %+v", hourly1, hourly2)
	}
}

// A request sent again after its worker failed is let in on its first
// admission (its reservation, its window), not counted again, at most
// MaxReadmits times; an id never admitted, or admitted without keeping it,
// is not let in that way.
func testReadmit(t *testing.T, b *backend) {
	s := b.store(t)
	l, _ := newLimiter(s)
	ctx := context.Background()
	k := registry.Key{ID: "key_readmit", KeySpec: registry.KeySpec{RPM: 10, TPM: 1000}}
	if _, ok, err := l.Readmit(ctx, k, "req-1"); ok || err != nil {
		t.Fatalf("readmitted a request never admitted: %v %v", ok, err)
	}
	d, err := l.Admit(ctx, k, registry.Admission{Requests: 1, Tokens: 60, RequestID: "req-1"})
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	for i := range registry.MaxReadmits {
		r, ok, err := l.Readmit(ctx, k, "req-1")
		if err != nil || !ok || !r.Allowed || r.Reserved != 60 || r.Window != d.Window {
			t.Fatalf("readmission %d: %+v %v %v; want the first admission's reservation", i, r, ok, err)
		}
	}
	if _, ok, _ := l.Readmit(ctx, k, "req-1"); ok {
		t.Fatalf("readmitted more than %d times", registry.MaxReadmits)
	}
	// Counted once: the next admission is the window's second request.
	if d, err := l.Admit(ctx, k, registry.Admission{Requests: 1, Tokens: 5}); err != nil || d.Requests != 2 || d.Tokens != 60 {
		t.Fatalf("after readmissions: %+v %v; want 2 requests and 60 tokens counted", d, err)
	}
	if _, ok, _ := l.Readmit(ctx, k, "req-2"); ok {
		t.Fatal("readmitted a request admitted without its id")
	}
	if _, ok, err := l.Readmit(ctx, registry.Key{ID: "key_free"}, "req-1"); ok || err != nil {
		t.Fatalf("a key without limits: %v %v", ok, err)
	}
}
