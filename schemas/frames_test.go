package schemas

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		typ     FrameType
		seq     uint64
		payload string
	}{
		{FrameAccepted, 1, `{"worker":"w1","cancel":"tokenbus.v1.cancel.w1"}`},
		{FrameChunk, 2, "{\"a\":1}\n{\"b\":2}"},
		{FrameKeepalive, 3, ""},
		{FrameDone, 18446744073709551615, `{"usage":{}}`},
		{FrameQueued, 0, `{"position":3}`},
		{FrameError, 0, `{"status":503}`},
	}
	for _, tt := range tests {
		b := AppendFrame(nil, tt.typ, tt.seq, []byte(tt.payload))
		f, err := ParseFrame(b)
		if err != nil {
			t.Fatalf("%s: %v", tt.typ, err)
		}
		if f.Type != tt.typ || f.Seq != tt.seq || string(f.Payload) != tt.payload {
			t.Errorf("round trip %s %d %q: got %+v", tt.typ, tt.seq, tt.payload, f)
		}
	}
}

func TestParseFrameRejects(t *testing.T) {
	for _, bad := range []string{"", "chunk", "chunk 1", "chunk x\n", "bogus 1\n{}", " 1\n", "chunk -1\n", "chunk 99999999999999999999\n"} {
		if _, err := ParseFrame([]byte(bad)); err == nil {
			t.Errorf("ParseFrame(%q) succeeded", bad)
		}
	}
}

func TestForEachLine(t *testing.T) {
	var got []string
	_ = ForEachLine([]byte("a\n\nb\nc"), func(l []byte) error { got = append(got, string(l)); return nil })
	if want := []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("got %q", got)
	}
}

func TestErrorShapes(t *testing.T) {
	tests := []struct {
		err    *Error
		status int
		typ    string
	}{
		{ErrMissingParam.At("messages", "messages"), 400, TypeInvalidRequest},
		{ErrModelNotFound.New("x"), 404, TypeInvalidRequest},
		{ErrQueueFull.New("m"), 503, TypeOverloaded},
		{ErrInternal.New("boom"), 500, TypeServer},
	}
	for _, tt := range tests {
		if tt.err.Status != tt.status {
			t.Errorf("%v: status %d", tt.err, tt.err.Status)
		}
		var body map[string]map[string]any
		if err := json.Unmarshal(tt.err.JSON(), &body); err != nil {
			t.Fatal(err)
		}
		e := body["error"]
		for _, k := range []string{"message", "type", "param", "code"} {
			if _, ok := e[k]; !ok {
				t.Errorf("%v: key %q missing from %s", tt.err, k, tt.err.JSON())
			}
		}
		if e["type"] != tt.typ {
			t.Errorf("type %v, want %s", e["type"], tt.typ)
		}
		back := ParseErrorPayload(tt.err.Payload())
		if back.Status != tt.status || back.Body.Message != tt.err.Body.Message || back.RetryAfter != tt.err.RetryAfter {
			t.Errorf("payload round trip: %+v", back)
		}
	}
	if e := ParseErrorPayload([]byte("nope")); e.Status != http.StatusBadGateway {
		t.Errorf("malformed payload: %+v", e)
	}
}

func FuzzParseFrame(f *testing.F) {
	f.Add([]byte("chunk 1\n{}"))
	f.Add([]byte("done 7\n"))
	f.Add([]byte("queued 0\n{\"position\":1}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := ParseFrame(data)
		if err != nil {
			return
		}
		again := AppendFrame(nil, fr.Type, fr.Seq, fr.Payload)
		fr2, err := ParseFrame(again)
		if err != nil || fr2.Type != fr.Type || fr2.Seq != fr.Seq || !bytes.Equal(fr2.Payload, fr.Payload) {
			t.Fatalf("re-encoding %q gave %q", data, again)
		}
	})
}

func BenchmarkParseFrame(b *testing.B) {
	msg := AppendFrame(nil, FrameChunk, 12345, []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null}]}`))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseFrame(msg); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendFrame(b *testing.B) {
	payload := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null}]}`)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendFrame(buf[:0], FrameChunk, 12345, payload)
	}
}
