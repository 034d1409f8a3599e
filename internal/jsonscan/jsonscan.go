// Package jsonscan reads the top-level members of a JSON object without
// decoding it: the gateway, the sim-server and the HTTP engines need a field or
// two of request bodies they pass on untouched, and decoding whole bodies (long
// prompts, message arrays) would cost far more than the rest of the request.
package jsonscan

import (
	"bytes"
	"encoding/json"
)

// Members calls fn with the raw key (between its quotes, escapes not
// decoded: see Key) and the raw value of every top-level member of the
// object b, in order, until fn returns false. It reports whether the scan
// reached the end of a well-formed object; on malformed input it stops where
// it can no longer tell a member from the rest.
func Members(b []byte, fn func(key, val []byte) bool) bool {
	i := SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		ke := SkipString(b, i)
		if ke < 0 {
			return false
		}
		key := b[i+1 : ke-1]
		i = SkipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = SkipSpace(b, i+1)
		vs := i
		if i = SkipValue(b, i); i < 0 {
			return false
		}
		if !fn(key, b[vs:i]) {
			return true
		}
		i = SkipSpace(b, i)
		switch {
		case i < len(b) && b[i] == ',':
			i = SkipSpace(b, i+1)
		case i < len(b) && b[i] == '}':
			return true
		default:
			return false
		}
	}
}

// Key is a raw key with its escapes decoded (the key itself when it has none).
func Key(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw
	}
	var k string
	if json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &k) != nil {
		return raw
	}
	return []byte(k)
}

// SkipSpace returns the index of the first non-space byte at or after i.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// SkipString returns the index just past the string starting at b[i] ('"'),
// or -1 if it does not end.
func SkipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// SkipValue returns the index just past the value starting at b[i], or -1
// if it does not end. Scalars end at the next delimiter or space.
func SkipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				j := SkipString(b, i)
				if j < 0 {
					return -1
				}
				i = j - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}
