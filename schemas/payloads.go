package schemas

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/tokenbus/tokenbus/internal/jsonscan"
)

// The payloads every request carries (accepted frame, done notice, usage)
// are written and read without reflection: encoding/json cost several
// percent of a worker's and a gateway's CPU per request. Each reader agrees
// with json.Unmarshal on valid JSON (keys case-insensitive, the last one
// wins, unknown keys ignored; fuzzed); it does not validate members it skips.

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

// ParseAccepted reads an accepted payload.
func ParseAccepted(p []byte) (Accepted, bool) {
	var a Accepted
	ok := true
	complete := jsonscan.Members(p, func(k, v []byte) bool {
		switch key := jsonscan.Key(k); {
		case bytes.EqualFold(key, []byte("request_id")):
			ok = readString(v, &a.RequestID)
		case bytes.EqualFold(key, []byte("worker")):
			ok = readString(v, &a.Worker)
		case bytes.EqualFold(key, []byte("cancel")):
			ok = readString(v, &a.Cancel)
		}
		return ok
	})
	return a, ok && (complete || isNull(p))
}

// AppendDoneNotice appends the JSON of n, the same object json.Marshal writes.
func AppendDoneNotice(b []byte, n DoneNotice) []byte {
	b = append(b, `{"worker":`...)
	b = appendJSONString(b, n.Worker)
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, n.RequestID)
	b = append(b, `,"running":`...)
	b = strconv.AppendInt(b, int64(n.Running), 10)
	return append(b, '}')
}

// ParseDoneNotice reads a done notice.
func ParseDoneNotice(p []byte) (DoneNotice, bool) {
	var n DoneNotice
	ok := true
	complete := jsonscan.Members(p, func(k, v []byte) bool {
		switch key := jsonscan.Key(k); {
		case bytes.EqualFold(key, []byte("worker")):
			ok = readString(v, &n.Worker)
		case bytes.EqualFold(key, []byte("request_id")):
			ok = readString(v, &n.RequestID)
		case bytes.EqualFold(key, []byte("running")):
			ok = readInt(v, &n.Running)
		}
		return ok
	})
	return n, ok && (complete || isNull(p))
}

// AppendUsage appends the JSON of u, the same object json.Marshal writes.
func AppendUsage(b []byte, u *Usage) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.TotalTokens), 10)
	if u.PromptTokensDetails != nil {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(u.PromptTokensDetails.CachedTokens), 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

// AppendDoneInfo appends the done payload of a stream: {"usage":{...}}, as
// json.Marshal writes DoneInfo{Usage: &u}.
func AppendDoneInfo(b []byte, u *Usage) []byte {
	b = append(b, `{"usage":`...)
	return append(AppendUsage(b, u), '}')
}

// ParseUsage reads a usage object.
func ParseUsage(p []byte) (Usage, bool) {
	var u Usage
	ok := true
	complete := jsonscan.Members(p, func(k, v []byte) bool {
		switch key := jsonscan.Key(k); {
		case bytes.EqualFold(key, []byte("prompt_tokens")):
			ok = readInt(v, &u.PromptTokens)
		case bytes.EqualFold(key, []byte("completion_tokens")):
			ok = readInt(v, &u.CompletionTokens)
		case bytes.EqualFold(key, []byte("total_tokens")):
			ok = readInt(v, &u.TotalTokens)
		case bytes.EqualFold(key, []byte("prompt_tokens_details")):
			ok = json.Unmarshal(v, &u.PromptTokensDetails) == nil // rare, and null when there
		}
		return ok
	})
	return u, ok && (complete || isNull(p))
}

// UsageOf reads the top-level usage member of a chunk, a response or a done
// payload (nil when there is none, or it is null or malformed); the scan skips
// the rest (choices, a whole completion) without decoding it.
func UsageOf(b []byte) *Usage {
	var raw []byte
	if !jsonscan.Members(b, func(k, v []byte) bool {
		if bytes.EqualFold(jsonscan.Key(k), []byte("usage")) {
			raw = v // the last one wins, as in encoding/json
		}
		return true
	}) || raw == nil || isNull(raw) {
		return nil
	}
	u, ok := ParseUsage(raw)
	if !ok {
		return nil
	}
	return &u
}

// readString sets *dst from a JSON value as json.Unmarshal would (null
// leaves it); ASCII strings without escapes are taken as they are.
func readString(v []byte, dst *string) bool {
	if len(v) >= 2 && v[0] == '"' && plainASCII(v) {
		*dst = string(v[1 : len(v)-1])
		return true
	}
	if string(v) == "null" {
		return true
	}
	return json.Unmarshal(v, dst) == nil
}

// isNull: a JSON null, which json.Unmarshal takes as "nothing to set".
func isNull(p []byte) bool { return string(bytes.TrimSpace(p)) == "null" }

func plainASCII(v []byte) bool {
	for _, c := range v {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}

// readInt sets *dst from a JSON value as json.Unmarshal would (null leaves
// it; a fraction, an exponent or an overflow is an error).
func readInt(v []byte, dst *int) bool {
	if string(v) == "null" {
		return true
	}
	n, err := strconv.ParseInt(string(v), 10, strconv.IntSize)
	if err != nil {
		return false
	}
	*dst = int(n)
	return true
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
