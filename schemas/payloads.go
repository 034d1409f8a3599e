package schemas

import (
	"encoding/json"
	"strconv"
)

// The payloads every request carries (accepted frame, done notice, usage)
// are written and read without reflection: encoding/json cost several
// percent of a worker's and a gateway's CPU per request. The readers use the
// one JSON scanner (json.go): keys match exactly, the last of a repeated key
// wins, unknown keys are skipped, and they agree with an exact-key decoding
// by encoding/json (fuzzed); a repeated known key makes the payload invalid,
// as a repeated field does for ReadRequest.

// AppendAccepted appends the JSON of a, the same object json.Marshal writes.
func AppendAccepted(b []byte, a Accepted) []byte {
	b = append(b, `{"request_id":`...)
	b = appendJSONString(b, a.RequestID)
	b = append(b, `,"worker":`...)
	b = appendJSONString(b, a.Worker)
	b = append(b, `,"cancel":`...)
	b = appendJSONString(b, a.Cancel)
	if a.CancelToken != "" {
		b = append(b, `,"cancel_token":`...)
		b = appendJSONString(b, a.CancelToken)
	}
	return append(b, '}')
}

// ParseAccepted reads an accepted payload.
func ParseAccepted(p []byte) (Accepted, bool) {
	var a Accepted
	ok := readPayload(p, func(s *scanner, key []byte, once func(int) bool) bool {
		switch {
		case keyIs(key, "request_id"):
			return once(0) && s.readString(&a.RequestID)
		case keyIs(key, "worker"):
			return once(1) && s.readString(&a.Worker)
		case keyIs(key, "cancel"):
			return once(2) && s.readString(&a.Cancel)
		case keyIs(key, "cancel_token"):
			return once(3) && s.readString(&a.CancelToken)
		}
		return s.skip(1)
	})
	return a, ok
}

