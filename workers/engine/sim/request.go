package sim

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// Sequence states. A sequence is counted in Stats.Waiting while stWaiting and
// in Stats.Running while stRunning; whoever moves it out of a state (the
// scheduler, or an abort from any goroutine) does so with a CAS and fixes the
// counts, so an abort shows in Stats at once.
const (
	stWaiting int32 = iota
	stRunning
	stDone // finished or aborted; the scheduler still has to free its blocks
)

type prompt struct {
	ids    []uint32
	hashes []uint64 // chained hashes of the full blocks of ids
	// For KV events (kvevents.go): the prompt text's block hashes, the
	// text hash each engine block starts in, and the text's length.
	text, tags []uint64
	spanLen    int
	lora       string // the adapter it runs on ("": the base model), for BlockEvents
}

// request is one Generate call: one or more prompts, n sequences each.
type request struct {
	e            *Engine
	ctx          context.Context
	sink         engine.Sink
	chat         bool
	stream       bool
	includeUsage bool
	keepText     bool // the text is kept: non-stream, or stop strings to look for
	includeStop  bool
	hold         bool // hold the first sequence's blocks for a remote decode (disagg.go)
	stops        []string
	maxStop      int // longest stop string
	n            int
	logprobs     bool // each token's logprobs (logprobs.go)
	topLogprobs  int
	id           string
	model        string
	created      int64
	prefix       []byte // chunk JSON up to and including `"choices":[`
	prompts      []prompt
	seqs         []seq
	done         chan struct{}
	aborted      atomic.Bool

	// owned by the scheduler; read by Generate after done is closed
	buf       []byte // this step's chunks
	mark      uint64 // the step that last wrote to buf
	live      int    // sequences not finished normally
	remaining int    // sequences not yet removed from the scheduler
	finished  bool
	err       error
	usage     schemas.Usage
	response  []byte

	kv *requestKV // the KV-transfer handshake (disagg.go); nil unless the request takes part
}

// seq is one output sequence (one choice).
type seq struct {
	req       *request
	prompt    *prompt
	index     int
	state     atomic.Int32
	maxTokens int
	minTokens int
	eosLen    int // natural length, unless ignoreEOS
	ignoreEOS bool
	rng       uint64

	generated int     // tokens produced
	base      int     // tokens a failed worker produced before (engine.Request.Resume): the sequence goes on from there
	computed  int     // tokens in the KV cache
	blocks    []int32 // block table
	text      []byte  // when req.keepText
	sent      int     // bytes of text already streamed
	prev      uint8   // kind of the previous token
	finish    string

	// The answer (answer.go): reasonLen tokens of reasoning, then the
	// script's tokens when the answer is made in advance (calls: the tool
	// calls they are the arguments of), else drawn words.
	reasonLen int
	script    []string
	calls     []callState
	reasoning []byte // the reasoning's text, when the text is kept

	// Logprobs (logprobs.go): the tokens not yet reported, the position
	// and (completions) text offset of the first, and the seed of their
	// values.
	lpToks   []string
	lpPos    int
	lpOffset int
	lpSeed   uint64

	cached   int   // prompt tokens found in the prefix cache (or transferred) at first admission
	xfer     int32 // prompt tokens taken from a remote prefill (disagg.go): computed at admission; 0 after a preemption
	admitted bool
	roleSent bool
}

