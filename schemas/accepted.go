package schemas

import (
	"bytes"
	"encoding/json"

	"github.com/tokenbus/tokenbus/internal/jsonscan"
)

// Every request's stream starts with an accepted frame, so its payload is
// written and read without reflection: encoding/json cost a few percent of
// a worker's and a gateway's CPU per request.

// AppendAccepted appends the JSON of a, the same object json.Marshal writes.
func AppendAccepted(b []byte, a Accepted) []byte {
	b = append(b, `{"request_id":`...)
	b = appendJSONString(b, a.RequestID)
	b = append(b, `,"worker":`...)
	b = appendJSONString(b, a.Worker)
	b = append(b, `,"cancel":`...)
	b = appendJSONString(b, a.Cancel)
	return append(b, '}')
}

// appendJSONString appends s quoted; strings that need escaping (never ids
// and subjects, in practice) go through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// ParseAccepted reads an accepted payload as json.Unmarshal into Accepted
// would (keys case-insensitive, the last one wins, unknown keys ignored). It
// does not validate the members it skips.
func ParseAccepted(p []byte) (Accepted, bool) {
	var a Accepted
	ok := true
	complete := jsonscan.Members(p, func(k, v []byte) bool {
		var dst *string
		switch key := jsonscan.Key(k); {
		case bytes.EqualFold(key, []byte("request_id")):
			dst = &a.RequestID
		case bytes.EqualFold(key, []byte("worker")):
			dst = &a.Worker
		case bytes.EqualFold(key, []byte("cancel")):
			dst = &a.Cancel
		default:
			return true
		}
		if len(v) >= 2 && v[0] == '"' && bytes.IndexByte(v, '\\') < 0 {
			*dst = string(v[1 : len(v)-1])
			return true
		}
		if string(v) == "null" {
			return true
		}
		ok = json.Unmarshal(v, dst) == nil
		return ok
	})
	return a, ok && complete
}
