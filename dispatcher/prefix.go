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
	h, _ := promptKey(dst, model, body, block)
	return h
}

// promptKey is promptHashes, and the length of the prompt text in bytes.
func promptKey(dst []uint64, model string, body []byte, block int) ([]uint64, int) {
	span := schemas.PromptSpan(body)
	return schemas.PromptBlockHashes(dst, model, span, block), len(span)
}

// prediction is what a dispatcher predicts the worker it chose holds of a
// prompt routed by prefix: cached of total bytes of the prompt text (the
// leading blocks the worker holds by the record). It travels to the worker
// as schemas.HdrPrefixCached, which compares it with the cached tokens its
// engine reports (workers/prefixcache.go). total 0: no prediction (the
// request was routed by load alone).
type prediction struct{ cached, total int }

// predict is the prediction for cached of the prompt's leading blocks of
// block bytes, of a prompt text of total bytes.
func predict(cached, block, total int) prediction {
	if total <= 0 {
		return prediction{}
	}
	return prediction{cached: min(cached*block, total), total: total}
}

// setHeader writes the prediction on a request to its worker, or removes
// any there: only a dispatcher may set it, and a client's would skew the
// worker's comparison.
func (p prediction) setHeader(h map[string][]string) {
	if p.total == 0 {
		delete(h, schemas.HdrPrefixCached)
		return
	}
	h[schemas.HdrPrefixCached] = []string{schemas.FormatPrefixCached(p.cached, p.total)}
}
