package sim

import (
	"fmt"

	"github.com/tokenbus/tokenbus/schemas"
)

// Reasoning, as vLLM serves a reasoning model with a reasoning parser: with
// Config.ReasoningTokens > 0 a chat answer begins with that many tokens of
// reasoning (words, like the text), delivered as reasoning_content in the
// message and in deltas before any content, tool call included. They count
// as completion tokens; vLLM's usage has no completion_tokens_details, so
// neither has the sim's. reasoning_effort scales them.

// effortScale is reasoning_effort's factor, in quarters of ReasoningTokens
// ("" is medium). vLLM knows low, medium and high; the sim also takes
// OpenAI's minimal and none.
var effortScale = map[string]int{"none": 0, "minimal": 1, "low": 2, "": 4, "medium": 4, "high": 8}

// reasoningTokens is the length of the reasoning a chat answer begins with.
func (e *Engine) reasoningTokens(effort string) (int, *schemas.Error) {
	q, ok := effortScale[effort]
	if !ok {
		return 0, schemas.ErrInvalidValue.At("reasoning_effort", "reasoning_effort",
			fmt.Sprintf("expected 'none', 'minimal', 'low', 'medium' or 'high', but got '%s'", effort))
	}
	n := e.cfg.ReasoningTokens
	if n <= 0 || q == 0 {
		return 0, nil
	}
	return max(n*q/4, 1), nil
}
