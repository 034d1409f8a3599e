package schemas

import (
	"encoding/json"
	"testing"
)

func TestPrefixCachedHeader(t *testing.T) {
	if v := FormatPrefixCached(640, 1000); v != "640/1000" {
		t.Fatalf("FormatPrefixCached = %q", v)
	}
	for _, tc := range []struct {
		v             string
		cached, total int
		ok            bool
	}{
		{"640/1000", 640, 1000, true},
		{"0/7", 0, 7, true},
		{"7/7", 7, 7, true},
		{"8/7", 0, 0, false}, // more cached than there is
		{"0/0", 0, 0, false},
		{"-1/5", 0, 0, false},
		{"5", 0, 0, false},
		{"a/5", 0, 0, false},
		{"", 0, 0, false},
	} {
		c, tot, ok := ParsePrefixCached(tc.v)
		if c != tc.cached || tot != tc.total || ok != tc.ok {
			t.Errorf("ParsePrefixCached(%q) = %d, %d, %v", tc.v, c, tot, ok)
		}
	}
}

func TestReadCtlReply(t *testing.T) {
	refused, _ := json.Marshal(CtlReply{Error: ErrBadHeader.New("Tb-Model")}) // as a worker sends it
	for _, tc := range []struct {
		in, code string // code "" for nil
	}{
		{`{"ok":true}`, ""},
		{string(refused), *ErrBadHeader.New("x").Body.Code},
		{`{"ok":false}`, "internal_error"},
		{`not json`, "bad_worker_reply"},
	} {
		e := ReadCtlReply([]byte(tc.in), "w1", "load")
		switch {
		case tc.code == "" && e != nil:
			t.Errorf("%s: %v, want nil", tc.in, e)
		case tc.code != "" && (e == nil || e.Body.Code == nil || *e.Body.Code != tc.code):
			t.Errorf("%s: %+v, want code %s", tc.in, e, tc.code)
		}
	}
}
