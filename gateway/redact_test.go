package gateway

import (
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

func TestRedactor(t *testing.T) {
	r := NewRedactor("admin-secret-token", "", "short")
	for in, want := range map[string]string{
		"llama-8b":      "llama-8b",
		"tb-small":      "tb-small", // a short name, no key
		"tb-SEC***wxyz": "tb-SEC***wxyz",
		"tb-8KnEpMW92qRP4tlTGqy1gLtY_JCabi2i1huyt": "tb-***",
		"/v1/models/tb-8KnEpMW92qRP4tlTGqy1g/x":    "/v1/models/tb-***", // "/" may be base64: redacted too
		"a tb-AAAAAAAAAAAAAAAAAAAA b tb-x":         "a tb-*** b tb-x",
		"Bearer admin-secret-token!":               "Bearer ***!",
		"a short word":                             "a short word", // too short a secret is ignored
	} {
		if got := r.String(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
	var none *Redactor // key shapes only
	if got := none.String("x tb-AAAAAAAAAAAAAAAAAAAA admin-secret-token"); got != "x tb-*** admin-secret-token" {
		t.Errorf("nil redactor: %q", got)
	}
	// Catalogue errors are shared: a redacted error is a copy.
	e := schemas.ErrUnknownParam.At("tb-AAAAAAAAAAAAAAAAAAAA", "tb-AAAAAAAAAAAAAAAAAAAA")
	got := r.Error(e)
	if got == e || *got.Body.Param != "tb-***" || got.Body.Message == e.Body.Message {
		t.Errorf("redacted %+v from %+v", got.Body, e.Body)
	}
	if clean := schemas.ErrMissingKey.New(); r.Error(clean) != clean {
		t.Error("a clean error was copied")
	}
}
