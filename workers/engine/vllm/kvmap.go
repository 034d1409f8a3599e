package vllm

import (
	"sync"

	"github.com/tokenbus/tokenbus/schemas"
)

// vLLM names a cached block by a hash of its tokens (and its parent's
// hash); tokenbus's dispatchers name prompt blocks by hashes of the prompt's
// text (schemas.PromptBlockHashes): they have no tokenizer. kvMap joins the
// two through keys of its own over token ids:
//
//   - a prompt the worker served (register): its text hashes, and its token
//     ids from vLLM's /tokenize. Keys are chained over the ids per engine
//     block, k_j = H(k_{j-1}, tokens of block j), from a root naming the
//     LoRA adapter ("" for the base model), and each k_j is registered to the
//     prompt's text blocks that its first j+1 engine blocks cover, in
//     proportion to bytes per token, as the sim does (sim/kvevents.go);
//   - BlockStored (apply): the same keys chained from the parent's key (the
//     root when it has none) over the event's token ids; each vLLM hash is
//     remembered with its key. A key registered to a prompt reports the text
//     blocks it covers as stored. Blocks stored before their prompt's
//     /tokenize answer came are found when it comes (the key is remembered
//     as stored);
//   - BlockRemoved: vLLM hash → key → the text block where that engine
//     block starts, reported as removed: it cuts every prompt through it
//     there, as the sim's evictions do.
//
// Our keys, not vLLM's hashes, because vLLM's depend on its hash function
// (sha256 of pickled tuples, a per-process seed, extra keys for multimodal
// inputs, cache salts) which a worker cannot reproduce; its events carry the
// token ids and the parent, which is all our keys need.
//
// Every map is bounded (gen2); the events gathered for DrainKVEvents too
// (maxKVEvents, past it counted as dropped). Events lost on the way (a
// sequence gap, a reconnect, AllBlocksCleared) clear what is known of vLLM's
// blocks and count as dropped, so dispatchers clear their record of the
// worker.

const (
	maxKVEvents  = 1 << 14 // hashes per DrainKVEvents, as the sim's
	kvBlockCap   = 1 << 17 // vLLM blocks remembered (about 128 Ki: more than an 8B model's cache on one H200)
	kvPromptCap  = 1 << 17 // prompt block keys registered
	kvDoneCap    = 1 << 14 // prompts recently registered, not asked for again
	defaultBlock = 16      // vLLM's block size on GPUs, until an event says otherwise
)

// kvPrompt is a registered prompt: its text block hashes, the bytes of its
// text and its tokens.
type kvPrompt struct {
	text    []uint64
	spanLen int
	nTok    int
}

// kvRef is engine block j of a prompt.
type kvRef struct {
	p *kvPrompt
	j int32
}

// kvMapStats counts what the mapping saw (cumulative).
type kvMapStats struct {
	Mapped, Unmapped uint64 // BlockStored blocks found, or not, in a prompt registered
	Skipped          uint64 // events of another medium (CPU offload) or KV cache group, ignored
	Lost             uint64 // times events were lost (gap, reconnect, AllBlocksCleared)
}

type kvMap struct {
	blockBytes int // text bytes per hashed block (as the dispatchers')

	mu     sync.Mutex
	bs     int                    // engine block size in tokens
	vh     gen2[string, uint64]   // vLLM block hash → our key
	stored gen2[uint64, struct{}] // our keys vLLM holds now
	keys   gen2[uint64, kvRef]    // our key → a prompt's block
	done   gen2[uint64, struct{}] // the last text hash of prompts registered

	outStored  [][]uint64
	outRemoved []uint64
	n, dropped int
	stats      kvMapStats
}

func newKVMap(blockBytes int) *kvMap {
	return &kvMap{
		blockBytes: blockBytes, bs: defaultBlock,
		vh: newGen2[string, uint64](kvBlockCap), stored: newGen2[uint64, struct{}](kvBlockCap),
		keys: newGen2[uint64, kvRef](kvPromptCap), done: newGen2[uint64, struct{}](kvDoneCap),
	}
}

