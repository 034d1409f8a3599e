package schemas

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
)

func TestMuxRoundTrip(t *testing.T) {
	frames := [][]byte{
		AppendFrame(nil, FrameChunk, 2, []byte("{\"a\":1}\n{\"b\":2}")),
		AppendFrame(nil, FrameKeepalive, 3, nil),
		AppendFrame(nil, FrameDone, 9, []byte(`{"usage":{}}`)),
	}
	var body []byte
	for i, f := range frames {
		body = AppendMuxEntry(body, fmt.Sprintf("tok%d", i), f)
	}
	var got [][]byte
	var toks []string
	if err := ForEachMuxEntry(body, func(tok, frame []byte) {
		toks = append(toks, string(tok))
		got = append(got, frame)
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || toks[2] != "tok2" {
		t.Fatalf("got %q", toks)
	}
	for i := range frames {
		if !bytes.Equal(got[i], frames[i]) {
			t.Fatalf("entry %d: %q", i, got[i])
		}
	}
	for _, bad := range []string{"x", "tok 5\nabc", " 1\na", "tok x\na", "tok 1"} {
		if err := ForEachMuxEntry([]byte(bad), func(_, _ []byte) {}); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestSplitReply(t *testing.T) {
	tests := []struct{ in, prefix, tok string }{
		{"_INBOX.abc.xyz", "_INBOX.abc.", "xyz"},
		{"a.b", "a.", "b"},
	}
	for _, tt := range tests {
		p, tok, ok := SplitReply(tt.in)
		if !ok || p != tt.prefix || tok != tt.tok {
			t.Errorf("SplitReply(%q) = %q %q %v", tt.in, p, tok, ok)
		}
	}
	for _, bad := range []string{"nodot", "trailing.", ".leading"} {
		if _, _, ok := SplitReply(bad); ok {
			t.Errorf("SplitReply(%q) ok", bad)
		}
	}
}

func FuzzForEachMuxEntry(f *testing.F) {
	f.Add(AppendMuxEntry(nil, "t", []byte("chunk 1\n{}")))
	f.Add([]byte("t 3\nabct 0\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var again []byte
		if ForEachMuxEntry(body, func(tok, frame []byte) { again = AppendMuxEntry(again, string(tok), frame) }) != nil {
			return
		}
		type entry struct{ tok, frame string }
		var e1, e2 []entry
		_ = ForEachMuxEntry(body, func(tok, frame []byte) { e1 = append(e1, entry{string(tok), string(frame)}) })
		if err := ForEachMuxEntry(again, func(tok, frame []byte) { e2 = append(e2, entry{string(tok), string(frame)}) }); err != nil || !slices.Equal(e1, e2) {
			t.Fatalf("re-encoding %q gave %q (%v)", body, again, err)
		}
	})
}
