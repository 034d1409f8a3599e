package sim

import (
	"sync"

	"github.com/tokenbus/tokenbus/schemas"
)

// The sim reports what its prefix cache stores and evicts, as vLLM does with
// --kv-events-config, but with blocks named the way tokenbus's dispatchers
// name them: by schemas.PromptBlockHashes of the prompt's text (bytes, not
// tokens: a dispatcher has no tokenizer). Each prompt gets those text hashes
// beside its token block hashes, and each of its engine blocks is tagged
// with the text block where it starts (by the prompt's bytes per token). A
// sequence admitted reports the text blocks its resident engine blocks
// cover; a cached block evicted reports its tag, which cuts every prompt
// through it at that point. The mapping is proportional, so it is exact about
// what was evicted only to within a block; it is never a guess about what was
// routed where.
//
// The scheduler gathers the events without a lock (pending) and hands them
// over once per step that has any; DrainKVEvents takes them. The buffer is
// bounded: past maxKVEvents hashes new events are counted as dropped.

const maxKVEvents = 1 << 14 // about 350 KB of JSON: well under NATS's 1 MB payload

type kvEvents struct {
	// The scheduler's, unlocked.
	pending  [][]uint64
	removing []uint64

	mu      sync.Mutex
	stored  [][]uint64
	removed []uint64
	n       int // hashes in stored and removed
	dropped int
}

// flush hands the step's events over; scheduler goroutine only.
func (q *kvEvents) flush() {
	if len(q.pending) == 0 && len(q.removing) == 0 {
		return
	}
	q.mu.Lock()
	for _, c := range q.pending {
		if q.n+len(c) > maxKVEvents {
			q.dropped++
			continue
		}
		q.stored = append(q.stored, c) // c is a prompt's text hashes: never written again
		q.n += len(c)
	}
	for _, h := range q.removing {
		if q.n >= maxKVEvents {
			q.dropped++
			continue
		}
		q.removed = append(q.removed, h)
		q.n++
	}
	q.mu.Unlock()
	clear(q.pending)
	q.pending, q.removing = q.pending[:0], q.removing[:0]
}

// lose drops the events not yet taken and counts a loss: readers forget
// what they knew of the cache (it was emptied).
func (q *kvEvents) lose() {
	q.mu.Lock()
	q.stored, q.removed, q.n = nil, nil, 0
	q.dropped++
	q.mu.Unlock()
}

// KVEventsOn reports whether the sim reports KV events (engine.KVEventer):
// unless Config.KVEventBytes < 0.
func (e *Engine) KVEventsOn() bool { return e.cfg.KVEventBytes >= 0 }

// DrainKVEvents returns the prefix-cache events since the last call (the
// worker publishes them: engine.KVEventer); ok is false when there are none
// or the sim reports none (Config.KVEventBytes < 0).
func (e *Engine) DrainKVEvents() (ev schemas.KVEvents, ok bool) {
	q := &e.kvEv
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 && q.dropped == 0 {
		return ev, false
	}
	ev = schemas.KVEvents{BlockBytes: e.cfg.KVEventBytes, Stored: q.stored, Removed: q.removed, Dropped: q.dropped}
	q.stored, q.removed, q.n, q.dropped = nil, nil, 0, 0
	return ev, true
}

// textTags computes a prompt's text block hashes and, for each of its full
// engine blocks, the text hash of the block where it starts (0: past the
// last full text block).
func (e *Engine) textTags(pr *prompt, model string, body []byte) {
	if e.cfg.KVEventBytes <= 0 || len(pr.hashes) == 0 {
		return
	}
	span := schemas.PromptSpan(body)
	pr.spanLen = len(span)
	pr.text = schemas.PromptBlockHashes(nil, model, span, e.cfg.KVEventBytes)
	if len(pr.text) == 0 {
		return
	}
	pr.tags = make([]uint64, len(pr.hashes))
	for j := range pr.tags {
		if t := schemas.TextBlockAt(j*e.cfg.BlockSize, len(pr.ids), len(span), e.cfg.KVEventBytes); t < len(pr.text) {
			pr.tags[j] = pr.text[t]
		}
	}
}

// coveredText is the leading text blocks that a prompt's first k engine
// blocks cover.
func (e *Engine) coveredText(pr *prompt, k int) []uint64 {
	if len(pr.text) == 0 {
		return nil
	}
	t := min(schemas.TextBlockAt(k*e.cfg.BlockSize, len(pr.ids), pr.spanLen, e.cfg.KVEventBytes), len(pr.text))
	return pr.text[:t]
}
