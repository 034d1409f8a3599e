package dispatcher

import (
	"math"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

// A request's real cost is the engine time it held, in its own decode steps
// when the worker timed its stream, else its tokens.
func TestRealCost(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    schemas.DoneNotice
		want float64
	}{
		{"a timed stream: 64 tokens in 640 ms after a 64 ms prefill", schemas.DoneNotice{PromptTokens: 2048, CompletionTokens: 64, PrefillMS: 64, HeldMS: 704}, 70.4},
		{"a short prompt's prefill is cheap", schemas.DoneNotice{PromptTokens: 40, CompletionTokens: 64, PrefillMS: 16, HeldMS: 656}, 65.6},
		{"not timed: tokens, a prompt token at 1/32", schemas.DoneNotice{PromptTokens: 64, CompletionTokens: 10}, 12},
		{"no output: the prompt alone", schemas.DoneNotice{PromptTokens: 320, PrefillMS: 30, HeldMS: 31}, 10},
	} {
		if got := realCost(tc.n, 1.0/32); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
