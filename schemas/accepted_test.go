package schemas

import (
	"encoding/json"
	"testing"
)

func TestAppendAccepted(t *testing.T) {
	for _, a := range []Accepted{
		{RequestID: "req-1", Worker: "w-1", Cancel: "tokenbus.v1.cancel.w-1"},
		{RequestID: "a\"b\\c<d>&é\n", Worker: "", Cancel: "x"},
	} {
		want, _ := json.Marshal(a)
		if got := AppendAccepted(nil, a); string(got) != string(want) {
			t.Errorf("got %s want %s", got, want)
		}
	}
}

// ParseAccepted agrees with encoding/json on every input (see the fuzz test).
func TestParseAccepted(t *testing.T) {
	for _, in := range []string{
		`{"request_id":"req-1","worker":"w-1","cancel":"c"}`,
		`{"Worker":"W","cancel":"c\u0041","extra":[1,{"worker":"no"}],"worker":"last"}`,
		`{"request_id":null}`,
		`{"request_id":5}`,
		`[]`,
		` { } `,
	} {
		checkAccepted(t, []byte(in))
	}
}

// On valid JSON, ParseAccepted and encoding/json agree; on invalid JSON the
// scan may read what it can (it does not validate values it skips).
func checkAccepted(t *testing.T, in []byte) {
	t.Helper()
	if !json.Valid(in) {
		_, _ = ParseAccepted(in)
		return
	}
	var want Accepted
	werr := json.Unmarshal(in, &want)
	got, ok := ParseAccepted(in)
	if ok != (werr == nil) || ok && got != want {
		t.Errorf("%q: got %+v %v, encoding/json %+v %v", in, got, ok, want, werr)
	}
}

func FuzzParseAccepted(f *testing.F) {
	f.Add([]byte(`{"request_id":"req-1","worker":"w-1","cancel":"c"}`))
	f.Add([]byte(`{"WORKER":"a\"b","cancel":null}`))
	f.Fuzz(func(t *testing.T, in []byte) { checkAccepted(t, in) })
}