func (e *Engine) newRequest(ctx context.Context, req *engine.Request, sink engine.Sink) (*request, error) {
	var chat bool
	switch req.Kind {
	case schemas.KindChat:
		chat = true
	case schemas.KindCompletion:
	default:
		return nil, schemas.ErrUnknownKind.New(req.Kind)
	}
	b, model, err := e.view(req)
	if err != nil {
		return nil, err
	}
	adapterName, salt, err := e.resolve(model)
	if err != nil {
		return nil, err
	}
	if model == "" {
		model = e.cur.Load().model
	}

	// The view's values are valid for any engine; these are this model's limits.
	n := b.N
	if n > e.cfg.MaxN {
		return nil, schemas.ErrAboveMax.At("n", "n", e.cfg.MaxN, n)
	}
	maxTokens := b.MaxTokens // 0: none
	if !chat && maxTokens == 0 {
		maxTokens = 16 // vLLM's default for completions
	}
	if maxTokens > 0 && b.MinTokens > maxTokens {
		return nil, schemas.ErrInvalidValue.At("min_tokens", "min_tokens",
			fmt.Sprintf("it must be at most max_tokens=%d, but got %d", maxTokens, b.MinTokens))
	}
	minTokens := b.MinTokens
	stopList := b.Stop
	stream := b.Stream
	plan, perr := e.plan(b, chat)
	if perr != nil {
		return nil, perr
	}

	var promptIDs [][]uint32
	promptParam := "prompt"
	if chat {
		promptParam = "messages"
		promptIDs = [][]uint32{chatTemplate(b.Messages, b.ContinueFinalMessage)}
	} else {
		var perr *schemas.Error
		if promptIDs, perr = completionPrompts(b.Prompt); perr != nil {
			return nil, perr
		}
	}
	limit := e.cfg.MaxModelLen
	for _, ids := range promptIDs {
		p := len(ids)
		if maxTokens == 0 && p >= limit {
			return nil, schemas.ErrContextLength.At(promptParam, limit,
				fmt.Sprintf("%d tokens in the messages", p), "messages")
		}
		if maxTokens > 0 && p+maxTokens > limit {
			return nil, schemas.ErrContextLength.At(promptParam, limit,
				fmt.Sprintf("%d tokens (%d in the messages, %d in the completion)", p+maxTokens, p, maxTokens), "messages or completion")
		}
	}

	r := &request{
		e:            e,
		ctx:          ctx,
		sink:         sink,
		chat:         chat,
		stream:       stream,
		includeUsage: b.IncludeUsage,
		includeStop:  b.IncludeStopStr,
		stops:        stopList,
		n:            n,
		logprobs:     b.Logprobs,
		topLogprobs:  b.TopLogprobs,
		model:        model,
		created:      time.Now().Unix(),
		done:         make(chan struct{}),
		prompts:      make([]prompt, len(promptIDs)),
		seqs:         make([]seq, n*len(promptIDs)),
	}
	r.keepText = !stream || len(stopList) > 0
	for _, s := range stopList {
		r.maxStop = max(r.maxStop, len(s))
	}
	rid := req.ID
	if rid == "" {
		rid = strconv.FormatUint(e.nextID.Add(1), 16)
	}
	if chat {
		r.id = "chatcmpl-" + rid
	} else {
		r.id = "cmpl-" + rid
	}
	if stream {
		p := append(make([]byte, 0, 128), `{"id":`...)
		p = appendString(p, r.id)
		if chat {
			p = append(p, `,"object":"chat.completion.chunk","created":`...)
		} else {
			p = append(p, `,"object":"text_completion","created":`...)
		}
		p = strconv.AppendInt(p, r.created, 10)
		p = append(p, `,"model":`...)
		p = appendString(p, model)
		r.prefix = append(p, `,"choices":[`...)
		r.buf = make([]byte, 0, 512*n)
	}

	bs := e.cfg.BlockSize
	root := uint64(0x5eed) ^ e.cur.Load().salt // a sim that switches models keeps each one's blocks apart
	if adapterName != "" {
		root = schemas.StringHash("lora:" + adapterName) // adapters do not share KV blocks with the base model
	}
	ignoreEOS := b.IgnoreEOS
	span := uint64(e.cfg.MaxEOS - e.cfg.MinEOS + 1)
	for pi, ids := range promptIDs {
		pr := &r.prompts[pi]
		pr.ids, pr.lora = ids, adapterName
		pr.hashes = make([]uint64, len(ids)/bs)
		h := root
		for i := range pr.hashes {
			h = schemas.TokenBlockHash(h, ids[i*bs:(i+1)*bs])
			pr.hashes[i] = h
		}
		if len(promptIDs) == 1 { // one prompt: its text is the request's
			e.textTags(pr, model, req.Body)
		}
		var seed uint64
		switch {
		case b.HasSeed:
			seed = uint64(b.Seed)
		case req.Resume > 0 && len(ids) > req.Resume:
			// A continuation's prompt ends with the tokens already
			// generated (each of the sim's tokens encodes back to one):
			// the seed is the original prompt's.
			seed = schemas.TokenBlockHash(0, ids[:len(ids)-req.Resume])
		default:
			seed = schemas.TokenBlockHash(0, ids)
		}
		seed ^= salt ^ e.cur.Load().salt // 0 for the base model of a sim of one model
		mt := limit - len(ids)
		if maxTokens > 0 {
			mt = maxTokens
		}
		for o := 0; o < n; o++ {
			idx := pi*n + o
			s := &r.seqs[idx]
			s.req, s.prompt, s.index = r, pr, idx
			s.maxTokens, s.minTokens, s.ignoreEOS = mt, minTokens, ignoreEOS
			s.rng = schemas.Mix64(seed^uint64(idx+1)*0x9e3779b97f4a7c15) | 1
			s.lpSeed, s.reasonLen = s.rng, plan.reasoning
			if plan.scripted() {
				plan.fill(s, s.rng)
			}
			s.eosLen = max(e.cfg.MinEOS+int(s.rand()%span), minTokens, 1)
			if req.Resume > 0 {
				// Resume counts the answer's tokens (a client counts the
				// content it streamed); the reasoning came before them.
				s.resume(chat, s.reasonLen+req.Resume)
			}
			expect := mt
			switch {
			case s.script != nil:
				expect = min(mt, s.reasonLen+len(s.script))
			case !ignoreEOS:
				expect = min(mt, s.reasonLen+s.eosLen)
			}
			s.blocks = make([]int32, 0, (len(ids)+min(expect, 1024))/bs+1)
			if r.keepText {
				s.text = make([]byte, 0, min(expect, 1024)*7)
			}
		}
	}
	if b.KVTransfer != nil {
		if err := r.readTransfer(b.KVTransfer, root); err != nil {
			return nil, err
		}
	}
	r.live = len(r.seqs)
	r.remaining = len(r.seqs)
	return r, nil
}