// kvRoot is the key of the empty prefix for an adapter ("": the base model):
// an adapter's blocks are apart from its base model's, as in vLLM.
func kvRoot(lora string) uint64 { return schemas.StringHash(lora) ^ 0x6b76 }

// known reports whether a prompt whose last text hash is last was
// registered recently (no need to ask vLLM to tokenize it again).
func (m *kvMap) known(last uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.done.get(last)
	return ok
}

// register maps a prompt's engine blocks to its text blocks: text is
// schemas.PromptBlockHashes of its span (spanLen bytes), ids its tokens as
// vLLM counts them, lora the adapter it ran on ("": none). Blocks vLLM
// already stored report their text as stored.
func (m *kvMap) register(text []uint64, spanLen int, ids []uint32, lora string) {
	if len(text) == 0 || len(ids) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := &kvPrompt{text: text, spanLen: spanLen, nTok: len(ids)}
	k, held := kvRoot(lora), 0
	for j := 0; (j+1)*m.bs <= len(ids); j++ {
		k = schemas.TokenBlockHash(k, ids[j*m.bs:(j+1)*m.bs])
		m.keys.put(k, kvRef{p: p, j: int32(j)})
		if _, ok := m.stored.get(k); ok && held == j {
			held = j + 1 // leading blocks only: a block is useless without its parents
		}
	}
	m.done.put(text[len(text)-1], struct{}{})
	if c := m.covered(p, held); len(c) > 0 {
		m.emitStored(c)
	}
}

// covered is the leading text blocks that a prompt's first k engine blocks
// cover.
func (m *kvMap) covered(p *kvPrompt, k int) []uint64 {
	t := min(schemas.TextBlockAt(k*m.bs, p.nTok, p.spanLen, m.blockBytes), len(p.text))
	return p.text[:t]
}

// tag is the text block where a prompt's engine block j starts (0: past its
// last full text block).
func (m *kvMap) tag(r kvRef) uint64 {
	if t := schemas.TextBlockAt(int(r.j)*m.bs, r.p.nTok, r.p.spanLen, m.blockBytes); t < len(r.p.text) {
		return r.p.text[t]
	}
	return 0
}

// apply takes one batch of vLLM's events.
func (m *kvMap) apply(b *kvBatch) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range b.events {
		ev := &b.events[i]
		// Blocks of the GPU's prefix cache only: not those offloaded
		// (medium), of another KV cache group (a hybrid model's sliding
		// window layers), or another engine's (locality).
		if ev.medium != "" && ev.medium != "GPU" || ev.group != 0 || ev.locality != "" && ev.locality != "LOCAL" {
			m.stats.Skipped++
			continue
		}
		switch ev.kind {
		case kvStored:
			m.applyStored(ev)
		case kvRemoved:
			for _, h := range ev.hashes {
				k, ok := m.vh.get(h)
				if !ok {
					continue
				}
				m.vh.del(h)
				m.stored.del(k)
				if r, ok := m.keys.get(k); ok {
					if t := m.tag(r); t != 0 {
						m.emitRemoved(t)
					}
				}
			}
		case kvCleared:
			m.lostLocked()
		}
	}
}

func (m *kvMap) applyStored(ev *kvEvent) {
	// The tokens per hash: block_size, unless the token ids say otherwise
	// (a vLLM hashing at a finer grain than its blocks); events that fit
	// no whole number of tokens per hash cannot be chained.
	if len(ev.hashes) == 0 || len(ev.tokens)%len(ev.hashes) != 0 || len(ev.tokens) == 0 {
		m.stats.Skipped++
		m.stats.Unmapped += uint64(len(ev.hashes))
		return
	}
	bs := len(ev.tokens) / len(ev.hashes)
	if bs != m.bs {
		// Keys made with another block size never match: start again.
		m.bs = bs
		m.keys.clear()
		m.done.clear()
		m.vh.clear()
		m.stored.clear()
	}
	var k uint64
	switch {
	case ev.parent == "":
		lora := ev.loraName
		if lora == "" && ev.loraID != 0 {
			// A vLLM that sends lora_id without lora_name: the adapter's
			// name is unknown, so its blocks match no prompt (unmapped).
			lora = "\x00lora-id"
		}
		k = kvRoot(lora)
	default:
		var ok bool
		if k, ok = m.vh.get(ev.parent); !ok {
			// A parent stored before we listened, or forgotten: the chain
			// cannot be followed.
			m.stats.Unmapped += uint64(len(ev.hashes))
			return
		}
	}
	var best kvRef
	for i, h := range ev.hashes {
		k = schemas.TokenBlockHash(k, ev.tokens[i*m.bs:(i+1)*m.bs])
		m.vh.put(h, k)
		m.stored.put(k, struct{}{})
		if r, ok := m.keys.get(k); ok {
			best = r
			m.stats.Mapped++
		} else {
			m.stats.Unmapped++
		}
	}
	if best.p != nil {
		if c := m.covered(best.p, int(best.j)+1); len(c) > 0 {
			m.emitStored(c)
		}
	}
}

