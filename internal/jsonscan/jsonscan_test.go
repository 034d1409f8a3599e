package jsonscan

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestMembers(t *testing.T) {
	tests := []struct {
		in   string
		want string // key=value;...
		ok   bool
	}{
		{`{}`, "", true},
		{` { "a" : 1 , "b":"x,}" ,"c":{"d":[1,{"e":"}"}]},"f":[],"g":true} `, `a=1;b="x,}";c={"d":[1,{"e":"}"}]};f=[];g=true;`, true},
		{`{"k\"ey":null}`, `k\"ey=null;`, true},
		{`{"a":1,}`, "a=1;", false},
		{`{"a":1 "b":2}`, "a=1;", false},
		{`{"a":"unterminated}`, "", false},
		{`[1,2]`, "", false},
		{`{"a":}`, "", false},
	}
	for _, tt := range tests {
		var got strings.Builder
		ok := Members([]byte(tt.in), func(k, v []byte) bool {
			got.WriteString(string(k) + "=" + string(v) + ";")
			return true
		})
		if got.String() != tt.want || ok != tt.ok {
			t.Errorf("Members(%s) = %q, %v; want %q, %v", tt.in, got.String(), ok, tt.want, tt.ok)
		}
	}
	if string(Key([]byte(`a\u0062`))) != "ab" {
		t.Errorf("Key did not decode escapes")
	}
}

// On valid JSON objects, Members sees exactly the members encoding/json sees.
func FuzzMembers(f *testing.F) {
	f.Add([]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi \"there\""}]}`))
	f.Add([]byte(`{"a":{"b":[1,2,{"c":"]}"}]},"d":-1.5e3}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) != nil {
			Members(b, func(_, _ []byte) bool { return true }) // must not panic
			return
		}
		seen := map[string]string{}
		if !Members(b, func(k, v []byte) bool { seen[string(Key(k))] = string(v); return true }) {
			t.Fatalf("valid object %s not scanned to its end", b)
		}
		rewritten := false
		for k, v := range m {
			if strings.ContainsRune(k, utf8.RuneError) {
				rewritten = true
				continue // encoding/json rewrites invalid UTF-8 in keys; the scanner keeps bytes
			}
			var a, c any
			if json.Unmarshal([]byte(seen[k]), &a) != nil || json.Unmarshal(v, &c) != nil || !reflect.DeepEqual(a, c) {
				t.Fatalf("%s: key %q: value %q vs %q", b, k, seen[k], v)
			}
		}
		if !rewritten && len(seen) != len(m) {
			t.Fatalf("%s: %d members scanned, encoding/json has %d", b, len(seen), len(m))
		}
	})
}
