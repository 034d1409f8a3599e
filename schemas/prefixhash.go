package schemas

import "encoding/binary"

// MaxPromptBlocks bounds the blocks PromptBlockHashes hashes (64 KiB of
// prompt at 64-byte blocks): past it, the rest of a prompt does not steer
// routing.
const MaxPromptBlocks = 1024

// PromptBlockHashes appends to dst the chained hashes of the full blocks of
// block bytes (rounded down to a multiple of 8) of a prompt's text (its
// PromptSpan), with model as the chain's root: hash i stands for the text
// up to the end of block i, as vLLM's prefix caching keys a KV block by
// hash(parent, its tokens). Dispatchers key prefix-aware routing on these
// and engines that publish KV events (KVEvents) name their cached blocks by
// them, so both must use the same block size. Nothing is appended for a text
// shorter than a block or a block under 8 bytes. Not cryptographic: a
// collision costs a wrong routing guess.
func PromptBlockHashes(dst []uint64, model string, span []byte, block int) []uint64 {
	block &^= 7
	if block <= 0 || len(span) < block {
		return dst
	}
	n := min(len(span)/block, MaxPromptBlocks)
	if dst == nil {
		dst = make([]uint64, 0, n)
	}
	h := StringHash(model) // the root
	for i := range n {
		h = hashBlock(h, span[i*block:(i+1)*block])
		dst = append(dst, h)
	}
	return dst
}

// hashBlock chains the hash of one block (a multiple of 8 bytes) onto its
// parent's: a multiply-rotate over 8-byte words, then splitmix64's
// finaliser; never 0.
func hashBlock(parent uint64, b []byte) uint64 {
	h := parent ^ 0x9e3779b97f4a7c15
	for i := 0; i+8 <= len(b); i += 8 {
		h ^= binary.LittleEndian.Uint64(b[i:])
		h *= 0xff51afd7ed558ccd
		h = h<<31 | h>>33
	}
	if h = Mix64(h); h == 0 {
		h = 1
	}
	return h
}

// TextBlockAt is the index of the text block (of block bytes, rounded down
// to a multiple of 8 as PromptBlockHashes does) where token tok of a prompt
// of nTok tokens and spanLen bytes of text falls, in proportion to the
// prompt's bytes per token: how an engine that counts tokens names its
// blocks by the text hashes dispatchers route by (the sim's KV events, a
// vLLM worker's mapping of vLLM's). nTok > 0 and block >= 8.
func TextBlockAt(tok, nTok, spanLen, block int) int {
	return tok * spanLen / nTok / (block &^ 7)
}

// StringHash is FNV-1a of s, then Mix64.
func StringHash(s string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 0x100000001b3
	}
	return Mix64(h)
}

// TokenBlockHash chains the hash of one block of token ids onto its
// parent's (FNV-1a over the ids, then Mix64), as engines key their prefix
// caches: the sim names its KV blocks so, and a vLLM worker names the token
// blocks of vLLM's KV events so. Never 0 (0 is "no block").
func TokenBlockHash(parent uint64, ids []uint32) uint64 {
	h := parent ^ 0xcbf29ce484222325
	for _, id := range ids {
		h ^= uint64(id)
		h *= 0x100000001b3
	}
	if h = Mix64(h); h == 0 {
		h = 1
	}
	return h
}

// Mix64 is splitmix64's finaliser.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
