package enginetest

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

// faulty starts the engine in front of a fresh fake vLLM serving Model,
// healthy; the engine closes before the fake.
func faulty(t *testing.T, h *Harness) (engine.Engine, *fakevllm.Server) {
	t.Helper()
	f := fakevllm.New()
	f.Base = []string{h.Model}
	srv := httptest.NewServer(f)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	e := h.Faulty(t, srv.URL)
	t.Cleanup(func() { e.Close() })
	testenv.WaitFor(t, waitLong, func() error { return e.Health(t.Context()) })
	return e, f
}

// fake is a members string scripting the fake vLLM (its x_fake object).
func fake(script string) string { return `"x_fake":` + script }

// An error answer of the server is a *schemas.Error with its status,
// message and param, in either of vLLM's shapes, before any chunk.
func testUpstreamErrors(t *testing.T, h *Harness) {
	e, _ := faulty(t, h)
	for _, tc := range []struct {
		name, members string
		status        int
		msg, param    string
	}{
		{"flat 400", `"stream":true,` + fake(`{"mode":"error_flat","status":400}`), 400, "flat 400", ""},
		{"nested 422", fake(`{"mode":"error_nested","status":422}`), 422, "nested 422", "temperature"},
		{"nested 503", `"stream":true,` + fake(`{"mode":"error_nested","status":503}`), 503, "nested 503", "temperature"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSink()
			_, err := generate(t.Context(), e, request(t, schemas.KindChat, h.Model, tc.members), s)
			se := asError(t, err, tc.status)
			if !strings.Contains(se.Body.Message, tc.msg) || param(se) != tc.param {
				t.Errorf("message %q param %q, want %q and %q", se.Body.Message, param(se), tc.msg, tc.param)
			}
			if n := s.Calls(); n != 0 {
				t.Errorf("%d Sink.Chunks calls", n)
			}
		})
	}
}

// A stream that fails after some chunks ends with a *schemas.Error, and
// every chunk the server sent before reached the sink. A stream that ends
// before any finish_reason, with [DONE] or without, failed
// (engine_stream_truncated); one that ends after it without [DONE] did not.
func testStreamFailures(t *testing.T, h *Harness) {
	e, f := faulty(t, h)
	for _, tc := range []struct {
		mode   string
		status int // 0: a clean end
		code   string
		msg    string
	}{
		{"midstream_error", 500, "", "engine exploded"},  // an error object in the stream
		{"break", 502, schemas.CodeEngineError, "broke"}, // the connection closed
		{"nodone", 0, "", ""},                            // finished, then the body ended without [DONE]
		{"truncate", 502, schemas.CodeEngineTruncated, "the body ended after"},
		{"truncate_done", 502, schemas.CodeEngineTruncated, "[DONE] came after"},
		{"empty", 502, schemas.CodeEngineTruncated, "empty stream"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			s := newSink()
			req := request(t, schemas.KindChat, h.Model, `"stream":true,`+fake(`{"mode":"`+tc.mode+`"}`))
			_, err := generate(t.Context(), e, req, s)
			if tc.status == 0 {
				if err != nil {
					t.Fatalf("Generate returned %v, want a clean end", err)
				}
				if got, sent := s.Lines(), f.Sent(req.ID); len(sent) == 0 || !slices.Equal(got, sent) {
					t.Errorf("the sink got\n%q\nthe server sent\n%q", got, sent)
				}
				return
			}
			se := asError(t, err, tc.status)
			if code(se) != tc.code || !strings.Contains(se.Body.Message, tc.msg) {
				t.Errorf("code %q message %q, want %q and %q", code(se), se.Body.Message, tc.code, tc.msg)
			}
			if got, sent := s.Lines(), f.Sent(req.ID); !slices.Equal(got, sent) || (len(sent) == 0 && tc.mode != "empty") {
				t.Errorf("the sink got\n%q\nthe server sent\n%q", got, sent)
			}
		})
	}
}

// Ending a request (its context, a Sink error, Close) ends the server's
// request too: the server sees its client go.
func testCancelUpstream(t *testing.T, h *Harness) {
	slow := fake(`{"mode":"slow"}`)
	cancel := func(_ engine.Engine, cancel context.CancelFunc) { cancel() }
	for _, tc := range []struct {
		name      string
		members   string
		sinkFails bool                                             // the sink's first call fails
		end       func(e engine.Engine, cancel context.CancelFunc) // or this ends the request
		want      func(t *testing.T, err error)
	}{
		{"cancel, stream", `"stream":true,` + slow, false, cancel, wantCanceled},
		{"cancel, stream:false", slow, false, cancel, wantCanceled},
		{"sink error", `"stream":true,` + slow, true, nil, func(t *testing.T, err error) {
			if !errors.Is(err, errGone) {
				t.Errorf("Generate returned %v, want the sink's error", err)
			}
		}},
		{"close", slow, false, func(e engine.Engine, _ context.CancelFunc) { e.Close() }, func(t *testing.T, err error) {
			if se := asError(t, err, 503); code(se) != schemas.CodeShuttingDown {
				t.Errorf("%v, want code %s", se, schemas.CodeShuttingDown)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f := faulty(t, h)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			s := newSink()
			if tc.sinkFails {
				s.OnCall = func(int) error { return errGone }
			}
			req := request(t, schemas.KindChat, h.Model, tc.members)
			out := goGenerate(ctx, e, req, s)
			testenv.WaitFor(t, waitLong, func() error {
				if f.Body(req.ID) == nil {
					return fmt.Errorf("request %s never reached the server", req.ID)
				}
				return nil
			})
			if tc.end != nil {
				tc.end(e, cancel)
			}
			tc.want(t, await(t, out, promptly, "its end").err)
			deadline := time.After(waitLong)
			for {
				select {
				case id := <-f.Cancelled:
					if id == req.ID {
						return
					}
				case <-deadline:
					t.Fatalf("the server never saw request %s go", req.ID)
				}
			}
		})
	}
}

func wantCanceled(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Generate returned %v, want context.Canceled", err)
	}
}
