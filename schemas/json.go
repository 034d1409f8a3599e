package schemas

import (
	"math"
	"unicode/utf16"
	"unicode/utf8"
)

// The one JSON scanner of tokenbus. Every JSON document tokenbus reads for
// meaning goes through it: request bodies (ReadRequest), stream chunks and
// responses (ReadChunk, UsageOf) and the bus's own payloads. It validates
// exactly what encoding/json's Valid accepts (fuzzed), reads in one pass
// without reflection and without allocating for what it skips, and matches
// object keys exactly, escapes decoded, as OpenAI's and vLLM's own parsers do
// (encoding/json alone would fold case, so {"model":"a","Model":"b"} could be
// read as one model by one process and as another by the next).

// scanner walks a JSON text; b[i] is the next byte to read.
type scanner struct {
	b []byte
	i int
}

// maxJSONDepth is encoding/json's nesting limit: deeper texts are invalid.
const maxJSONDepth = 10000

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek skips white space and returns the next byte (0 at the end).
func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// end reports whether only white space is left.
func (s *scanner) end() bool {
	s.ws()
	return s.i == len(s.b)
}

func (s *scanner) lit(w string) bool {
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

// null consumes a null if one is next.
func (s *scanner) null() bool {
	return s.peek() == 'n' && s.lit("null")
}

// object reads an object, calling fn for each member with the scanner at the
// value, which fn must consume. The key is raw: between its quotes, escapes
// not decoded (see keyIs). It returns false on malformed input or when fn
// does.
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
		if s.peek() != '"' {
			return false
		}
		key, ok := s.rawString()
		if !ok || s.peek() != ':' {
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

// array reads an array, calling fn with the scanner at each element, which
// fn must consume.
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

// strSafe marks the bytes that may stand in a string as they are: not '"',
// not '\\', not a control character.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return
}()

// rawString reads a string at s.i ('"') and returns its contents with their
// escapes as they are.
func (s *scanner) rawString() ([]byte, bool) {
	s.i++
	start := s.i
	b := s.b
	for s.i < len(b) {
		// The common case, a run of plain bytes, in a tight loop.
		for s.i < len(b) && strSafe[b[s.i]] {
			s.i++
		}
		if s.i >= len(b) {
			break
		}
		switch c := b[s.i]; {
		case c == '"':
			raw := b[start:s.i]
			s.i++
			return raw, true
		case c == '\\':
			if s.i+1 >= len(b) {
				return nil, false
			}
			switch b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(b) || !isHex(b[s.i+2]) || !isHex(b[s.i+3]) || !isHex(b[s.i+4]) || !isHex(b[s.i+5]) {
					return nil, false
				}
				s.i += 6
			default:
				return nil, false
			}
		default: // a control character
			return nil, false
		}
	}
	return nil, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// number reads a number per JSON's grammar and returns its text.
func (s *scanner) number() ([]byte, bool) {
	s.ws()
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return nil, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return nil, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return nil, false
		}
	}
	text := b[s.i:i]
	s.i = i
	return text, true
}

// skip consumes one value of any kind, validating it.
func (s *scanner) skip(depth int) bool {
	switch s.peek() {
	case '"':
		_, ok := s.rawString()
		return ok
	case '{':
		if depth >= maxJSONDepth {
			return false
		}
		return s.object(func([]byte) bool { return s.skip(depth + 1) })
	case '[':
		if depth >= maxJSONDepth {
			return false
		}
		return s.array(func() bool { return s.skip(depth + 1) })
	case 't':
		return s.lit("true")
	case 'f':
		return s.lit("false")
	case 'n':
		return s.lit("null")
	}
	_, ok := s.number()
	return ok
}

// value consumes one value and returns its text.
func (s *scanner) value(depth int) ([]byte, bool) {
	s.ws()
	start := s.i
	if !s.skip(depth) {
		return nil, false
	}
	return s.b[start:s.i], true
}

// validJSON reports whether b is one JSON value, as encoding/json's Valid.
func validJSON(b []byte) bool {
	s := scanner{b: b}
	return s.skip(0) && s.end()
}

// keyIs reports whether a raw key (escapes not decoded) is name, exactly.
func keyIs(raw []byte, name string) bool {
	if string(raw) == name {
		return true
	}
	if !hasEscape(raw) {
		return false
	}
	var buf [64]byte
	k := appendUnescaped(buf[:0], raw)
	return string(k) == name
}

func hasEscape(raw []byte) bool {
	for _, c := range raw {
		if c == '\\' {
			return true
		}
	}
	return false
}

// jsonString is a string's value from its raw contents (valid: read by
// rawString). Like encoding/json it turns invalid UTF-8 and lone surrogates
// into U+FFFD.
func jsonString(raw []byte) string {
	if plain(raw) {
		return string(raw)
	}
	return string(appendUnescaped(make([]byte, 0, len(raw)), raw))
}

// plain reports whether raw needs no decoding: ASCII without escapes.
func plain(raw []byte) bool {
	for _, c := range raw {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// appendUnescaped appends the value of the raw string contents to dst.
func appendUnescaped(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '\\':
			if i+1 >= len(raw) {
				return dst
			}
			switch raw[i+1] {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				if i+6 > len(raw) {
					return dst // only from raw contents that were never scanned
				}
				r := hex4(raw[i+2:])
				i += 6
				if utf16.IsSurrogate(r) {
					if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
						if pair := utf16.DecodeRune(r, hex4(raw[i+2:])); pair != utf8.RuneError {
							dst = utf8.AppendRune(dst, pair)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				dst = utf8.AppendRune(dst, r)
				continue
			default: // '"', '\\', '/'
				dst = append(dst, raw[i+1])
			}
			i += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, n := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && n == 1 {
				dst = utf8.AppendRune(dst, utf8.RuneError)
			} else {
				dst = append(dst, raw[i:i+n]...)
			}
			i += n
		}
	}
	return dst
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		default:
			c = c - 'A' + 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// kindOf names the JSON type of a value by its first byte, for messages.
func kindOf(first byte) string {
	switch first {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// parseInt reads an integer number text as encoding/json reads one into an
// int: no fraction, no exponent, in range.
func parseInt(text []byte) (int, bool) {
	neg := len(text) > 0 && text[0] == '-'
	if neg {
		text = text[1:]
	}
	if len(text) == 0 {
		return 0, false
	}
	var n uint64
	for _, c := range text {
		if c < '0' || c > '9' {
			return 0, false // a fraction or an exponent
		}
		if n > (math.MaxUint64-9)/10 {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	switch {
	case !neg && n <= math.MaxInt:
		return int(n), true
	case neg && n <= uint64(math.MaxInt)+1:
		return int(-n), true
	}
	return 0, false
}
