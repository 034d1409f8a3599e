package tracing

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/schemas"
)

const (
	inTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	inSpan   = "00f067aa0ba902b7"
	inParent = "00-" + inTrace + "-" + inSpan + "-01"
)

func TestExtractFromHeader(t *testing.T) {
	for _, tc := range []struct {
		name        string
		h           nats.Header
		trace, span string // "" : no remote span context
		sampled     bool
		state       string
	}{
		{name: "sampled", h: nats.Header{schemas.HdrTrace: {inParent}}, trace: inTrace, span: inSpan, sampled: true},
		{name: "not sampled", h: nats.Header{schemas.HdrTrace: {"00-" + inTrace + "-" + inSpan + "-00"}}, trace: inTrace, span: inSpan},
		{name: "with tracestate", h: nats.Header{schemas.HdrTrace: {inParent}, "tracestate": {"vendor=abc"}}, trace: inTrace, span: inSpan, sampled: true, state: "vendor=abc"},
		{name: "none", h: nats.Header{schemas.HdrRequestID: {"r1"}}},
		{name: "nil header", h: nil},
		{name: "malformed", h: nats.Header{schemas.HdrTrace: {"00-xyz-" + inSpan + "-01"}}},
		{name: "zero trace id", h: nats.Header{schemas.HdrTrace: {"00-00000000000000000000000000000000-" + inSpan + "-01"}}},
		{name: "wrong case is another header", h: nats.Header{"Traceparent": {inParent}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := trace.SpanContextFromContext(Extract(context.Background(), tc.h))
			if tc.trace == "" {
				if sc.IsValid() {
					t.Fatalf("extracted %v from %v", sc, tc.h)
				}
				return
			}
			if !sc.IsRemote() || sc.TraceID().String() != tc.trace || sc.SpanID().String() != tc.span || sc.IsSampled() != tc.sampled {
				t.Fatalf("extracted %v, want trace %s span %s sampled %v", sc, tc.trace, tc.span, tc.sampled)
			}
			if sc.TraceState().String() != tc.state {
				t.Fatalf("tracestate %q, want %q", sc.TraceState().String(), tc.state)
			}
		})
	}
}

func TestInjectIntoHeader(t *testing.T) {
	tid, _ := trace.TraceIDFromHex(inTrace)
	sid, _ := trace.SpanIDFromHex("1111111111111111")
	ts, _ := trace.ParseTraceState("vendor=xyz")
	ours := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid})
	for _, tc := range []struct {
		name      string
		sc        trace.SpanContext
		h         nats.Header
		want      string // traceparent afterwards
		wantState string
	}{
		{"sets", ours, nats.Header{}, "00-" + inTrace + "-1111111111111111-01", "vendor=xyz"},
		{"rewrites the incoming one", ours, nats.Header{schemas.HdrTrace: {inParent}, "tracestate": {"old=1"}}, "00-" + inTrace + "-1111111111111111-01", "vendor=xyz"},
		{"not sampled", unsampled, nats.Header{}, "00-" + inTrace + "-1111111111111111-00", ""},
		{"no span context: passes the incoming one through", trace.SpanContext{}, nats.Header{schemas.HdrTrace: {inParent}}, inParent, ""},
		{"no span context, nothing incoming", trace.SpanContext{}, nats.Header{}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			Inject(trace.ContextWithSpanContext(context.Background(), tc.sc), tc.h)
			if got := tc.h.Get(schemas.HdrTrace); got != tc.want {
				t.Fatalf("traceparent %q, want %q", got, tc.want)
			}
			if got := tc.h.Get("tracestate"); got != tc.wantState {
				t.Fatalf("tracestate %q, want %q", got, tc.wantState)
			}
			if len(tc.h["Traceparent"]) > 0 {
				t.Fatal("wrote a Traceparent header: NATS headers are case-sensitive")
			}
			// What Inject writes, Extract reads back.
			if tc.sc.IsValid() {
				back := trace.SpanContextFromContext(Extract(context.Background(), tc.h))
				if back.TraceID() != tc.sc.TraceID() || back.SpanID() != tc.sc.SpanID() || back.IsSampled() != tc.sc.IsSampled() {
					t.Fatalf("round trip: %v, want %v", back, tc.sc)
				}
			}
		})
	}
}

