package bench

import (
	"errors"
	"strconv"

	"github.com/tokenbus/tokenbus/internal/jsonscan"
)

// parsedChunk is what the benchmark reads from one stream chunk (or a whole
// non-stream response). Byte slices point into the parsed input and are still
// JSON-escaped; they are valid until the input is reused.
type parsedChunk struct {
	id, object []byte
	choices    []parsedChoice
	usage      *usage // nil when absent or null
	usageVal   usage
	errRaw     []byte // the raw value of a top-level "error" key, even null; nil when absent
}

type parsedChoice struct {
	hasIndex bool // "index" present and an integer
	index    int
	content  []byte // first non-empty of delta/message content, text, reasoning_content
	finish   []byte // finish_reason string contents; nil when absent or null
	hasFin   bool   // finish_reason present and not null
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

var errBadJSON = errors.New("invalid JSON")

// parseChunk is a small JSON scanner for the OpenAI chunk shape, much cheaper
// than encoding/json (no reflection, no allocation once p.choices has grown).
// It rejects every input that json.Valid rejects. Unknown keys are skipped;
// a known key with a value of the wrong type is an error, as in encoding/json.
func parseChunk(data []byte, p *parsedChunk) error {
	*p = parsedChunk{choices: p.choices[:0]}
	s := scanner{b: data}
	s.ws()
	ok := s.object(func(key []byte) bool {
		switch string(key) {
		case "id":
			return s.strOrNull(&p.id)
		case "object":
			return s.strOrNull(&p.object)
		case "error":
			start := s.i
			if !s.skip(0) {
				return false
			}
			p.errRaw = data[start:s.i]
			return true
		case "usage":
			if s.null() {
				p.usage = nil
				return true
			}
			p.usageVal = usage{}
			p.usage = &p.usageVal
			return s.object(func(k []byte) bool {
				switch string(k) {
				case "prompt_tokens":
					return s.intOrNull(&p.usageVal.PromptTokens, nil)
				case "completion_tokens":
					return s.intOrNull(&p.usageVal.CompletionTokens, nil)
				}
				return s.skip(0)
			})
		case "choices":
			p.choices = p.choices[:0]
			if s.null() {
				return true
			}
			return s.array(func() bool {
				p.choices = append(p.choices, parsedChoice{})
				return s.choice(&p.choices[len(p.choices)-1])
			})
		}
		return s.skip(0)
	})
	if !ok {
		return errBadJSON
	}
	s.ws()
	if s.i != len(s.b) {
		return errBadJSON
	}
	return nil
}

func (s *scanner) choice(c *parsedChoice) bool {
	var content, text, reasoning []byte
	msg := func() bool {
		if s.null() {
			return true
		}
		return s.object(func(k []byte) bool {
			switch string(k) {
			case "content":
				return s.strOrNull(&content)
			case "reasoning_content":
				return s.strOrNull(&reasoning)
			}
			return s.skip(0)
		})
	}
	ok := s.object(func(k []byte) bool {
		switch string(k) {
		case "index":
			return s.intOrNull(&c.index, &c.hasIndex)
		case "delta", "message":
			return msg()
		case "text":
			return s.strOrNull(&text)
		case "finish_reason":
			c.finish, c.hasFin = nil, false
			if s.null() {
				return true
			}
			c.hasFin = true
			return s.str(&c.finish)
		}
		return s.skip(0)
	})
	switch {
	case len(content) > 0:
		c.content = content
	case len(text) > 0:
		c.content = text
	default:
		c.content = reasoning
	}
	return ok
}

// scanner walks JSON without building values.
type scanner struct {
	b []byte
	i int
}

const maxDepth = 256

func (s *scanner) ws() {
	s.i = jsonscan.SkipSpace(s.b, s.i)
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) lit(w string) bool {
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

// null consumes a null literal if one is next.
func (s *scanner) null() bool {
	return s.peek() == 'n' && s.lit("null")
}

// object calls fn for each key with the scanner at the value; fn must consume it.
func (s *scanner) object(fn func(key []byte) bool) bool {
	if s.peek() != '{' {
		return false
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		var key []byte
		if s.peek() != '"' || !s.str(&key) {
			return false
		}
		if s.peek() != ':' {
			return false
		}
		s.i++
		s.ws()
		if !fn(key) {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

func (s *scanner) array(fn func() bool) bool {
	if s.peek() != '[' {
		return false
	}
	s.i++
	if s.peek() == ']' {
		s.i++
		return true
	}
	for {
		s.ws()
		if !fn() {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return true
		default:
			return false
		}
	}
}

// str scans a string and sets *out to its raw (escaped) contents.
func (s *scanner) str(out *[]byte) bool {
	if s.peek() != '"' {
		return false
	}
	s.i++
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			*out = s.b[start:s.i]
			s.i++
			return true
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return false
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !isHex(h) {
						return false
					}
				}
				s.i += 6
			default:
				return false
			}
		case c < 0x20:
			return false
		default:
			s.i++
		}
	}
	return false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func (s *scanner) strOrNull(out *[]byte) bool {
	if s.null() {
		*out = nil
		return true
	}
	return s.str(out)
}

// intOrNull reads an integer (null leaves *out alone); *has reports presence.
func (s *scanner) intOrNull(out *int, has *bool) bool {
	if s.null() {
		if has != nil {
			*has = false
		}
		return true
	}
	start := s.i
	if !s.number() {
		return false
	}
	n, err := strconv.Atoi(string(s.b[start:s.i]))
	if err != nil {
		return false // a fraction or out of range: encoding/json rejects it for an int too
	}
	*out = n
	if has != nil {
		*has = true
	}
	return true
}

// number scans a JSON number per the grammar.
func (s *scanner) number() bool {
	s.ws()
	i := s.i
	if i < len(s.b) && s.b[i] == '-' {
		i++
	}
	switch {
	case i < len(s.b) && s.b[i] == '0':
		i++
	case i < len(s.b) && s.b[i] >= '1' && s.b[i] <= '9':
		for i < len(s.b) && s.b[i] >= '0' && s.b[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(s.b) && s.b[i] == '.' {
		i++
		d := i
		for i < len(s.b) && s.b[i] >= '0' && s.b[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	if i < len(s.b) && (s.b[i] == 'e' || s.b[i] == 'E') {
		i++
		if i < len(s.b) && (s.b[i] == '+' || s.b[i] == '-') {
			i++
		}
		d := i
		for i < len(s.b) && s.b[i] >= '0' && s.b[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	s.i = i
	return true
}

// skip consumes any one value.
func (s *scanner) skip(depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch c := s.peek(); {
	case c == '"':
		var b []byte
		return s.str(&b)
	case c == '{':
		return s.object(func([]byte) bool { return s.skip(depth + 1) })
	case c == '[':
		return s.array(func() bool { return s.skip(depth + 1) })
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	default:
		return s.number()
	}
}

// streamCheck verifies the chunks of one response (n = 1: one choice, index 0).
type streamCheck struct {
	object   string // expected "object"
	id       string
	finished bool
}

// check verifies one parsed chunk and returns the failure kind and detail, or "".
func (sc *streamCheck) check(p *parsedChunk) (kind, msg string) {
	if p.errRaw != nil {
		if string(p.errRaw) == "null" {
			return "protocol_error_key", `chunk has "error": null`
		}
		return "stream_error", errorMessage(append(append([]byte(`{"error":`), p.errRaw...), '}'))
	}
	if len(p.id) == 0 {
		return "protocol_missing_id", "chunk without id"
	}
	if sc.id == "" {
		sc.id = string(jsonscan.Key(p.id))
	} else if string(p.id) != sc.id {
		if id := string(jsonscan.Key(p.id)); id != sc.id {
			return "protocol_id_changed", "id " + strconv.Quote(id) + " after " + strconv.Quote(sc.id)
		}
	}
	if string(p.object) != sc.object {
		if obj := string(jsonscan.Key(p.object)); obj != sc.object {
			return "protocol_object", "object " + strconv.Quote(obj) + ", want " + strconv.Quote(sc.object)
		}
	}
	for i := range p.choices {
		ch := &p.choices[i]
		if !ch.hasIndex {
			return "protocol_choice_index", "choice without index"
		}
		if ch.index != 0 {
			return "protocol_choice_index", "choice index " + strconv.Itoa(ch.index) + " with n=1"
		}
		if sc.finished && (len(ch.content) > 0 || ch.hasFin) {
			return "protocol_chunk_after_finish", "choice continues after its finish_reason"
		}
		if ch.hasFin {
			if len(ch.finish) == 0 {
				return "protocol_finish_reason", "empty finish_reason"
			}
			sc.finished = true
		}
	}
	return "", ""
}