// abort cancels every sequence of r: from the context's AfterFunc, from the
// scheduler when the sink fails, or at shutdown.
func (r *request) abort() {
	if !r.aborted.CompareAndSwap(false, true) {
		return
	}
	e := r.e
	for i := range r.seqs {
		s := &r.seqs[i]
		for {
			st := s.state.Load()
			if st == stDone {
				break
			}
			if s.state.CompareAndSwap(st, stDone) {
				if st == stWaiting {
					e.nWaiting.Add(-1)
				} else {
					e.nRunning.Add(-1)
				}
				break
			}
		}
	}
	e.abortsPending.Add(1)
	e.signal()
}

// computeUsage sums the usage over the prompts and sequences; a prompt is
// counted once however many sequences it has.
func (r *request) computeUsage() schemas.Usage {
	var u schemas.Usage
	cached := 0
	for i := range r.prompts {
		u.PromptTokens += len(r.prompts[i].ids)
		cached += r.seqs[i*r.n].cached
	}
	for i := range r.seqs {
		u.CompletionTokens += r.seqs[i].generated
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.PromptTokensDetails = &schemas.TokenDetails{CachedTokens: cached}
	return u
}

// buildResponse is the whole chat.completion or text_completion object.
func (r *request) buildResponse() []byte {
	size := 256
	for i := range r.seqs {
		size += len(r.seqs[i].text) + len(r.seqs[i].reasoning) + 128
		if r.logprobs {
			size += r.seqs[i].generated * (64 + 48*r.topLogprobs)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, `{"id":`...)
	b = appendString(b, r.id)
	if r.chat {
		b = append(b, `,"object":"chat.completion","created":`...)
	} else {
		b = append(b, `,"object":"text_completion","created":`...)
	}
	b = strconv.AppendInt(b, r.created, 10)
	b = append(b, `,"model":`...)
	b = appendString(b, r.model)
	b = append(b, `,"choices":[`...)
	for i := range r.seqs {
		s := &r.seqs[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(s.index), 10)
		if r.chat {
			b = r.appendMessage(b, s)
		} else {
			b = append(b, `,"text":`...)
			b = appendString(b, s.text)
		}
		b = append(b, `,"logprobs":`...)
		b = r.appendLogprobs(b, s)
		b = append(b, `,"finish_reason":`...)
		b = appendString(b, s.finish)
		b = append(b, '}')
	}
	b = append(b, `],"usage":`...)
	b = schemas.AppendUsage(b, &r.usage)
	if r.hold {
		b = r.appendTransferParams(b)
	}
	return append(b, '}')
}

// appendMessage writes a chat choice's message: its reasoning (with
// reasoning on), its content (null for tool calls, or when the reasoning
// took every token), its tool calls.
func (r *request) appendMessage(b []byte, s *seq) []byte {
	b = append(b, `,"message":{"role":"assistant",`...)
	if s.reasonLen > 0 {
		b = append(b, `"reasoning_content":`...)
		b = appendString(b, s.reasoning)
		b = append(b, ',')
	}
	b = append(b, `"content":`...)
	if s.calls != nil || s.reasonLen > 0 && s.base+s.generated <= s.reasonLen {
		b = append(b, "null"...)
	} else {
		b = appendString(b, s.text)
	}
	if s.calls != nil {
		b = append(b, `,"tool_calls":[`...)
		made := max(s.base+s.generated-s.reasonLen, 0) // script tokens produced
		// s.text starts where this worker did: after the tokens a
		// continuation (Resume) dropped.
		dropped := 0
		for _, p := range s.script[:min(max(s.base-s.reasonLen, 0), len(s.script))] {
			dropped += len(p)
		}
		for i, c := range s.calls {
			if c.first >= made {
				break // cut off (max_tokens) before it began
			}
			end := len(s.text)
			if i+1 < len(s.calls) {
				end = min(end, max(s.calls[i+1].start-dropped, 0))
			}
			start := min(max(c.start-dropped, 0), end)
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = appendString(b, c.id)
			b = append(b, `,"type":"function","function":{"name":`...)
			b = appendString(b, c.name)
			b = append(b, `,"arguments":`...)
			b = appendString(b, s.text[start:end])
			b = append(b, "}}"...)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// Chunk appenders. Every chunk ends with '\n'.

func (r *request) chunkHead(dst []byte, index int) []byte {
	dst = append(dst, r.prefix...)
	dst = append(dst, `{"index":`...)
	return strconv.AppendInt(dst, int64(index), 10)
}

func (r *request) appendRole(dst []byte, index int) []byte {
	dst = r.chunkHead(dst, index)
	return append(dst, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n"...)
}

// appendDelta writes a chat delta of content (field "content") or of
// reasoning ("reasoning_content"), with s's pending logprobs.
func appendDelta[T string | []byte](dst []byte, r *request, s *seq, field string, text T) []byte {
	dst = r.chunkHead(dst, s.index)
	dst = append(dst, `,"delta":{"`...)
	dst = append(dst, field...)
	dst = append(dst, `":`...)
	dst = appendString(dst, text)
	if !r.logprobs {
		return append(dst, `},"logprobs":null,"finish_reason":null}]}`+"\n"...)
	}
	dst = append(dst, `},"logprobs":`...)
	dst = r.appendLogprobs(dst, s)
	return append(dst, `,"finish_reason":null}]}`+"\n"...)
}

// appendCallStart opens tool call i as vLLM streams one: its id, type and
// name, with empty arguments.
func (r *request) appendCallStart(dst []byte, s *seq, i int) []byte {
	dst = r.chunkHead(dst, s.index)
	dst = append(dst, `,"delta":{"tool_calls":[{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"id":`...)
	dst = appendString(dst, s.calls[i].id)
	dst = append(dst, `,"type":"function","function":{"name":`...)
	dst = appendString(dst, s.calls[i].name)
	return append(dst, `,"arguments":""}}]},"logprobs":null,"finish_reason":null}]}`+"\n"...)
}

// appendArgs writes a piece of tool call i's arguments.
func (r *request) appendArgs(dst []byte, s *seq, i int, piece string) []byte {
	dst = r.chunkHead(dst, s.index)
	dst = append(dst, `,"delta":{"tool_calls":[{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"function":{"arguments":`...)
	dst = appendString(dst, piece)
	dst = append(dst, `}}]},"logprobs":`...)
	dst = r.appendLogprobs(dst, s)
	return append(dst, `,"finish_reason":null}]}`+"\n"...)
}

func (r *request) appendFinish(dst []byte, s *seq, reason string) []byte {
	dst = r.chunkHead(dst, s.index)
	dst = append(dst, `,"delta":{},"logprobs":`...)
	dst = r.appendLogprobs(dst, s)
	dst = append(dst, `,"finish_reason":"`...)
	dst = append(dst, reason...)
	return append(dst, `"}]}`+"\n"...)
}

func appendText[T string | []byte](dst []byte, r *request, s *seq, text T, reason string) []byte {
	dst = r.chunkHead(dst, s.index)
	dst = append(dst, `,"text":`...)
	dst = appendString(dst, text)
	dst = append(dst, `,"logprobs":`...)
	dst = r.appendLogprobs(dst, s)
	if reason == "" {
		return append(dst, `,"finish_reason":null}]}`+"\n"...)
	}
	dst = append(dst, `,"finish_reason":"`...)
	dst = append(dst, reason...)
	return append(dst, `"}]}`+"\n"...)
}

func (r *request) appendUsageChunk(dst []byte) []byte {
	dst = append(dst, r.prefix...)
	dst = append(dst, `],"usage":`...)
	dst = schemas.AppendUsage(dst, &r.usage)
	return append(dst, "}\n"...)
}

// view is the request as schemas.ReadRequest read it (the worker's reading,
// or the sim's own when called directly, not by a worker or the sim-server)
// and the model it is for.
func (e *Engine) view(req *engine.Request) (*schemas.Request, string, error) {
	v := req.View
	if v == nil {
		dflt := req.Model
		if dflt == "" {
			dflt = e.cur.Load().model
		}
		var rerr *schemas.Error
		if v, rerr = schemas.ReadRequest(req.Kind, req.Body, dflt); rerr != nil {
			return nil, "", rerr
		}
	}
	model := req.Model
	if model == "" {
		model = v.Model
	}
	return v, model, nil
}
