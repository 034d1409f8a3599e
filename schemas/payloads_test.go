package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestAppendPayloads(t *testing.T) {
	for _, a := range []Accepted{
		{RequestID: "req-1", Worker: "w-1", Cancel: "tokenbus.v1.cancel.w-1"},
		{RequestID: "a\"b\\c<d>&é\n", Worker: "", Cancel: "x"},
		{RequestID: "req-2", Worker: "w-1", Cancel: "tokenbus.v1.cancel.w-1", CancelToken: "00ff"},
	} {
		want, _ := json.Marshal(a)
		if got := AppendAccepted(nil, a); string(got) != string(want) {
			t.Errorf("got %s want %s", got, want)
		}
	}
	for _, u := range []Usage{{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7, PromptTokensDetails: &TokenDetails{CachedTokens: 16}}, {TotalTokens: -1}} {
		want, _ := json.Marshal(u)
		if got := AppendUsage(nil, &u); string(got) != string(want) {
			t.Errorf("got %s want %s", got, want)
		}
		want, _ = json.Marshal(DoneInfo{Usage: &u})
		if got := AppendDoneInfo(nil, &u); string(got) != string(want) {
			t.Errorf("got %s want %s", got, want)
		}
	}
	for _, r := range []UsageRecord{
		{RequestID: "req-1", Model: "m", Usage: Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}},
		{RequestID: "r\"<", KeyID: "k1", Tenant: "acme", Model: "m", Estimated: true, Reserved: 64, Window: 29939301,
			Usage: Usage{TotalTokens: 1, PromptTokensDetails: &TokenDetails{CachedTokens: 2}}},
	} {
		want, _ := json.Marshal(r)
		if got := AppendUsageRecord(nil, &r); string(got) != string(want) {
			t.Errorf("got %s want %s", got, want)
		}
	}
	for _, n := range []DoneNotice{{Worker: "w1", RequestID: "r1", Running: 3}, {Worker: "\x01", Running: -1}, {Worker: "w", Failed: true}, {Worker: "w", PromptTokens: 130, CompletionTokens: 7}, {Worker: "w", PrefillMS: 15.25, HeldMS: 650.5}} {
		want, _ := json.Marshal(n)
		if got := AppendDoneNotice(nil, n); string(got) != string(want) {
			t.Errorf("got %s want %s", got, want)
		}
	}
}

// The readers agree with an exact-key decoding by encoding/json on valid JSON
// (see the fuzz tests).
func TestParsePayloads(t *testing.T) {
	for _, in := range []string{
		`{"request_id":"req-1","worker":"w-1","cancel":"c","running":2}`,
		`{"Worker":"W","cancel":"c\u0041","extra":[1,{"worker":"no"}],"worker":"last"}`,
		`{"worker":"a","worker":"b","wor\u006ber":"c"}`,
		`{"prompt_tokens_details":{"cached_tokens":1},"prompt_tokens_details":{"Cached_Tokens":2}}`,
		`{"request_id":null,"running":null}`,
		`{"request_id":5}`,
		`{"running":1.5}`,
		`{"running":1e2}`,
		`{"running":99999999999999999999}`,
		`{"running":-0}`,
		`{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":2}}`,
		`{"prompt_tokens":3,"prompt_tokens_details":null}`,
		`{"prompt_tokens_details":[]}`,
		`[]`,
		` { } `,
		`{"request_id":"r","key_id":"","tenant":"t","model":"m","usage":{"prompt_tokens":1,"total_tokens":3},"estimated":true,"reserved":9,"window":29939301}`,
		`{"request_id":"r","usage":null,"estimated":null,"window":null,"reserved":null}`,
		`{"request_id":"r","estimated":1}`,
		`{"request_id":"r","estimated":"true"}`,
		`{"request_id":"r","estimated":false,"estimated":true}`,
		`{"request_id":"r","usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}`,
		`{"request_id":"r","usage":{"Prompt_Tokens":1,"x":[{}]},"window":1.0}`,
		`{"request_id":"r","usage":[]}`,
		`{"request_id":"r","usage":{"Prompt_Tokens":1,"completion_tokens":3}}`,
	} {
		checkPayloads(t, []byte(in))
	}
}

