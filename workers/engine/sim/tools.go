package sim

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/tokenbus/tokenbus/schemas"
)

// Tool calls. With tools, the sim answers as vLLM with a tool parser and
// --enable-auto-tool-choice does, by a fixed rule so that agents can be
// tested against it (docs/engines.md, the sim engine, says it exactly):
//
//   - tool_choice "none": text.
//   - a named tool ({"type":"function","function":{"name"}}): a call of it.
//   - "required": a call of the tool(s) picked from the last user message.
//   - "auto" (the default with tools): a call of the tool(s) picked from the
//     last message when it is the user's; when it is a tool's result (the
//     trailing role "tool" messages), the text "The result is: <their
//     contents joined by "; ">"; after any other message, text.
//
// The pick: the tools whose names the user's text names as whole words, in
// the order the text names them (only the first unless parallel_tool_calls
// is on, as it is by default); if it names none, the one tool whose name
// and description share the most words with the text (ties to the first in
// tools; no word in common: the first). Words are runs of letters and
// digits, lower-cased; a tool's name and description also split at
// lower-to-upper case changes; stopWords do not count.
//
// A call's arguments are JSON valid against its parameters (jsonschema.go);
// they are the answer's tokens, counted in usage like text.

// stopWords are words the pick ignores: they would match any tool.
var stopWords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`a an and are as at be by can do for from get give i in is it me my of on or
		please set show tell that the this to use what when where which who will with you your`) {
		m[w] = true
	}
	return m
}()

// planTools reads tools and tool_choice: the tools each sequence calls
// (nil: none), or the text that answers a tool's result.
func planTools(b *schemas.Request) ([]*plannedCall, string, *schemas.Error) {
	compiled := make([]*plannedCall, len(b.Tools))
	for i, t := range b.Tools {
		at := func(m string) string { return fmt.Sprintf("tools[%d]%s", i, m) }
		switch {
		case t.Type != "function":
			return nil, "", schemas.ErrInvalidValue.At(at(".type"), at(".type"), fmt.Sprintf("expected 'function', but got '%s'", t.Type))
		case !t.HasFunction:
			return nil, "", schemas.ErrMissingParam.At(at(".function"), at(".function"))
		case t.Name == "":
			return nil, "", schemas.ErrMissingParam.At(at(".function.name"), at(".function.name"))
		}
		c := &plannedCall{name: t.Name, strict: t.Strict}
		if t.Parameters != nil {
			var err *schemas.Error
			if c.params, err = compileSchema(t.Parameters, at(".function.parameters")); err != nil {
				return nil, "", err
			}
		}
		compiled[i] = c
	}
	tc := b.ToolChoice
	mode := tc.Mode
	if mode == "" {
		mode = "none"
		if len(b.Tools) > 0 {
			mode = "auto"
		}
	}
	switch mode {
	case "none":
		return nil, "", nil
	case "auto", "required", "function":
		if len(b.Tools) == 0 {
			return nil, "", schemas.ErrInvalidValue.At("tool_choice", "tool_choice", "when using `tool_choice`, `tools` must be set")
		}
	default:
		return nil, "", schemas.ErrInvalidValue.At("tool_choice", "tool_choice",
			fmt.Sprintf("expected 'none', 'auto', 'required' or a named function, but got '%s'", mode))
	}
	msgs := b.Messages
	switch mode {
	case "function":
		if tc.Name == "" {
			return nil, "", schemas.ErrMissingParam.At("tool_choice.function.name", "tool_choice.function.name")
		}
		for _, c := range compiled {
			if c.name == tc.Name {
				return []*plannedCall{c}, "", nil
			}
		}
		return nil, "", schemas.ErrInvalidValue.At("tool_choice.function.name", "tool_choice.function.name",
			fmt.Sprintf("the tool '%s' is not one of the request's tools", tc.Name))
	case "required":
		user := ""
		for i := len(msgs) - 1; i >= 0; i-- {
			if msgs[i].Role == "user" {
				user = msgs[i].Text()
				break
			}
		}
		return pickTools(user, b.Tools, compiled, b.ParallelToolCalls), "", nil
	}
	switch last := msgs[len(msgs)-1]; last.Role {
	case "user":
		return pickTools(last.Text(), b.Tools, compiled, b.ParallelToolCalls), "", nil
	case "tool":
		return nil, resultText(msgs), nil
	}
	return nil, "", nil
}

// resultText is the answer to the trailing tool messages: it quotes them,
// so a test sees the tool's result reached the model.
func resultText(msgs []schemas.Message) string {
	first := len(msgs)
	for first > 0 && msgs[first-1].Role == "tool" {
		first--
	}
	parts := make([]string, 0, len(msgs)-first)
	for _, m := range msgs[first:] {
		parts = append(parts, m.Text())
	}
	return "The result is: " + strings.Join(parts, "; ")
}

// pickTools is the rule of the package comment.
func pickTools(text string, tools []schemas.Tool, compiled []*plannedCall, parallel bool) []*plannedCall {
	type hit struct{ at, tool int }
	var named []hit
	for i, t := range tools {
		if at := wholeWord(text, t.Name); at >= 0 {
			named = append(named, hit{at, i})
		}
	}
	if len(named) > 0 {
		// In the order the text names them (a stable insertion sort: few).
		for i := 1; i < len(named); i++ {
			for j := i; j > 0 && named[j].at < named[j-1].at; j-- {
				named[j], named[j-1] = named[j-1], named[j]
			}
		}
		if !parallel {
			named = named[:1]
		}
		out := make([]*plannedCall, len(named))
		for i, h := range named {
			out[i] = compiled[h.tool]
		}
		return out
	}
	asked := wordSet(text, false)
	best, bestScore := 0, -1
	for i, t := range tools {
		score := 0
		for w := range wordSet(t.Name+" "+t.Description, true) {
			if asked[w] {
				score++
			}
		}
		if score > bestScore {
			best, bestScore = i, score
		}
	}
	return []*plannedCall{compiled[best]}
}

// wholeWord is where name stands in text as a whole word (not inside a
// longer run of letters, digits and '_'), or -1.
func wholeWord(text, name string) int {
	isWord := func(b byte) bool {
		return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= 0x80
	}
	for from := 0; from <= len(text)-len(name); {
		i := strings.Index(text[from:], name)
		if i < 0 {
			return -1
		}
		i += from
		end := i + len(name)
		if (i == 0 || !isWord(text[i-1])) && (end == len(text) || !isWord(text[end])) {
			return i
		}
		from = i + 1
	}
	return -1
}

// wordSet is the words of s that count for the pick; identifiers also
// split at case changes (getWeather: get, weather).
func wordSet(s string, identifiers bool) map[string]bool {
	set := map[string]bool{}
	var cur []rune
	flush := func() {
		if w := string(cur); w != "" && !stopWords[w] {
			set[w] = true
		}
		cur = cur[:0]
	}
	var prev rune
	for _, c := range s {
		switch {
		case unicode.IsLetter(c) || unicode.IsDigit(c):
			if identifiers && unicode.IsUpper(c) && unicode.IsLower(prev) {
				flush()
			}
			cur = append(cur, unicode.ToLower(c))
		default:
			flush()
		}
		prev = c
	}
	flush()
	return set
}
