package schemas

import (
	"errors"
	"strings"
)

// ModelToken encodes a model name as one subject token, reversibly. Letters,
// digits, '-' and '_' stand for themselves; every other byte is written as '~'
// and two lower-case hex digits. So "meta-llama/Llama-3.1-8B" becomes
// "meta-llama~2fLlama-3~2e1-8B". The encoding is injective, which makes
// per-model subject permissions exact.
func ModelToken(model string) string {
	plain := true
	for i := 0; i < len(model); i++ {
		if !tokenSafe(model[i]) {
			plain = false
			break
		}
	}
	if plain {
		return model
	}
	var b strings.Builder
	b.Grow(len(model) + 8)
	const hex = "0123456789abcdef"
	for i := 0; i < len(model); i++ {
		c := model[i]
		if tokenSafe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('~')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xf])
	}
	return b.String()
}

// ErrBadModelToken is returned for a token that ModelToken cannot have made.
var ErrBadModelToken = errors.New("bad model token")

// ParseModelToken inverts ModelToken.
func ParseModelToken(tok string) (string, error) {
	if tok == "" {
		return "", ErrBadModelToken
	}
	if !strings.Contains(tok, "~") {
		for i := 0; i < len(tok); i++ {
			if !tokenSafe(tok[i]) {
				return "", ErrBadModelToken
			}
		}
		return tok, nil
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if tokenSafe(c) {
			out = append(out, c)
			continue
		}
		if c != '~' || i+2 >= len(tok) {
			return "", ErrBadModelToken
		}
		hi, ok1 := unhex(tok[i+1])
		lo, ok2 := unhex(tok[i+2])
		v := hi<<4 | lo
		if !ok1 || !ok2 || tokenSafe(v) {
			// a safe byte written escaped would make two tokens for one name
			return "", ErrBadModelToken
		}
		out = append(out, v)
		i += 2
	}
	return string(out), nil
}

func tokenSafe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