// AppendDoneNotice appends the JSON of n, the same object json.Marshal writes.
func AppendDoneNotice(b []byte, n DoneNotice) []byte {
	b = append(b, `{"worker":`...)
	b = appendJSONString(b, n.Worker)
	b = append(b, `,"request_id":`...)
	b = appendJSONString(b, n.RequestID)
	b = append(b, `,"running":`...)
	b = strconv.AppendInt(b, int64(n.Running), 10)
	if n.Failed {
		b = append(b, `,"failed":true`...)
	}
	if n.PromptTokens > 0 {
		b = append(b, `,"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(n.PromptTokens), 10)
	}
	if n.CompletionTokens > 0 {
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(n.CompletionTokens), 10)
	}
	if n.PrefillMS > 0 {
		b = append(b, `,"prefill_ms":`...)
		b = strconv.AppendFloat(b, n.PrefillMS, 'g', -1, 64)
	}
	if n.HeldMS > 0 {
		b = append(b, `,"held_ms":`...)
		b = strconv.AppendFloat(b, n.HeldMS, 'g', -1, 64)
	}
	return append(b, '}')
}

// ParseDoneNotice reads a done notice.
func ParseDoneNotice(p []byte) (DoneNotice, bool) {
	var n DoneNotice
	ok := readPayload(p, func(s *scanner, key []byte, once func(int) bool) bool {
		switch {
		case keyIs(key, "worker"):
			return once(0) && s.readString(&n.Worker)
		case keyIs(key, "request_id"):
			return once(1) && s.readString(&n.RequestID)
		case keyIs(key, "running"):
			return once(2) && s.readInt(&n.Running)
		case keyIs(key, "failed"):
			return once(3) && s.readBool(&n.Failed)
		case keyIs(key, "prompt_tokens"):
			return once(4) && s.readInt(&n.PromptTokens)
		case keyIs(key, "completion_tokens"):
			return once(5) && s.readInt(&n.CompletionTokens)
		case keyIs(key, "prefill_ms"):
			return once(6) && s.readFloat(&n.PrefillMS)
		case keyIs(key, "held_ms"):
			return once(7) && s.readFloat(&n.HeldMS)
		}
		return s.skip(1)
	})
	return n, ok
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
	s := scanner{b: p}
	var u Usage
	ok := s.readUsage(&u, 0) && s.end()
	return u, ok
}

// readUsage reads a usage object (null leaves u) at depth containers deep.
func (s *scanner) readUsage(u *Usage, depth int) bool {
	if s.null() {
		return true
	}
	var seen seenKeys
	return s.object(func(key []byte) bool {
		switch {
		case keyIs(key, "prompt_tokens"):
			return seen.once(0) && s.readInt(&u.PromptTokens)
		case keyIs(key, "completion_tokens"):
			return seen.once(1) && s.readInt(&u.CompletionTokens)
		case keyIs(key, "total_tokens"):
			return seen.once(2) && s.readInt(&u.TotalTokens)
		case keyIs(key, "prompt_tokens_details"):
			if !seen.once(3) {
				return false
			}
			if s.null() {
				u.PromptTokensDetails = nil
				return true
			}
			d := &TokenDetails{}
			u.PromptTokensDetails = d
			var seenDetail seenKeys
			return s.object(func(key []byte) bool {
				if keyIs(key, "cached_tokens") {
					return seenDetail.once(0) && s.readInt(&d.CachedTokens)
				}
				return s.skip(depth + 2)
			})
		}
		return s.skip(depth + 1)
	})
}

// AppendUsageRecord appends the JSON of r, the same object json.Marshal
// writes.
func AppendUsageRecord(b []byte, r *UsageRecord) []byte {
	b = append(b, `{"request_id":`...)
	b = appendJSONString(b, r.RequestID)
	b = append(b, `,"key_id":`...)
	b = appendJSONString(b, r.KeyID)
	if r.Tenant != "" {
		b = append(b, `,"tenant":`...)
		b = appendJSONString(b, r.Tenant)
	}
	b = append(b, `,"model":`...)
	b = appendJSONString(b, r.Model)
	b = append(b, `,"usage":`...)
	b = AppendUsage(b, &r.Usage)
	if r.Estimated {
		b = append(b, `,"estimated":true`...)
	}
	if r.Reserved != 0 {
		b = append(b, `,"reserved":`...)
		b = strconv.AppendInt(b, int64(r.Reserved), 10)
	}
	if r.Window != 0 {
		b = append(b, `,"window":`...)
		b = strconv.AppendInt(b, r.Window, 10)
	}
	return append(b, '}')
}

// ParseUsageRecord reads a usage record.
func ParseUsageRecord(p []byte) (UsageRecord, bool) {
	var r UsageRecord
	ok := readPayload(p, func(s *scanner, key []byte, once func(int) bool) bool {
		switch {
		case keyIs(key, "request_id"):
			return once(0) && s.readString(&r.RequestID)
		case keyIs(key, "key_id"):
			return once(1) && s.readString(&r.KeyID)
		case keyIs(key, "tenant"):
			return once(2) && s.readString(&r.Tenant)
		case keyIs(key, "model"):
			return once(3) && s.readString(&r.Model)
		case keyIs(key, "usage"):
			return once(4) && s.readUsage(&r.Usage, 1)
		case keyIs(key, "estimated"):
			return once(5) && s.readBool(&r.Estimated)
		case keyIs(key, "reserved"):
			return once(6) && s.readInt(&r.Reserved)
		case keyIs(key, "window"):
			w := 0 // int is 64 bits wherever tokenbus is built
			ok := once(7) && s.readInt(&w)
			r.Window = int64(w) // null leaves 0, the field's first value (the key comes once)
			return ok
		}
		return s.skip(1)
	})
	return r, ok
}

// UsageOf reads the top-level usage member of a chunk, a response or a done
// payload (nil when there is none, or it is null or malformed); the scan skips
// the rest (choices, a whole completion) without decoding it.
func UsageOf(b []byte) *Usage {
	s := scanner{b: b}
	var u *Usage
	ok := s.object(func(key []byte) bool {
		if !keyIs(key, "usage") {
			return s.skip(1)
		}
		if u != nil || s.null() {
			u = nil
			return false // null, or repeated: no usage to trust
		}
		u = &Usage{}
		return s.readUsage(u, 1)
	})
	if !ok || !s.end() {
		return nil
	}
	return u
}

// readPayload reads an object (or null) whose members fn reads; fn calls
// once(i) for its i-th known key, which fails the second time.
func readPayload(p []byte, fn func(s *scanner, key []byte, once func(int) bool) bool) bool {
	s := scanner{b: p}
	if s.null() {
		return s.end()
	}
	var seen seenKeys
	once := seen.once
	return s.object(func(key []byte) bool { return fn(&s, key, once) }) && s.end()
}

// seenKeys records the known keys of an object read so far.
type seenKeys uint32

// once marks key i seen and reports whether it was not already.
func (k *seenKeys) once(i int) bool {
	if *k&(1<<i) != 0 {
		return false
	}
	*k |= 1 << i
	return true
}

// readString reads a string, or null (which leaves dst).
func (s *scanner) readString(dst *string) bool {
	switch s.peek() {
	case 'n':
		return s.lit("null")
	case '"':
		raw, ok := s.rawString()
		if ok {
			*dst = jsonString(raw)
		}
		return ok
	}
	return false
}

// readInt reads an integer as encoding/json reads one into an int, or null
// (which leaves dst).
func (s *scanner) readInt(dst *int) bool {
	if s.null() {
		return true
	}
	text, ok := s.number()
	if !ok {
		return false
	}
	n, ok := parseInt(text)
	if ok {
		*dst = n
	}
	return ok
}

// readFloat reads a number as encoding/json reads one into a float64, or
// null (which leaves dst).
func (s *scanner) readFloat(dst *float64) bool {
	if s.null() {
		return true
	}
	text, ok := s.number()
	if !ok {
		return false
	}
	f, err := strconv.ParseFloat(string(text), 64)
	if err != nil {
		return false
	}
	*dst = f
	return true
}

// readBool reads true or false, or null (which leaves dst).
func (s *scanner) readBool(dst *bool) bool {
	switch {
	case s.null():
		return true
	case s.lit("true"):
		*dst = true
		return true
	case s.lit("false"):
		*dst = false
		return true
	}
	return false
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
