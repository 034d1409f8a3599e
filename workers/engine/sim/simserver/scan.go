package simserver

import (
	"bytes"
	"encoding/json"
)

// scanTop finds a request body's top-level "model" (a string, else "") and
// "stream" (true or not) without decoding the rest, binding keys as
// encoding/json does (case-insensitively, the last one wins), so the server
// and the sim agree on them. It gives up quietly on malformed JSON: the sim
// answers that with a 400.
func scanTop(b []byte) (model string, stream bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return "", false
	}
	i++
	for {
		i = skipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			return model, stream
		}
		ke := skipString(b, i)
		if ke < 0 {
			return model, stream
		}
		key := b[i+1 : ke-1]
		i = skipWS(b, ke)
		if i >= len(b) || b[i] != ':' {
			return model, stream
		}
		i = skipWS(b, i+1)
		vs := i
		if i = skipValue(b, i); i < 0 {
			return model, stream
		}
		val := b[vs:i]
		switch {
		case keyIs(key, "model"):
			model = stringValue(val)
		case keyIs(key, "stream"):
			stream = string(val) == "true"
		}
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ',' {
			return model, stream
		}
		i++
	}
}

func keyIs(key []byte, name string) bool {
	if bytes.IndexByte(key, '\\') >= 0 {
		var k string
		if json.Unmarshal(append(append([]byte{'"'}, key...), '"'), &k) != nil {
			return false
		}
		key = []byte(k)
	}
	return bytes.EqualFold(key, []byte(name))
}

// stringValue is a JSON string's value; "" for anything else.
func stringValue(v []byte) string {
	if len(v) < 2 || v[0] != '"' {
		return ""
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return string(v[1 : len(v)-1])
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return ""
	}
	return s
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string that starts at b[i] ('"'),
// or -1 if it does not end.
func skipString(b []byte, i int) int {
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

// skipValue returns the index after the value that starts at b[i], or -1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				j := skipString(b, i)
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
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}
