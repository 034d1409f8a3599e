package sim

import (
	"unicode/utf8"

	"github.com/tokenbus/tokenbus/schemas"
)

// What a sequence answers. By default, words drawn one token a step
// (sched.go). A structured answer (response_format, format.go), tool calls
// (tools.go) or the answer to a tool's result is made whole when the request
// arrives, from the sequence's seed, and then delivered one token a step
// like any text: the sequence's script. Reasoning (reasoning.go) comes
// before either.

// answerPlan is what the sequences of a request answer; each fills its
// script from its own seed.
type answerPlan struct {
	reasoning int            // tokens of reasoning before the answer
	calls     []*plannedCall // the tools to call; nil: a text answer
	format    *formatPlan    // response_format json_schema or json_object; nil: text
	text      []string       // a fixed text answer's tokens (to a tool's result); nil: none
}

// plannedCall is a tool the answer calls: its arguments are generated from
// its parameters schema (nil: {}).
type plannedCall struct {
	name   string
	params *schemaNode
	strict bool
}

// callState is one tool call of a sequence: its id and name, the script
// token its arguments start at, and their first byte in the sequence's text.
type callState struct {
	id, name     string
	first, start int
}

// plan reads what the request asks the answer to be, or says with a 400
// what the engine refuses in it (schemas.ReadRequest checked the types).
func (e *Engine) plan(b *schemas.Request, chat bool) (answerPlan, *schemas.Error) {
	var p answerPlan
	var err *schemas.Error
	if p.format, err = planFormat(&b.ResponseFormat); err != nil {
		return p, err
	}
	if err := checkLogprobs(b, chat); err != nil {
		return p, err
	}
	if !chat {
		return p, nil
	}
	if p.reasoning, err = e.reasoningTokens(b.ReasoningEffort); err != nil {
		return p, err
	}
	var text string
	if p.calls, text, err = planTools(b); err != nil {
		return p, err
	}
	if text != "" && p.format == nil {
		p.text = splitTokens([]byte(text))
	}
	return p, nil
}

// scripted reports whether the answer is made in advance.
func (p *answerPlan) scripted() bool { return p.calls != nil || p.format != nil || p.text != nil }

// fill makes s's script, drawn from seed.
func (p *answerPlan) fill(s *seq, seed uint64) {
	switch {
	case p.calls != nil:
		text := 0
		for i, c := range p.calls {
			args := []byte("{}")
			if c.params != nil {
				args = generateJSON(c.params, seed^uint64(i+1)*0x9e3779b97f4a7c15, c.strict)
			}
			s.calls = append(s.calls, callState{id: callID(seed, i), name: c.name, first: len(s.script), start: text})
			s.script = append(s.script, splitTokens(args)...)
			text += len(args)
		}
	case p.format != nil:
		s.script = splitTokens(p.format.generate(seed))
	case p.text != nil:
		s.script = p.text
	}
}

// splitTokens cuts text into its cl100k_base tokens' texts, one for each
// step that delivers it; a character that spans tokens stays whole in one
// piece (a piece is valid UTF-8), counted as one token.
func splitTokens(text []byte) []string {
	_, toks, err := codec().Encode(string(text))
	if err != nil || len(toks) == 0 {
		return []string{string(text)}
	}
	out := make([]string, 0, len(toks))
	pending := ""
	for _, t := range toks {
		pending += t
		if utf8.ValidString(pending) {
			out = append(out, pending)
			pending = ""
		}
	}
	if pending != "" {
		out = append(out, pending)
	}
	return out
}

// callID is a tool call's id: call_ and 24 letters and digits drawn from
// the sequence's seed, the same for the same request.
func callID(seed uint64, i int) string {
	const alnum = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 0, 29)
	b = append(b, "call_"...)
	h := seed ^ 0xca11 ^ uint64(i+1)<<32
	for len(b) < cap(b) {
		h = schemas.Mix64(h + 0x9e3779b97f4a7c15)
		for x := h; x > 0 && len(b) < cap(b); x /= 62 {
			b = append(b, alnum[x%62])
		}
	}
	return string(b)
}
