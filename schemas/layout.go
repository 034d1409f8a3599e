package schemas

import "math"

// Span is where a JSON value lies in a document: doc[Start:End]. The zero
// Span is an absent member.
type Span struct{ Start, End int }

// Has reports whether the member is present (null included).
func (s Span) Has() bool { return s.End > s.Start }

// In is the value's text in doc.
func (s Span) In(doc []byte) []byte { return doc[s.Start:s.End] }

// Null reports whether the member is absent or null.
func (s Span) Null(doc []byte) bool { return !s.Has() || string(doc[s.Start:s.End]) == "null" }

// ChunkLayout is where the members of an OpenAI stream chunk lie, for a
// reader that rewrites a chunk value by value instead of decoding and
// encoding it again, so that its keys keep the engine's order (a migrated
// stream's splice, client/splice.go). Spans are of values, raw: strings with
// their quotes, escapes as sent.
type ChunkLayout struct {
	ID, Object, Created, Model, Choices, Usage Span
	// PromptTokenIDs is vLLM's top-level prompt_token_ids (chat streams
	// with return_token_ids: the first chunk).
	PromptTokenIDs Span
	// The members of a usage object.
	PromptTokens, CompletionTokens, TotalTokens Span
	Choice                                      []ChoiceLayout
}

// ChoiceLayout is where the members of one element of a chunk's choices lie.
type ChoiceLayout struct {
	Index, Text, Delta, Logprobs, FinishReason, StopReason Span
	// Content is delta's content (chat); Role says delta has a role, and
	// Other that it has members besides role and content (tool_calls,
	// reasoning_content...): what a parser made of the tokens.
	Content     Span
	Role, Other bool
	// vLLM's return_token_ids: the prompt's ids (completions: the first
	// chunk) and the ids of the tokens this chunk carries.
	PromptTokenIDs, TokenIDs Span
}

// DeltaEmpty reports whether a chat choice's delta is {}.
func (c *ChoiceLayout) DeltaEmpty() bool {
	return c.Delta.End-c.Delta.Start >= 2 && !c.Content.Has() && !c.Role && !c.Other
}

// ReadChunkLayout reads where the members of the chunk data lie into l,
// reusing l.Choice; it allocates nothing once l.Choice has grown. Keys match
// exactly; a repeated key's last value wins. The error is ErrBadChunk for
// anything but a JSON object whose choices (if any) is an array of objects.
func ReadChunkLayout(data []byte, l *ChunkLayout) error {
	*l = ChunkLayout{Choice: l.Choice[:0]}
	s := scanner{b: data}
	ok := s.object(func(key []byte) bool {
		start := s.i
		switch {
		case keyIs(key, "choices"):
			l.Choice = l.Choice[:0]
			if !s.null() && !s.array(func() bool {
				l.Choice = append(l.Choice, ChoiceLayout{})
				return s.choiceLayout(&l.Choice[len(l.Choice)-1])
			}) {
				return false
			}
			l.Choices = Span{start, s.i}
			return true
		case keyIs(key, "usage"):
			l.PromptTokens, l.CompletionTokens, l.TotalTokens = Span{}, Span{}, Span{}
			if s.peek() == '{' {
				if !s.object(func(k []byte) bool {
					at := s.i
					if !s.skip(2) {
						return false
					}
					switch {
					case keyIs(k, "prompt_tokens"):
						l.PromptTokens = Span{at, s.i}
					case keyIs(k, "completion_tokens"):
						l.CompletionTokens = Span{at, s.i}
					case keyIs(k, "total_tokens"):
						l.TotalTokens = Span{at, s.i}
					}
					return true
				}) {
					return false
				}
			} else if !s.skip(1) {
				return false
			}
			l.Usage = Span{start, s.i}
			return true
		}
		if !s.skip(1) {
			return false
		}
		sp := Span{start, s.i}
		switch {
		case keyIs(key, "id"):
			l.ID = sp
		case keyIs(key, "object"):
			l.Object = sp
		case keyIs(key, "created"):
			l.Created = sp
		case keyIs(key, "model"):
			l.Model = sp
		case keyIs(key, "prompt_token_ids"):
			l.PromptTokenIDs = sp
		}
		return true
	})
	if !ok || !s.end() {
		return ErrBadChunk
	}
	return nil
}

func (s *scanner) choiceLayout(c *ChoiceLayout) bool {
	return s.object(func(k []byte) bool {
		start := s.i
		if keyIs(k, "delta") && s.peek() == '{' {
			c.Content, c.Role, c.Other = Span{}, false, false
			if !s.object(func(dk []byte) bool {
				at := s.i
				if !s.skip(3) {
					return false
				}
				switch {
				case keyIs(dk, "content"):
					c.Content = Span{at, s.i}
				case keyIs(dk, "role"):
					c.Role = true
				default:
					c.Other = true
				}
				return true
			}) {
				return false
			}
			c.Delta = Span{start, s.i}
			return true
		}
		if !s.skip(2) {
			return false
		}
		sp := Span{start, s.i}
		switch {
		case keyIs(k, "index"):
			c.Index = sp
		case keyIs(k, "text"):
			c.Text = sp
		case keyIs(k, "delta"):
			c.Delta = sp
		case keyIs(k, "logprobs"):
			c.Logprobs = sp
		case keyIs(k, "finish_reason"):
			c.FinishReason = sp
		case keyIs(k, "stop_reason"):
			c.StopReason = sp
		case keyIs(k, "prompt_token_ids"):
			c.PromptTokenIDs = sp
		case keyIs(k, "token_ids"):
			c.TokenIDs = sp
		}
		return true
	})
}

// AppendTokenIDs appends the token ids of raw, a JSON array of integers
// (vLLM's token_ids, prompt_token_ids) or null, to dst. ok is false for
// anything else, or an id outside 0..MaxInt32.
func AppendTokenIDs(dst []int32, raw []byte) (_ []int32, ok bool) {
	s := scanner{b: raw}
	if s.null() {
		return dst, s.end()
	}
	ok = s.array(func() bool {
		text, ok := s.number()
		if !ok {
			return false
		}
		n, ok := parseInt(text)
		if !ok || n < 0 || n > math.MaxInt32 {
			return false
		}
		dst = append(dst, int32(n))
		return true
	})
	return dst, ok && s.end()
}
