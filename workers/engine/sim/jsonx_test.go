package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

func encodingJSON(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", `q"uote`, `back\slash`, "nl\n\r\t\b\f", "\x00\x01\x1f\x7f", "<&>",
		"héllo wörld", "\u2028\u2029", "\xff\xfe", "a\xc3", "\xed\xa0\x80", "日本語", "🙂", string([]byte{0xf0, 0x9f})} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := encodingJSON(s)
		if got := appendString([]byte("x"), s); !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Fatalf("appendString(%q) = %s, encoding/json %s", s, got[1:], want)
		}
		if got := appendString(nil, []byte(s)); !bytes.Equal(got, want) {
			t.Fatalf("appendString([]byte %q) = %s, encoding/json %s", s, got, want)
		}
	})
}

// Names that need escaping end up intact in every chunk and response.
func TestEscapedNames(t *testing.T) {
	e := newEngine(t, fastConfig())
	name := "we\"ird\\name\n\u2028é"
	if err := e.LoadAdapter(context.Background(), name, "/x"); err != nil {
		t.Fatal(err)
	}
	id := `id"<>`
	for _, stream := range []bool{false, true} {
		sink := &recSink{}
		body, _ := json.Marshal(map[string]any{"model": name, "messages": []any{map[string]any{"role": "user", "content": "x"}}, "stream": stream, "stop": []string{"\n"}})
		res, err := e.Generate(context.Background(), &engine.Request{ID: id, Kind: schemas.KindChat, Body: body}, sink)
		if err != nil {
			t.Fatal(err)
		}
		objs := sink.lines()
		if !stream {
			objs = []string{string(res.Response)}
		}
		for _, o := range objs {
			var c struct{ ID, Model string }
			if err := json.Unmarshal([]byte(o), &c); err != nil || c.Model != name || c.ID != "chatcmpl-"+id {
				t.Errorf("%s: %v %+v", o, err, c)
			}
		}
	}
}
