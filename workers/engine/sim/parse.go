package sim

import (
	"fmt"
	"sync"

	"github.com/tiktoken-go/tokenizer"
	"github.com/tokenbus/tokenbus/schemas"
)

// Requests are read by schemas.ReadRequest (the worker, or the sim-server,
// hands the view over); what the sim adds is tokenizing the prompt and the
// limits of its simulated model (context length, vocabulary, largest n).

// The tokenizer: cl100k_base, compiled in. A Codec is safe for concurrent use.
var codec = sync.OnceValue(func() tokenizer.Codec {
	c, err := tokenizer.Get(tokenizer.Cl100kBase)
	if err != nil {
		panic(err)
	}
	return c
})

// cl100k_base ids used by the ChatML template the sim applies to messages:
// <|im_start|>role\ncontent<|im_end|>\n per message, then
// <|im_start|>assistant\n as the generation prompt.
const (
	tokImStart = 100264
	tokImEnd   = 100265
	tokNewline = 198
	vocabSize  = 100277 // cl100k_base, special tokens included
)

// roleTokens caches the tokens of the usual roles.
var roleTokens = sync.OnceValue(func() map[string][]uint32 {
	m := map[string][]uint32{}
	for _, r := range []string{"system", "developer", "user", "assistant", "tool", "function"} {
		m[r] = encode(nil, r)
	}
	return m
})

// encode tokenizes text with cl100k_base and appends the ids.
func encode(dst []uint32, text string) []uint32 {
	if text == "" {
		return dst
	}
	ids, _, err := codec().Encode(text)
	if err != nil { // only in strict UTF-8 mode, which the sim does not use
		return dst
	}
	for _, id := range ids {
		dst = append(dst, uint32(id))
	}
	return dst
}

// chatPrompt applies the chat template to the messages and tokenizes them.
func chatPrompt(msgs []schemas.Message) []uint32 { return chatTemplate(msgs, false) }

// chatTemplate is chatPrompt; with cont (continue_final_message) the last
// message is left open, with no generation prompt after it, as vLLM does.
func chatTemplate(msgs []schemas.Message, cont bool) []uint32 {
	ids := make([]uint32, 0, 64)
	for i, m := range msgs {
		ids = append(ids, tokImStart)
		if rt, ok := roleTokens()[m.Role]; ok {
			ids = append(ids, rt...)
		} else {
			ids = encode(ids, m.Role)
		}
		ids = append(ids, tokNewline)
		ids = encode(ids, m.Text())
		if cont && i == len(msgs)-1 {
			return ids
		}
		ids = append(ids, tokImEnd, tokNewline)
	}
	ids = append(ids, tokImStart)
	ids = append(ids, roleTokens()["assistant"]...)
	return append(ids, tokNewline)
}

// completionPrompts tokenizes a completions prompt (strings), or checks its
// token ids against the vocabulary.
func completionPrompts(p schemas.Prompt) ([][]uint32, *schemas.Error) {
	if p.IsText() {
		texts := p.Texts()
		out := make([][]uint32, len(texts))
		for i, s := range texts {
			if out[i] = encode(nil, s); len(out[i]) == 0 {
				return nil, schemas.ErrInvalidValue.At("prompt", "prompt", "the decoder prompt cannot be empty")
			}
		}
		return out, nil
	}
	lists := p.TokenIDs()
	out := make([][]uint32, len(lists))
	for i, ts := range lists {
		if len(ts) == 0 {
			return nil, schemas.ErrInvalidValue.At("prompt", "prompt", "the decoder prompt cannot be empty")
		}
		ids := make([]uint32, len(ts))
		for j, t := range ts {
			if t < 0 || t >= vocabSize {
				return nil, schemas.ErrInvalidValue.At("prompt", "prompt", fmt.Sprintf("token id %d is out of vocabulary", t))
			}
			ids[j] = uint32(t)
		}
		out[i] = ids
	}
	return out, nil
}
