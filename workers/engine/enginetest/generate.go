package enginetest

import (
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

// The requests of these behaviours ask for this many tokens, all of them
// (Harness.short), so an engine with real counts reports exactly that many
// per choice.
const tokens = 5

// A stream delivers OpenAI chunk objects through Sink.Chunks, ends with a
// Result that counts completion tokens and has no Response, and sends no
// usage chunk nobody asked for.
func testStream(t *testing.T, h *Harness) {
	e := start(t, h)
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			s := newSink()
			res, err := generate(t.Context(), e, request(t, kind, h.Model, `"stream":true,`+h.short()), s)
			if err != nil {
				t.Fatal(err)
			}
			st := checkStream(t, kind, h.Model, 1, s.Lines())
			if st.usage != nil {
				t.Errorf("a usage chunk without stream_options: %+v", *st.usage)
			}
			if res == nil || res.Response != nil || res.Usage.CompletionTokens <= 0 {
				t.Errorf("result %+v: want usage and no Response", res)
			}
		})
	}
}

// stream_options asks for a last usage chunk (vLLM's rule, which
// schemas.ReadRequest gives every part of tokenbus: present means on unless
// include_usage is false); Result.Usage is that chunk's.
func testIncludeUsage(t *testing.T, h *Harness) {
	e := start(t, h)
	for _, kind := range kinds {
		for _, tc := range []struct {
			options string
			want    bool
		}{
			{`{"include_usage":true}`, true},
			{`{}`, true},
			{`{"include_usage":false}`, false},
		} {
			t.Run(string(kind)+" "+tc.options, func(t *testing.T) {
				s := newSink()
				res, err := generate(t.Context(), e, request(t, kind, h.Model, `"stream":true,"stream_options":`+tc.options+`,`+h.short()), s)
				if err != nil {
					t.Fatal(err)
				}
				st := checkStream(t, kind, h.Model, 1, s.Lines())
				if (st.usage != nil) != tc.want {
					t.Fatalf("usage chunk %v, want one: %v", st.usage, tc.want)
				}
				if tc.want {
					checkUsage(t, *st.usage, tokens)
					if !sameUsage(res.Usage, *st.usage) {
						t.Errorf("Result.Usage %+v, the usage chunk's %+v", res.Usage, *st.usage)
					}
				}
			})
		}
	}
}

// Without a usage chunk the Result still has the real counts.
func testStreamUsage(t *testing.T, h *Harness) {
	e := start(t, h)
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			res, err := generate(t.Context(), e, request(t, kind, h.Model, `"stream":true,`+h.short()), newSink())
			if err != nil {
				t.Fatal(err)
			}
			checkUsage(t, res.Usage, tokens)
		})
	}
}

// stream:false returns the whole response object, never calls the sink, and
// its Result.Usage is the response's.
func testWhole(t *testing.T, h *Harness) {
	e := start(t, h)
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			s := newSink()
			res, err := generate(t.Context(), e, request(t, kind, h.Model, `"stream":false,`+h.short()), s)
			if err != nil {
				t.Fatal(err)
			}
			checkWhole(t, kind, h.Model, 1, res)
			checkUsage(t, res.Usage, tokens)
			if n := s.Calls(); n != 0 {
				t.Errorf("%d Sink.Chunks calls for stream:false", n)
			}
		})
	}
}

// n>1 gives n choices, streamed or whole, each counted.
func testN(t *testing.T, h *Harness) {
	e := start(t, h)
	for _, kind := range kinds {
		t.Run(string(kind)+" stream", func(t *testing.T) {
			s := newSink()
			res, err := generate(t.Context(), e, request(t, kind, h.Model, `"n":2,"stream":true,"stream_options":{"include_usage":true},`+h.short()), s)
			if err != nil {
				t.Fatal(err)
			}
			st := checkStream(t, kind, h.Model, 2, s.Lines())
			if st.usage == nil {
				t.Fatal("no usage chunk")
			}
			checkUsage(t, res.Usage, 2*tokens)
		})
		t.Run(string(kind)+" whole", func(t *testing.T) {
			res, err := generate(t.Context(), e, request(t, kind, h.Model, `"n":2,`+h.short()), newSink())
			if err != nil {
				t.Fatal(err)
			}
			checkWhole(t, kind, h.Model, 2, res)
			checkUsage(t, res.Usage, 2*tokens)
		})
	}
}

// Fields the engine does not know are no error (clients send many), and keys
// match exactly: "Stream" is not "stream".
func testUnknownFields(t *testing.T, h *Harness) {
	e := start(t, h)
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			s := newSink()
			_, err := generate(t.Context(), e, request(t, kind, h.Model,
				`"stream":true,"Stream":false,"temperature":0.5,"x_enginetest":{"a":[1,{"b":null}]},`+h.short()), s)
			if err != nil {
				t.Fatal(err)
			}
			checkStream(t, kind, h.Model, 1, s.Lines())
		})
	}
}

// A server that refuses fields it does not know (FastAPI's 422 list, as
// transformers serve answers vLLM's ignore_eos) gives a 400 that names the
// field, before any chunk.
func testStrictFields(t *testing.T, h *Harness) {
	e := start(t, h)
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			s := newSink()
			_, err := generate(t.Context(), e, request(t, kind, h.Model, `"stream":true,"ignore_eos":true,`+h.short()), s)
			se := asError(t, err, 400)
			if param(se) != "ignore_eos" || !strings.Contains(se.Body.Message, "ignore_eos") {
				t.Errorf("param %q message %q: want the field named", param(se), se.Body.Message)
			}
			if n := s.Calls(); n != 0 {
				t.Errorf("%d Sink.Chunks calls", n)
			}
		})
	}
}

// Requests at once each get their own stream, whole and unmixed.
func testConcurrent(t *testing.T, h *Harness) {
	e := start(t, h)
	const n = 6
	sinks := make([]*Sink, n)
	outs := make([]<-chan outcome, n)
	for i := range n {
		sinks[i] = newSink()
		outs[i] = goGenerate(t.Context(), e, request(t, kinds[i%2], h.Model, `"stream":true,`+h.short()), sinks[i])
	}
	ids := map[string]bool{}
	for i := range n {
		if o := await(t, outs[i], waitLong, "its start"); o.err != nil {
			t.Fatalf("request %d: %v", i, o.err)
		}
		st := checkStream(t, kinds[i%2], h.Model, 1, sinks[i].Lines())
		if ids[st.id] {
			t.Errorf("two streams with id %s", st.id)
		}
		ids[st.id] = true
	}
}

// longStreamTokens outlasts many health and model-list periods of an engine
// whose harness sets them short (the one-at-a-time quirk's does).
const longStreamTokens = 400

// A stream much longer than the others arrives whole, with its finish_reason:
// nothing the engine does by itself while it runs (health probes, model list
// refreshes) may cut it, and a stream the server cuts is an error.
func testLongStream(t *testing.T, h *Harness) {
	e := start(t, h)
	s := newSink()
	res, err := generate(t.Context(), e, request(t, schemas.KindChat, h.Model, `"stream":true,`+h.exactly(longStreamTokens)), s)
	if err != nil {
		t.Fatal(err)
	}
	checkStream(t, schemas.KindChat, h.Model, 1, s.Lines()) // whole: every choice ends with a finish_reason
	if _, strict := h.Lacks[Extensions]; strict {
		return // no ignore_eos: a real model may stop by itself, and a finish_reason is all there is to check
	}
	if res == nil || res.Usage.CompletionTokens < longStreamTokens {
		t.Fatalf("result %+v: want %d completion tokens", res, longStreamTokens)
	}
}
