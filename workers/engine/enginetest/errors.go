package enginetest

import (
	"context"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

// A body that is wrong is a 400 *schemas.Error naming the field, before any
// chunk. The worker reads every body before its engine does, so these come
// with no View, as from a caller that did not: the engine reads the body
// itself, with schemas.ReadRequest. A limit of the engine's own (the
// context length) is a 400 as well, with the View.
func testBadRequest(t *testing.T, h *Harness) {
	e := start(t, h)
	chat, cmpl, m := schemas.KindChat, schemas.KindCompletion, h.Model
	for _, tc := range []struct {
		name  string
		kind  schemas.Kind
		body  string
		param string
	}{
		{"malformed JSON", chat, `{"model":"` + m + `","messages":`, ""},
		{"not an object", cmpl, `["prompt"]`, ""},
		{"n below 1", chat, body(chat, m, `"stream":true,"n":0`), "n"},
		{"max_tokens not an integer", cmpl, body(cmpl, m, `"max_tokens":"many"`), "max_tokens"},
		{"stream not a boolean", chat, body(chat, m, `"stream":"yes"`), "stream"},
		{"a repeated key", cmpl, body(cmpl, m, `"stream":true,"max_tokens":5,"max_tokens":300`), "max_tokens"},
		{"stream_options without stream", chat, body(chat, m, `"stream_options":{"include_usage":true}`), "stream_options"},
		{"no messages", chat, `{"model":"` + m + `","stream":true}`, "messages"},
		{"no prompt", cmpl, `{"model":"` + m + `"}`, "prompt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSink()
			_, err := generate(t.Context(), e, rawRequest(tc.kind, m, tc.body), s)
			if se := asError(t, err, 400); param(se) != tc.param {
				t.Errorf("param %q, want %q: %v", param(se), tc.param, se)
			}
			if n := s.Calls(); n != 0 {
				t.Errorf("%d Sink.Chunks calls for a bad request", n)
			}
		})
	}
	t.Run("over the context length", func(t *testing.T) {
		if why, lacks := h.Lacks[ContextLimit]; lacks {
			t.Skipf("the engine lacks %s: %s", ContextLimit, why)
		}
		// Bounded: a server that does not check would generate for ever.
		ctx, cancel := context.WithTimeout(t.Context(), waitLong)
		defer cancel()
		s := newSink()
		_, err := generate(ctx, e, request(t, chat, m, `"stream":true,"max_tokens":100000000`), s)
		asError(t, err, 400)
		if n := s.Calls(); n != 0 {
			t.Errorf("%d Sink.Chunks calls for a bad request", n)
		}
	})
}

// A model the engine does not serve is a 404 naming it, streamed or not.
func testUnknownModel(t *testing.T, h *Harness) {
	e := start(t, h)
	const unknown = "enginetest-no-such-model"
	for _, stream := range []string{`"stream":true`, `"stream":false`} {
		t.Run(stream, func(t *testing.T) {
			s := newSink()
			_, err := generate(t.Context(), e, request(t, schemas.KindChat, unknown, stream), s)
			if se := asError(t, err, 404); !strings.Contains(se.Body.Message, unknown) {
				t.Errorf("the 404 does not name the model: %v", se)
			}
			if n := s.Calls(); n != 0 {
				t.Errorf("%d Sink.Chunks calls for an unknown model", n)
			}
		})
	}
}
