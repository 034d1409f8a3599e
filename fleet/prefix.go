package fleet

// prefixLRU is a dispatcher's record of the prompt blocks one worker's
// prefix cache probably holds: a bounded set of chained block hashes, least
// recently routed evicted first, as the engine evicts its free cached blocks.
// It is fed by the owner's own routing decisions (Acquire with hashes), so it
// is a guess: an engine that evicts sooner, or traffic routed by another
// dispatcher, make it wrong, never unsafe (a wrong guess costs a prefill).
//
// Nodes live in slices linked by index, so recording a block allocates only
// while the record grows to its capacity.
type prefixLRU struct {
	idx        map[uint64]int32
	keys       []uint64
	prev, next []int32
	head, tail int32 // head: most recently routed; -1 when empty
	cap        int
}

func newPrefixLRU(capacity int) *prefixLRU {
	return &prefixLRU{idx: map[uint64]int32{}, head: -1, tail: -1, cap: max(capacity, 1)}
}

func (l *prefixLRU) has(h uint64) bool {
	_, ok := l.idx[h]
	return ok
}

// matched counts the leading hashes the record holds: a chained hash is only
// worth anything if all its parents are cached too.
func (l *prefixLRU) matched(hashes []uint64) int {
	if l == nil {
		return 0
	}
	n := 0
	for n < len(hashes) && l.has(hashes[n]) {
		n++
	}
	return n
}

// record marks a prompt's blocks as just routed. The tail is touched first,
// so the head is the most recent and the tail is evicted first, as engines
// free a finished sequence's blocks (vLLM and the sim).
func (l *prefixLRU) record(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		l.touch(hashes[i])
	}
}

func (l *prefixLRU) touch(h uint64) {
	if n, ok := l.idx[h]; ok {
		if n != l.head {
			l.unlink(n)
			l.pushFront(n)
		}
		return
	}
	var n int32
	if len(l.keys) < l.cap {
		n = int32(len(l.keys))
		l.keys = append(l.keys, h)
		l.prev = append(l.prev, -1)
		l.next = append(l.next, -1)
	} else {
		n = l.tail
		l.unlink(n)
		delete(l.idx, l.keys[n])
		l.keys[n] = h
	}
	l.idx[h] = n
	l.pushFront(n)
}

// drop forgets a block (the engine said it evicted it).
func (l *prefixLRU) drop(h uint64) {
	n, ok := l.idx[h]
	if !ok {
		return
	}
	l.unlink(n)
	delete(l.idx, h)
	// Move the last node into the hole so the slices stay dense.
	last := int32(len(l.keys) - 1)
	if n != last {
		lp, ln := l.prev[last], l.next[last]
		l.keys[n], l.prev[n], l.next[n] = l.keys[last], lp, ln
		l.idx[l.keys[n]] = n
		if lp >= 0 {
			l.next[lp] = n
		} else {
			l.head = n
		}
		if ln >= 0 {
			l.prev[ln] = n
		} else {
			l.tail = n
		}
	}
	l.keys, l.prev, l.next = l.keys[:last], l.prev[:last], l.next[:last]
}

// resize sets the capacity, evicting the least recent blocks past it.
func (l *prefixLRU) resize(capacity int) {
	l.cap = max(capacity, 1)
	for len(l.keys) > l.cap {
		l.drop(l.keys[l.tail])
	}
}

func (l *prefixLRU) len() int { return len(l.idx) }

func (l *prefixLRU) unlink(n int32) {
	p, x := l.prev[n], l.next[n]
	if p >= 0 {
		l.next[p] = x
	} else {
		l.head = x
	}
	if x >= 0 {
		l.prev[x] = p
	} else {
		l.tail = p
	}
	l.prev[n], l.next[n] = -1, -1
}

func (l *prefixLRU) pushFront(n int32) {
	l.prev[n], l.next[n] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = n
	} else {
		l.tail = n
	}
	l.head = n
}
