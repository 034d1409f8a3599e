package sim

// kvCache is a paged KV cache with prefix caching, after vLLM's V1
// KVCacheManager: fixed-size blocks, reference counts, and a hash table from
// the hash of a full block of prompt tokens (chained with its parent's hash)
// to the block holding it. A block whose last user is gone keeps its hash and
// waits in an LRU list, so a later prompt with the same prefix can take it
// back; allocation takes never-hashed blocks first, then evicts the least
// recently freed. Only the scheduler goroutine touches it.
type kvCache struct {
	ref        []int32
	hash       []uint64 // 0: not cached
	prev, next []int32  // LRU links of free cached blocks
	head, tail int32    // LRU ends; -1 when empty
	nLRU       int
	plain      []int32 // free blocks with no hash
	table      map[uint64]int32
	used       int // blocks with ref > 0
	// tag is the text block hash each cached block starts in (0: none;
	// kvevents.go); evicted, when set, collects the tags of blocks evicted.
	tag     []uint64
	evicted *[]uint64
	// evictedHash, when set, collects the hashes of blocks evicted
	// (blockevents.go).
	evictedHash *[]uint64
}

func newKVCache(numBlocks int) *kvCache {
	kv := &kvCache{
		ref:   make([]int32, numBlocks),
		hash:  make([]uint64, numBlocks),
		tag:   make([]uint64, numBlocks),
		prev:  make([]int32, numBlocks),
		next:  make([]int32, numBlocks),
		head:  -1,
		tail:  -1,
		plain: make([]int32, numBlocks),
		table: make(map[uint64]int32),
	}
	// pop from the end: block 0 first
	for i := range kv.plain {
		kv.plain[i] = int32(numBlocks - 1 - i)
	}
	return kv
}

// free is the number of blocks that can be allocated, cached ones included.
func (kv *kvCache) free() int { return len(kv.plain) + kv.nLRU }

func (kv *kvCache) total() int { return len(kv.ref) }

func (kv *kvCache) lruRemove(b int32) {
	p, n := kv.prev[b], kv.next[b]
	if p >= 0 {
		kv.next[p] = n
	} else {
		kv.head = n
	}
	if n >= 0 {
		kv.prev[n] = p
	} else {
		kv.tail = p
	}
	kv.nLRU--
}

func (kv *kvCache) lruPush(b int32) {
	kv.prev[b], kv.next[b] = kv.tail, -1
	if kv.tail >= 0 {
		kv.next[kv.tail] = b
	} else {
		kv.head = b
	}
	kv.tail = b
	kv.nLRU++
}

// alloc takes a free block; the caller has checked free() > 0.
func (kv *kvCache) alloc() int32 {
	var b int32
	if n := len(kv.plain); n > 0 {
		b = kv.plain[n-1]
		kv.plain = kv.plain[:n-1]
	} else {
		b = kv.head
		kv.lruRemove(b)
		if kv.evictedHash != nil {
			*kv.evictedHash = append(*kv.evictedHash, kv.hash[b])
		}
		delete(kv.table, kv.hash[b])
		kv.hash[b] = 0
		if t := kv.tag[b]; t != 0 {
			if kv.evicted != nil {
				*kv.evicted = append(*kv.evicted, t)
			}
			kv.tag[b] = 0
		}
	}
	kv.ref[b] = 1
	kv.used++
	return b
}

// lookup returns the block caching hash h, or -1.
func (kv *kvCache) lookup(h uint64) int32 {
	if b, ok := kv.table[h]; ok {
		return b
	}
	return -1
}

// acquire takes one more reference on a cached block found by lookup.
func (kv *kvCache) acquire(b int32) {
	if kv.ref[b] == 0 {
		kv.lruRemove(b)
		kv.used++
	}
	kv.ref[b]++
}

// register records that block b holds the full block with hash h, unless
// another block already does.
func (kv *kvCache) register(b int32, h uint64) {
	if _, ok := kv.table[h]; ok || kv.hash[b] != 0 {
		return
	}
	kv.hash[b] = h
	kv.table[h] = b
}

// release drops a reference; a block nobody uses goes to the LRU if it holds
// a cached prefix, else back to the plain free list.
func (kv *kvCache) release(b int32) {
	kv.ref[b]--
	if kv.ref[b] > 0 {
		return
	}
	kv.used--
	if kv.hash[b] != 0 {
		kv.lruPush(b)
	} else {
		kv.plain = append(kv.plain, b)
	}
}

// releaseAll frees a sequence's block table, last block first so that a
// prompt's tail is evicted before its head (as vLLM does).
func (kv *kvCache) releaseAll(blocks []int32) []int32 {
	for i := len(blocks) - 1; i >= 0; i-- {
		kv.release(blocks[i])
	}
	return blocks[:0]
}
