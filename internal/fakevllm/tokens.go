package fakevllm

import (
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/tokenbus/tokenbus/schemas"
)

// The fake's tokens, for generation (its /tokenize is a token per byte):
// a text prompt (a chat request's messages as one text) is 7 prompt ids
// from 100 to 999, a hash of the text (usage's 7 prompt tokens); a token-id
// prompt is its ids. Content token i of a choice is id FirstTokenID+p with
// text " tok<p>", where p is i plus where the context left off: after a
// prompt ending in id FirstTokenID+q, p starts at q+1. So a completion
// continued from the ids of its prompt and of what it generated goes on as
// one uninterrupted run would, as a model's next token follows from the ids
// before it, while one continued from its text (7 new ids) starts again at
// " tok0".
const FirstTokenID = 1000

// promptTokens is the prompt's ids as the fake tokenizes it for generation.
func promptTokens(view *schemas.Request) []int {
	if view.Kind == schemas.KindCompletion && !view.Prompt.IsText() {
		if ids := view.Prompt.TokenIDs(); len(ids) > 0 {
			return ids[0]
		}
	}
	var text strings.Builder
	if view.Kind == schemas.KindChat {
		for _, m := range view.Messages {
			text.WriteString("<|" + m.Role + "|>" + m.Text())
		}
	} else {
		text.WriteString(strings.Join(view.Prompt.Texts(), "\x00"))
	}
	ids := make([]int, 7)
	for j := range ids {
		h := fnv.New64a()
		h.Write([]byte(strconv.Itoa(j)))
		h.Write([]byte(text.String()))
		ids[j] = 100 + int(h.Sum64()%900)
	}
	return ids
}

// startAt is the position the first content token of a prompt takes.
func startAt(prompt []int) int {
	if n := len(prompt); n > 0 && prompt[n-1] >= FirstTokenID {
		return prompt[n-1] - FirstTokenID + 1
	}
	return 0
}

// idsJSON is ids as a JSON array.
func idsJSON(ids []int) string {
	b := make([]byte, 0, 6*len(ids)+2)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	return string(append(b, ']'))
}