// lost records that events were lost: what is known of vLLM's blocks is
// cleared and the next drain says Dropped.
func (m *kvMap) lost() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lostLocked()
}

func (m *kvMap) lostLocked() {
	m.vh.clear()
	m.stored.clear()
	// Stores gathered before the loss may be gone since (an engine
	// restarted): a message with Dropped tells only what came after.
	m.outStored, m.outRemoved, m.n = nil, nil, 0
	m.dropped++
	m.stats.Lost++
}

func (m *kvMap) emitStored(c []uint64) {
	if m.n+len(c) > maxKVEvents {
		m.dropped++
		return
	}
	if i := len(m.outStored) - 1; i >= 0 && len(m.outStored[i]) > 0 && &m.outStored[i][0] == &c[0] {
		// The same prompt again (vLLM stores a prompt's blocks over several
		// steps): keep the longer chain only.
		if d := len(c) - len(m.outStored[i]); d > 0 {
			m.outStored[i] = c
			m.n += d
		}
		return
	}
	m.outStored = append(m.outStored, c) // a prompt's text hashes: never written again
	m.n += len(c)
}

func (m *kvMap) emitRemoved(h uint64) {
	if m.n >= maxKVEvents {
		m.dropped++
		return
	}
	m.outRemoved = append(m.outRemoved, h)
	m.n++
}

// drain returns the text events gathered since the last call; ok is false
// when there are none.
func (m *kvMap) drain() (ev schemas.KVEvents, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 && m.dropped == 0 {
		return ev, false
	}
	ev = schemas.KVEvents{BlockBytes: m.blockBytes, Stored: m.outStored, Removed: m.outRemoved, Dropped: m.dropped}
	m.outStored, m.outRemoved, m.n, m.dropped = nil, nil, 0, 0
	return ev, true
}

func (m *kvMap) statsNow() kvMapStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

// gen2 is a map bounded by two generations: when the current one is full it
// becomes the old one and the old one is dropped, so at most 2×max entries
// are held and entries used again (get) move to the current one. Cheaper
// than an LRU list and as good for a cache of keys.
type gen2[K comparable, V any] struct {
	cur, old map[K]V
	max      int
}

func newGen2[K comparable, V any](max int) gen2[K, V] {
	return gen2[K, V]{cur: map[K]V{}, old: map[K]V{}, max: max}
}

func (g *gen2[K, V]) get(k K) (V, bool) {
	if v, ok := g.cur[k]; ok {
		return v, true
	}
	v, ok := g.old[k]
	if ok {
		delete(g.old, k)
		g.put(k, v)
	}
	return v, ok
}

func (g *gen2[K, V]) put(k K, v V) {
	if _, ok := g.cur[k]; !ok && len(g.cur) >= g.max {
		g.old, g.cur = g.cur, make(map[K]V, g.max/4)
	}
	delete(g.old, k)
	g.cur[k] = v
}

func (g *gen2[K, V]) del(k K) {
	delete(g.cur, k)
	delete(g.old, k)
}

func (g *gen2[K, V]) clear() {
	clear(g.cur)
	clear(g.old)
}

func (g *gen2[K, V]) len() int { return len(g.cur) + len(g.old) }
