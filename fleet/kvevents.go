package fleet

import (
	"encoding/json"

	"github.com/tokenbus/tokenbus/schemas"
)

// KVEvents applies a worker's KV events message (schemas.KVEvents) to the
// record of its prefix cache: stored chains are recorded as just used,
// removed blocks are forgotten. Events name blocks as the worker's engine
// actually holds them, for every dispatcher's traffic, so they correct this
// fleet's own guesses (recorded by AcquirePrefix as it routes) both ways: a
// block another dispatcher sent there becomes known, a block evicted is
// dropped even if we sent it. A worker that lost events (Dropped, or a gap
// in Seq) has its record cleared, since evictions may be missing: routing
// falls back to our guesses from then on until new events arrive.
//
// blockBytes is the block size this fleet's owner hashes prompts with;
// a message of another block size, for an unknown worker, or not a KV
// events message is ignored: ok is false.
func (f *Fleet) KVEvents(data []byte, blockBytes int) (ok bool) {
	var ev schemas.KVEvents
	if json.Unmarshal(data, &ev) != nil || ev.BlockBytes&^7 != blockBytes&^7 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.workers[ev.Worker]
	if w == nil {
		return false
	}
	if w.prefix == nil {
		w.prefix = newPrefixLRU(f.prefixCap(w))
	}
	lost := ev.Dropped > 0 || w.kvSeq != 0 && ev.Seq != w.kvSeq+1
	w.kvSeq = ev.Seq
	if lost {
		w.prefix = newPrefixLRU(f.prefixCap(w))
	}
	for _, h := range ev.Removed {
		w.prefix.drop(h)
	}
	for _, c := range ev.Stored {
		w.prefix.record(c)
	}
	return true
}
