package simserver

import (
	"bytes"
	"encoding/json"

	"github.com/tokenbus/tokenbus/internal/jsonscan"
)

// scanTop finds a request body's top-level "model" (a string, else "") and
// "stream" (true or not) without decoding the rest, binding keys as
// encoding/json does (case-insensitively, the last one wins), so the server
// and the sim agree on them. It gives up quietly on malformed JSON: the sim
// answers that with a 400.
func scanTop(b []byte) (model string, stream bool) {
	jsonscan.Members(b, func(key, val []byte) bool {
		switch {
		case keyIs(key, "model"):
			model = stringValue(val)
		case keyIs(key, "stream"):
			stream = string(val) == "true"
		}
		return true
	})
	return model, stream
}

func keyIs(key []byte, name string) bool {
	return bytes.EqualFold(jsonscan.Key(key), []byte(name))
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
