package dispatcher

import (
	"encoding/binary"

	"github.com/tokenbus/tokenbus/schemas"
)

// Prefix-aware routing keys a prompt by chained hashes of fixed-size blocks
// of its text, as vLLM's prefix caching keys KV blocks by
// hash(parent, the block's tokens), but over bytes, not tokens: the
// dispatcher has no tokenizer (vLLM workers run any Hugging Face tokenizer,
// the sim cl100k_base, and tokenizing a 1000-token prompt would cost more
// than the rest of a routing decision many times over), and routing needs
// only a key that is equal exactly when two prompts share a prefix. The text
// is the raw JSON of "messages" (chat) or "prompt" (completions), so a
// shared system prompt or a conversation's history (resent byte for byte by
// its client each turn) is a shared run of leading blocks. A block of
// PrefixBlockBytes bytes (default 64) stands for about 16 tokens of English
// (cl100k_base and Llama 3 average about 4 bytes a token), the sim's and
// vLLM's block size, so a block hit means about one engine block cached.
// The chain's root is the model name: an adapter's prefix cache is apart from
// its base model's, as in the engines (vLLM's LoRA id, the sim's
// "lora:<name>" root).

// maxPromptBlocks bounds the hashing work and record churn of one request
// (64 KiB of prompt at the default block size); past it, the rest of a prompt
// does not steer routing.
const maxPromptBlocks = 1024

// promptHashes appends to dst the chained hashes of the full blocks of the
// prompt text in body, with model as the root; none for a prompt shorter than
// a block, or with block < 8.
func promptHashes(dst []uint64, model string, body []byte, block int) []uint64 {
	span := schemas.PromptSpan(body)
	block &^= 7 // whole 8-byte words
	if block <= 0 || len(span) < block {
		return dst
	}
	n := min(len(span)/block, maxPromptBlocks)
	if dst == nil {
		dst = make([]uint64, 0, n)
	}
	h := hashRoot(model)
	for i := range n {
		h = hashBlock(h, span[i*block:(i+1)*block])
		dst = append(dst, h)
	}
	return dst
}

func hashRoot(model string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(model); i++ {
		h ^= uint64(model[i])
		h *= 0x100000001b3
	}
	return mix64(h)
}

// hashBlock chains the hash of one block (a multiple of 8 bytes) onto its
// parent's: a multiply-rotate over 8-byte words, then splitmix64's
// finaliser. Not cryptographic: a collision costs a wrong routing guess.
func hashBlock(parent uint64, b []byte) uint64 {
	h := parent ^ 0x9e3779b97f4a7c15
	for i := 0; i+8 <= len(b); i += 8 {
		h ^= binary.LittleEndian.Uint64(b[i:])
		h *= 0xff51afd7ed558ccd
		h = h<<31 | h>>33
	}
	return mix64(h)
}

// mix64 is splitmix64's finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
