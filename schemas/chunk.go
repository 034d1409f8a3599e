package schemas

import "errors"

// Chunk is what tokenbus reads of an OpenAI stream chunk, or of a whole
// chat.completion or text_completion response: the benchmark checks streams
// with it and the HTTP engines look for usage and in-band errors. Byte
// slices alias the input and are raw string contents (escapes as sent;
// String decodes them).
type Chunk struct {
	ID, Object []byte // nil when absent or null
	Choices    []ChunkChoice
	Usage      *Usage // nil when absent or null
	// Error is the raw value of a top-level "error" member, even null (which
	// OpenAI clients also take as an error); nil when absent.
	Error []byte

	usage Usage
}

// ChunkChoice is one element of a chunk's choices.
type ChunkChoice struct {
	Index    int
	HasIndex bool // "index" is present and an integer
	// Content is the first non-empty of delta/message content, text and
	// reasoning_content.
	Content   []byte
	Finish    []byte // finish_reason; nil when absent or null
	HasFinish bool   // finish_reason is present and not null
}

// ErrBadChunk is ReadChunk's error for input that is not a chunk: not JSON,
// not an object, or a known member of the wrong type.
var ErrBadChunk = errors.New("not an OpenAI chunk object")

// ReadChunk reads data into c, reusing c.Choices; it allocates nothing once
// c.Choices has grown. Keys match exactly; a repeated key's last value wins.
func ReadChunk(data []byte, c *Chunk) error {
	*c = Chunk{Choices: c.Choices[:0]}
	s := scanner{b: data}
	ok := s.object(func(key []byte) bool {
		switch {
		case keyIs(key, "id"):
			return s.rawStringOrNull(&c.ID)
		case keyIs(key, "object"):
			return s.rawStringOrNull(&c.Object)
		case keyIs(key, "error"):
			v, ok := s.value(1)
			c.Error = v
			return ok
		case keyIs(key, "usage"):
			if s.null() {
				c.Usage = nil
				return true
			}
			c.usage = Usage{}
			c.Usage = &c.usage
			return s.readUsage(&c.usage, 1)
		case keyIs(key, "choices"):
			c.Choices = c.Choices[:0]
			if s.null() {
				return true
			}
			return s.array(func() bool {
				c.Choices = append(c.Choices, ChunkChoice{})
				return s.choice(&c.Choices[len(c.Choices)-1])
			})
		}
		return s.skip(1)
	})
	if !ok || !s.end() {
		return ErrBadChunk
	}
	return nil
}

func (s *scanner) choice(c *ChunkChoice) bool {
	var content, text, reasoning []byte
	msg := func() bool {
		if s.null() {
			return true
		}
		return s.object(func(k []byte) bool {
			switch {
			case keyIs(k, "content"):
				return s.rawStringOrNull(&content)
			case keyIs(k, "reasoning_content"):
				return s.rawStringOrNull(&reasoning)
			}
			return s.skip(4)
		})
	}
	ok := s.object(func(k []byte) bool {
		switch {
		case keyIs(k, "index"):
			c.HasIndex = false
			if s.null() {
				return true
			}
			c.HasIndex = s.readInt(&c.Index)
			return c.HasIndex
		case keyIs(k, "delta"), keyIs(k, "message"):
			return msg()
		case keyIs(k, "text"):
			return s.rawStringOrNull(&text)
		case keyIs(k, "finish_reason"):
			c.Finish, c.HasFinish = nil, false
			if s.null() {
				return true
			}
			if s.peek() != '"' {
				return false
			}
			raw, ok := s.rawString()
			c.Finish, c.HasFinish = raw, ok
			return ok
		}
		return s.skip(3)
	})
	switch {
	case len(content) > 0:
		c.Content = content
	case len(text) > 0:
		c.Content = text
	default:
		c.Content = reasoning
	}
	return ok
}

// rawStringOrNull reads a string's raw contents, or null (nil).
func (s *scanner) rawStringOrNull(dst *[]byte) bool {
	switch s.peek() {
	case 'n':
		*dst = nil
		return s.lit("null")
	case '"':
		raw, ok := s.rawString()
		*dst = raw
		return ok
	}
	return false
}

// String is the value of raw string contents as ReadChunk returns them
// (escapes decoded; invalid UTF-8 becomes U+FFFD, as in encoding/json).
func String(raw []byte) string { return jsonString(raw) }