// Traceparent writes what the W3C propagator writes.
func TestTraceparentMatchesPropagator(t *testing.T) {
	tid, _ := trace.TraceIDFromHex(inTrace)
	sid, _ := trace.SpanIDFromHex(inSpan)
	for _, flags := range []trace.TraceFlags{0, trace.FlagsSampled} {
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags})
		c := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
		if got := Traceparent(spanWith(sc)); got != c["traceparent"] {
			t.Fatalf("Traceparent %q, propagator %q", got, c["traceparent"])
		}
	}
	if got := Traceparent(noopSpan); got != "" {
		t.Fatalf("a no-op span has traceparent %q", got)
	}
}

func TestFromTraceparent(t *testing.T) {
	for _, tc := range []struct{ in, state, want string }{
		{inParent, "", inTrace},
		{inParent, "a=b", inTrace},
		{"", "", ""},
		{"garbage", "", ""},
		{"ff-" + inTrace + "-" + inSpan + "-01", "", ""}, // version ff is invalid
	} {
		sc := trace.SpanContextFromContext(FromTraceparent(context.Background(), tc.in, tc.state))
		got := ""
		if sc.IsValid() {
			got = sc.TraceID().String()
		}
		if got != tc.want {
			t.Errorf("FromTraceparent(%q): trace %q, want %q", tc.in, got, tc.want)
		}
	}
}

// spanWith is a non-recording span carrying sc.
func spanWith(sc trace.SpanContext) trace.Span {
	return trace.SpanFromContext(trace.ContextWithSpanContext(context.Background(), sc))
}

func TestFailAndAnnotate(t *testing.T) {
	if got := Annotate(noopSpan, errors.New("x")); got != "" {
		t.Fatalf("annotating a no-op span: %q", got)
	}
	Fail(noopSpan, errors.New("x")) // no panic
	for k, want := range map[schemas.Kind]string{schemas.KindChat: "chat", schemas.KindCompletion: "text_completion",
		schemas.KindEmbedding: "embeddings", schemas.KindTokenize: "tokenize", schemas.KindDetokenize: "detokenize"} {
		if got := Operation(k); got != want {
			t.Errorf("Operation(%s) = %q, want %q", k, got, want)
		}
	}
}

// Off: nothing installed, and a hop's spans cost nothing.
func TestOffCostsNothing(t *testing.T) {
	if Enabled() {
		t.Fatal("enabled with nothing installed")
	}
	tr := NewTracer("test")
	ctx := context.Background()
	h := nats.Header{schemas.HdrTrace: {inParent}}
	allocs := testing.AllocsPerRun(1000, func() {
		c, span := tr.StartFromHeader(ctx, h, "x", trace.SpanKindConsumer)
		if span.IsRecording() || c != ctx {
			t.Fatal("a span with tracing off records or changes the context")
		}
		InjectSpan(span, h)
		span.AddEvent(EventFirstToken)
		span.End()
	})
	if allocs != 0 {
		t.Fatalf("a span with tracing off allocates %v times", allocs)
	}
	if h.Get(schemas.HdrTrace) != inParent {
		t.Fatal("with tracing off the incoming traceparent did not pass through")
	}
	if HeaderTraceID(h) != "" {
		t.Fatal("a trace id for the log with tracing off")
	}
}

// On: spans go to the installed provider, children of the header's context;
// uninstall turns tracing off, and a second install takes over at once.
func TestInstall(t *testing.T) {
	for i := range 2 {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		uninstall := Install(tp)
		if !Enabled() {
			t.Fatal("not enabled")
		}
		h := nats.Header{schemas.HdrTrace: {inParent}}
		if got := HeaderTraceID(h); got != inTrace {
			t.Fatalf("HeaderTraceID %q", got)
		}
		_, span := NewTracer("test/scope").StartFromHeader(context.Background(), h, "hop", trace.SpanKindConsumer)
		Fail(span, schemas.FromUpstream(503, schemas.TypeOverloaded, schemas.CodeQueueFull, "", "full").WithRetryAfter(1))
		InjectSpan(span, h)
		span.End()
		uninstall()
		if Enabled() {
			t.Fatal("enabled after uninstall")
		}
		ended := rec.Ended()
		if len(ended) != 1 {
			t.Fatalf("round %d: %d spans", i, len(ended))
		}
		s := ended[0]
		want := "00-" + inTrace + "-" + s.SpanContext().SpanID().String() + "-01"
		if s.Parent().SpanID().String() != inSpan || s.SpanKind() != trace.SpanKindConsumer || s.InstrumentationScope().Name != "test/scope" ||
			s.Status().Code != codes.Error || s.Status().Description != "full" || h.Get(schemas.HdrTrace) != want {
			t.Fatalf("span %+v, injected %q", s, h.Get(schemas.HdrTrace))
		}
		_ = tp.Shutdown(context.Background())
	}
}
