package schemas

import (
	"testing"
)

func TestTenantSubjects(t *testing.T) {
	for _, tc := range []struct {
		subject, key, model string
		ok                  bool
	}{
		{TenantReqSubject("key_1", "meta-llama/Llama-3.1-8B"), "key_1", "meta-llama/Llama-3.1-8B", true},
		{"tokenbus.v1.treq.key_1.m", "key_1", "m", true},
		{"tokenbus.v1.treq.key_1", "", "", false},
		{"tokenbus.v1.treq..m", "", "", false},
		{"tokenbus.v1.treq.key_1.a.b", "", "", false}, // a model token has no '.'
		{"tokenbus.v1.req.m", "", "", false},
	} {
		k, m, ok := ParseTenantReqSubject(tc.subject)
		if ok != tc.ok || ok && (k != tc.key || m != tc.model) {
			t.Errorf("%s: %q %q %v", tc.subject, k, m, ok)
		}
	}
	if got := TenantInbox("acme.eu"); got != "_INBOX.acme~2eeu" {
		t.Errorf("TenantInbox %q", got)
	}
}

func TestDispatcherOnly(t *testing.T) {
	for _, tc := range []struct {
		name         string
		tenant, want bool
	}{
		{HdrKeyID, false, true}, {"tb-key-id", false, true}, {"TB-CANCEL-TOKEN", false, true},
		{HdrAdapterPath, false, true}, {HdrAttempt, false, true}, {HdrReserved, false, true},
		{HdrTenant, false, false}, {HdrTenant, true, true}, {"tb-tenant", true, true},
		{HdrModel, true, false}, {HdrRequestID, true, false}, {HdrTrace, true, false}, {"X", true, false},
		{HdrPrefixCached, false, true}, {"tb-prefix-cached", false, true},
		{HdrBand, true, true}, {"TB-BAND", true, true}, {HdrWeight, true, true}, {HdrMaxQueue, true, true},
		{HdrBand, false, false}, {HdrWeight, false, false}, {HdrMaxQueue, false, false},
	} {
		if got := DispatcherOnly(tc.name, tc.tenant); got != tc.want {
			t.Errorf("DispatcherOnly(%q, %v) = %v", tc.name, tc.tenant, got)
		}
	}
}

func TestCancelBody(t *testing.T) {
	tok := NewCancelToken()
	if len(tok) != 2*CancelTokenBytes || tok == NewCancelToken() {
		t.Fatalf("token %q", tok)
	}
	id, got := ParseCancel(CancelBody("r-1", tok))
	if id != "r-1" || got != tok || !CancelTokenMatches(tok, got) || CancelTokenMatches(tok, "") || CancelTokenMatches(tok, tok[1:]) {
		t.Fatalf("%q %q", id, got)
	}
	if id, got := ParseCancel([]byte("r-1")); id != "r-1" || got != "" {
		t.Fatalf("bare id: %q %q", id, got)
	}
}

func TestReadRequestFor(t *testing.T) {
	for _, tc := range []struct {
		body, model, code, bound string
	}{
		{`{"model":"m","prompt":"x"}`, "m", "", `{"model":"m","prompt":"x"}`},
		{`{"model":"m-lora","prompt":"x"}`, "m", "model_mismatch", ""},
		{` { "prompt":"x"}`, "a/b", "", ` {"model":"a/b", "prompt":"x"}`},
		{`{"model":"other","prompt":"x"}`, "", "", `{"model":"other","prompt":"x"}`},
	} {
		r, err := ReadRequestFor(KindCompletion, []byte(tc.body), tc.model)
		switch {
		case tc.code != "":
			if err == nil || err.Body.Code == nil || *err.Body.Code != tc.code {
				t.Errorf("%s for %q: %v, want %s", tc.body, tc.model, err, tc.code)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.body, err)
		case string(r.BoundBody()) != tc.bound:
			t.Errorf("%s: bound body %s, want %s", tc.body, r.BoundBody(), tc.bound)
		}
	}
}
