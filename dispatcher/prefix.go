package dispatcher

import "github.com/tokenbus/tokenbus/schemas"

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

// promptHashes appends to dst the chained hashes of the full blocks of the
// prompt text in body, with model as the root (schemas.PromptBlockHashes).
func promptHashes(dst []uint64, model string, body []byte, block int) []uint64 {
	return schemas.PromptBlockHashes(dst, model, schemas.PromptSpan(body), block)
}
