package sim

import "sync"

// Besides its text-named events (kvevents.go), the sim can report its
// prefix cache as vLLM's KV cache events do (--kv-events-config): blocks
// named by their token-block hashes, each stored block with its parent's
// hash and its token ids, each evicted block by its hash. The sim-server
// publishes them in vLLM's wire format (simserver/kvevents.go), so that a
// worker's reader of vLLM's events is tested against a cache that really
// stores and evicts. Config.BlockEvents turns them on.
//
// As for the text events, the scheduler gathers them without a lock and
// hands them over at the end of each step; past maxBlockEvents blocks new
// ones are counted as dropped (the publisher then skips a sequence number,
// which is how a subscriber learns of a loss).

const maxBlockEvents = 1 << 15 // blocks waiting for DrainBlockEvents

// BlockEvent is one of vLLM's KV cache events: BlockStored (Removed false):
// Hashes stored in a chain after Parent (0: a root block), Tokens their
// token ids (BlockSize each), Lora the adapter's name ("": the base model);
// BlockRemoved: Hashes evicted; AllBlocksCleared (Cleared): the cache was
// emptied (a sleep).
type BlockEvent struct {
	Removed bool
	Cleared bool
	Hashes  []uint64
	Parent  uint64
	Tokens  []uint32
	Lora    string
}

type blockEvents struct {
	// The scheduler's, unlocked.
	pending  []BlockEvent
	removing []uint64

	mu      sync.Mutex
	out     []BlockEvent
	n       int // blocks in out
	dropped int
}

// stored records blocks [from, to) of prompt pr as newly cached; scheduler
// goroutine only.
func (q *blockEvents) stored(pr *prompt, from, to, bs int) {
	if from >= to {
		return
	}
	var parent uint64
	if from > 0 {
		parent = pr.hashes[from-1]
	}
	q.pending = append(q.pending, BlockEvent{
		Hashes: pr.hashes[from:to:to], Parent: parent, Tokens: pr.ids[from*bs : to*bs : to*bs], Lora: pr.lora})
}

// flush hands the step's events over; scheduler goroutine only.
func (q *blockEvents) flush() {
	if len(q.pending) == 0 && len(q.removing) == 0 {
		return
	}
	q.mu.Lock()
	// Evictions first: a step evicts before it stores into the blocks.
	if len(q.removing) > 0 {
		if q.n+len(q.removing) > maxBlockEvents {
			q.dropped++
		} else {
			q.out = append(q.out, BlockEvent{Removed: true, Hashes: append([]uint64(nil), q.removing...)})
			q.n += len(q.removing)
		}
	}
	for _, ev := range q.pending {
		if q.n+len(ev.Hashes) > maxBlockEvents {
			q.dropped++
			continue
		}
		q.out = append(q.out, ev) // slices of a prompt's ids and hashes: never written again
		q.n += len(ev.Hashes)
	}
	q.mu.Unlock()
	clear(q.pending)
	q.pending, q.removing = q.pending[:0], q.removing[:0]
}

// clearAll records that the cache was emptied; after flush, scheduler
// goroutine only.
func (q *blockEvents) clearAll() {
	q.mu.Lock()
	q.out = append(q.out, BlockEvent{Cleared: true})
	q.mu.Unlock()
}

// DrainBlockEvents returns the vLLM-style KV cache events since the last
// call, oldest first, and how many were dropped (the buffer was full).
// Nothing unless Config.BlockEvents.
func (e *Engine) DrainBlockEvents() (evs []BlockEvent, dropped int) {
	q := &e.blockEv
	q.mu.Lock()
	defer q.mu.Unlock()
	evs, dropped = q.out, q.dropped
	q.out, q.n, q.dropped = nil, 0, 0
	return evs, dropped
}
