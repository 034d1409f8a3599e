package httpengine

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net/http"
)

// Request id formats (Config.RequestID): how the request's id reaches the
// engine in X-Request-Id. vLLM takes any string (it becomes the base of its
// own id); other servers are stricter (one answers an empty 400 to any
// X-Request-Id that is not a UUID), so the openai engine sends a UUID.
const (
	RequestIDRaw  = "raw"  // the id as is
	RequestIDUUID = "uuid" // a UUID: the id itself if it is one, else RequestUUID(id)
	RequestIDOff  = "off"  // no X-Request-Id
)

// checkRequestID says what is wrong with a Config.RequestID value.
func checkRequestID(v string) error {
	switch v {
	case RequestIDRaw, RequestIDUUID, RequestIDOff:
		return nil
	}
	return fmt.Errorf("request id format %q: want %s, %s or %s", v, RequestIDRaw, RequestIDUUID, RequestIDOff)
}

// setRequestID sets X-Request-Id on h for id, in format f.
func setRequestID(h http.Header, f, id string) {
	if id == "" || f == RequestIDOff {
		return
	}
	if f == RequestIDUUID && !isUUID(id) {
		id = RequestUUID(id)
	}
	h.Set("X-Request-Id", id)
}

// RequestUUID is the UUID the engine gets for request id id (format
// "uuid"): a name-based UUID (version 5's layout) of the id's SHA-1, the
// same for the same id, so that an engine's log can be matched to
// tokenbus's.
func RequestUUID(id string) string {
	sum := sha1.Sum([]byte(id))
	u := sum[:16]
	u[6] = u[6]&0x0f | 0x50 // version 5
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:16])
	return string(b[:])
}

// isUUID reports whether s is a UUID in its 36-character text form.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
		default:
			return false
		}
	}
	return true
}