func checkPayloads(t *testing.T, in []byte) {
	t.Helper()
	if !json.Valid(in) {
		_, _ = ParseAccepted(in)
		_, _ = ParseDoneNotice(in)
		_, _ = ParseUsage(in)
		return
	}
	check := func(name string, got any, ok bool, want any) {
		t.Helper()
		werr := exactDecode(in, want)
		w := reflect.ValueOf(want).Elem().Interface()
		if ok != (werr == nil) || ok && !reflect.DeepEqual(got, w) {
			t.Errorf("%s %q: got %+v %v, encoding/json %+v %v", name, in, got, ok, w, werr)
		}
	}
	a, ok := ParseAccepted(in)
	check("accepted", a, ok, &Accepted{})
	n, ok := ParseDoneNotice(in)
	check("done notice", n, ok, &DoneNotice{})
	u, ok := ParseUsage(in)
	check("usage", u, ok, &Usage{})
	r, ok := ParseUsageRecord(in)
	check("usage record", r, ok, &UsageRecord{})
}

func FuzzParsePayloads(f *testing.F) {
	f.Add([]byte(`{"request_id":"req-1","worker":"w-1","cancel":"c","running":1}`))
	f.Add([]byte(`{"WORKER":"a\"b","cancel":null,"Running":-2}`))
	f.Add([]byte(`{"prompt_tokens":3,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":2}}`))
	f.Add([]byte(`{"request_id":"r","key_id":"k","model":"m","usage":{"prompt_tokens":1},"estimated":true,"reserved":5,"window":1796358070}`))
	f.Fuzz(func(t *testing.T, in []byte) { checkPayloads(t, in) })
}

// exactDecode decodes in into the struct dst points to as encoding/json
// would with exact key matching (a map decoding per level, then each
// field's value), refusing a repeated field.
func exactDecode(in []byte, dst any) error {
	v := reflect.ValueOf(dst).Elem()
	var members map[string]json.RawMessage
	if err := json.Unmarshal(in, &members); err != nil {
		return err
	}
	if members == nil { // null
		return nil
	}
	var root node
	if d := json.NewDecoder(bytes.NewReader(in)); true {
		root, _ = decodeNode(d)
	}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if len(root.get(name)) > 1 {
			return fmt.Errorf("repeated key %q", name)
		}
		raw, ok := members[name]
		if !ok {
			continue
		}
		f := v.Field(i)
		switch {
		case f.Kind() == reflect.Pointer && f.Type().Elem().Kind() == reflect.Struct:
			if string(raw) == "null" {
				f.SetZero()
				continue
			}
			if f.IsNil() {
				f.Set(reflect.New(f.Type().Elem()))
			}
			if err := exactDecode(raw, f.Interface()); err != nil {
				return err
			}
		case f.Kind() == reflect.Struct:
			if string(raw) == "null" {
				continue // null leaves a struct as it is
			}
			if err := exactDecode(raw, f.Addr().Interface()); err != nil {
				return err
			}
		default:
			if err := json.Unmarshal(raw, f.Addr().Interface()); err != nil {
				return err
			}
		}
	}
	return nil
}

// The usage record's writer and reader against encoding/json's, in one run:
// every request writes one record and the usage consumer reads it.
func BenchmarkUsageRecord(b *testing.B) {
	rec := UsageRecord{RequestID: "req-6SctZo23P6IJN3Sd0U81wx", KeyID: "key-1", Model: "llama-8b",
		Usage: Usage{PromptTokens: 128, CompletionTokens: 64, TotalTokens: 192}, Reserved: 256, Window: 29939301}
	line := AppendUsageRecord(nil, &rec)
	b.Run("tokenbus", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = AppendUsageRecord(buf[:0], &rec)
			if _, ok := ParseUsageRecord(line); !ok {
				b.Fatal("not read")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(rec); err != nil {
				b.Fatal(err)
			}
			var r UsageRecord
			if err := json.Unmarshal(line, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
