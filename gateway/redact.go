package gateway

import (
	"strings"

	"github.com/tokenbus/tokenbus/schemas"
)

// What leaves the process about a request (error bodies, log lines) never
// carries a secret: header values are never echoed or logged, fasthttp's
// parse errors (which quote the raw request) are replaced by a fixed reason,
// and the few client strings an OpenAI error quotes back (a model name, a
// parameter name, a path) pass through a Redactor first. That covers a key
// pasted into the wrong field, and an upstream engine that quotes the
// Authorization header it was sent.

// keyPrefix starts every tokenbus API key (registry.SecretPrefix; gateway
// does not import registry).
const keyPrefix = "tb-"

// minKeyTail is how many key characters after keyPrefix make a string
// look like a key: real ones have 43, and "tb-" followed by a short word
// (a model name like "tb-small") is left alone.
const minKeyTail = 16

// minSecret is the shortest configured secret a Redactor looks for: shorter
// ones would redact ordinary words.
const minSecret = 8

// Redactor replaces secrets in text: anything shaped like a tokenbus API
// key, and the process's own secrets (admin token, NATS password or token,
// engine keys) given to NewRedactor. The zero value redacts keys only.
type Redactor struct {
	secrets []string
}

// NewRedactor redacts the given secrets (empty and very short ones are
// ignored) besides key-shaped strings.
func NewRedactor(secrets ...string) *Redactor {
	r := &Redactor{}
	for _, s := range secrets {
		if len(s) >= minSecret {
			r.secrets = append(r.secrets, s)
		}
	}
	return r
}

// String is s with every secret replaced by "***" (a key keeps its
// prefix: "tb-***").
func (r *Redactor) String(s string) string {
	if r != nil {
		for _, sec := range r.secrets {
			if strings.Contains(s, sec) {
				s = strings.ReplaceAll(s, sec, "***")
			}
		}
	}
	if !strings.Contains(s, keyPrefix) {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, keyPrefix)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		j := i + len(keyPrefix)
		for j < len(s) && isKeyChar(s[j]) {
			j++
		}
		b.WriteString(s[:i+len(keyPrefix)])
		if j-i-len(keyPrefix) >= minKeyTail {
			b.WriteString("***")
		} else {
			b.WriteString(s[i+len(keyPrefix) : j])
		}
		s = s[j:]
	}
}

// isKeyChar: a key's tail is unpadded URL-safe base64; any other character
// that is no separator is counted too, so that a key with a character
// changed still reads as one.
func isKeyChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_',
		c == '+', c == '/', c == '=', c == '.', c == '~', c >= 0x80:
		return true
	}
	return false
}

// Error returns e, or a copy with its message and param redacted when they
// held a secret (catalogue errors are shared values: never changed).
func (r *Redactor) Error(e *schemas.Error) *schemas.Error {
	msg := r.String(e.Body.Message)
	var param *string
	if e.Body.Param != nil {
		if p := r.String(*e.Body.Param); p != *e.Body.Param {
			param = &p
		}
	}
	if msg == e.Body.Message && param == nil {
		return e
	}
	c := *e
	c.Body.Message = msg
	if param != nil {
		c.Body.Param = param
	}
	return &c
}

// LogMethod is the request's method for a log line or an error message: one
// of the standard methods, else "-" (a request line is client text, and an
// unknown "method" may be anything).
func LogMethod(m string) string {
	switch m {
	case "GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE":
		return m
	}
	return "-"
}
