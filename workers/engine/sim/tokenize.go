package sim

import (
	"fmt"
	"strings"

	"github.com/tokenbus/tokenbus/schemas"
)

// TokenizePrompt returns the token ids the engine counts for a completions
// prompt string (cl100k_base); "" has none.
func (e *Engine) TokenizePrompt(s string) []uint32 { return encode(nil, s) }

// TokenizeChat returns the token ids the engine counts for chat messages
// (read by schemas.ReadMessages): the ChatML template, and with
// addGenerationPrompt the assistant's generation prompt that Generate always
// adds.
func (e *Engine) TokenizeChat(messages []schemas.Message, addGenerationPrompt bool) []uint32 {
	ids := chatPrompt(messages)
	if !addGenerationPrompt {
		ids = ids[:len(ids)-len(roleTokens()["assistant"])-2] // <|im_start|>assistant\n
	}
	return ids
}

// specialTokens are cl100k_base's special tokens, which the codec does not
// decode.
var specialTokens = map[int64]string{
	100257: "<|endoftext|>", 100258: "<|fim_prefix|>", 100259: "<|fim_middle|>", 100260: "<|fim_suffix|>",
	tokImStart: "<|im_start|>", tokImEnd: "<|im_end|>", 100276: "<|endofprompt|>",
}

// Detokenize turns token ids back into text, special tokens included. An id
// outside the vocabulary is a 400 *schemas.Error.
func (e *Engine) Detokenize(ids []int64) (string, error) {
	var out strings.Builder
	run := make([]uint, 0, len(ids))
	flush := func() error {
		if len(run) == 0 {
			return nil
		}
		s, err := codec().Decode(run)
		if err != nil {
			return schemas.ErrInvalidValue.At("tokens", "tokens", err.Error())
		}
		out.WriteString(s)
		run = run[:0]
		return nil
	}
	for _, id := range ids {
		if sp, ok := specialTokens[id]; ok {
			if err := flush(); err != nil {
				return "", err
			}
			out.WriteString(sp)
			continue
		}
		if id < 0 || id >= vocabSize {
			return "", schemas.ErrInvalidValue.At("tokens", "tokens", fmt.Sprintf("token id %d is out of vocabulary", id))
		}
		run = append(run, uint(id))
	}
	if err := flush(); err != nil {
		return "", err
	}
	return out.String(), nil
}
