package otlp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/internal/tracing"
	"github.com/tokenbus/tokenbus/schemas"
)

const (
	inTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	inSpan   = "00f067aa0ba902b7"
	inParent = "00-" + inTrace + "-" + inSpan + "-01"
)

// Off: Setup with no endpoint installs nothing: no provider, no exporter.
func TestOffInstallsNothing(t *testing.T) {
	rcv := testenv.StartOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL) // ignored: no endpoint, no exporter
	before := otel.GetTracerProvider()
	shutdown, err := Setup(context.Background(), Options{ServiceName: "x", SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	if tracing.Enabled() {
		t.Fatal("enabled with no endpoint")
	}
	if otel.GetTracerProvider() != before {
		t.Fatal("Setup with no endpoint replaced otel's global tracer provider")
	}
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
		t.Fatal("an SDK provider is installed")
	}
	_, span := tracing.NewTracer("t").Start(context.Background(), "x", trace.SpanKindInternal)
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := rcv.Requests(); n != 0 {
		t.Fatalf("%d exports with no endpoint", n)
	}
}

func TestEndpointOptions(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		insecure bool
		ok       bool
	}{
		{"http://127.0.0.1:4318", false, true},
		{"http://127.0.0.1:4318/", false, true},
		{"https://collector.example/otlp/v1/traces", false, true},
		{"127.0.0.1:4318", true, true},
		{"collector:4318", false, true},
		{"grpc://127.0.0.1:4317", false, false},
		{"http://", false, false},
	} {
		_, err := exporterOptions(Options{Endpoint: tc.endpoint, Insecure: tc.insecure})
		if (err == nil) != tc.ok {
			t.Errorf("%q: err %v, want ok %v", tc.endpoint, err, tc.ok)
		}
	}
	if _, err := Setup(context.Background(), Options{Endpoint: "http://127.0.0.1:1", SampleRatio: 2}); err == nil {
		t.Error("sample ratio 2 accepted")
	}
}

// On: spans go to an OTLP/HTTP receiver, with the parent from a header, and
// shutdown flushes them and turns tracing off.
func TestExportToReceiver(t *testing.T) {
	rcv := testenv.StartOTLPReceiver(t)
	for _, tc := range []struct {
		name     string
		endpoint string
	}{
		{"base URL", rcv.URL},
		{"full path", rcv.URL + "/v1/traces"},
		{"host:port", rcv.URL[len("http://"):]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shutdown, err := Setup(context.Background(), Options{Endpoint: tc.endpoint, Insecure: true,
				ServiceName: "svc-" + tc.name, ServiceVersion: "1.2.3", SampleRatio: 1, Headers: map[string]string{"Authorization": "Bearer t0k"}})
			if err != nil {
				t.Fatal(err)
			}
			if !tracing.Enabled() {
				t.Fatal("not enabled")
			}
			tr := tracing.NewTracer("test/scope")
			_, span := tr.StartFromHeader(context.Background(), nats.Header{schemas.HdrTrace: {inParent}}, "hop", trace.SpanKindConsumer)
			tracing.Fail(span, schemas.FromUpstream(503, schemas.TypeOverloaded, schemas.CodeQueueFull, "", "full").WithRetryAfter(1))
			h := nats.Header{}
			tracing.InjectSpan(span, h)
			span.End()
			if err := shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if tracing.Enabled() {
				t.Fatal("still enabled after shutdown")
			}
			var got *testenv.Span
			for _, s := range rcv.Trace(inTrace) {
				if s.Service == "svc-"+tc.name {
					got = &s
				}
			}
			if got == nil {
				t.Fatalf("span not received: %+v", rcv.Spans())
			}
			want := fmt.Sprintf("00-%s-%s-01", inTrace, got.SpanID)
			if got.ParentSpanID != inSpan || got.Name != "hop" || got.Kind != "consumer" || got.Scope != "test/scope" ||
				!got.StatusError || got.StatusMessage != "full" || got.Attrs["error.type"] != schemas.CodeQueueFull || h.Get(schemas.HdrTrace) != want {
				t.Fatalf("span %+v, injected %q", got, h.Get(schemas.HdrTrace))
			}
			if got.Resource["service.version"] != "1.2.3" || rcv.LastHeader().Get("Authorization") != "Bearer t0k" {
				t.Fatalf("resource %v, export headers %v", got.Resource, rcv.LastHeader())
			}
		})
	}
}

// A ratio of 0 samples no new trace but follows a sampled parent.
func TestSampleRatio(t *testing.T) {
	rcv := testenv.StartOTLPReceiver(t)
	shutdown, err := Setup(context.Background(), Options{Endpoint: rcv.URL, SampleRatio: 0})
	if err != nil {
		t.Fatal(err)
	}
	tr := tracing.NewTracer("test")
	_, root := tr.Start(context.Background(), "new", trace.SpanKindServer)
	_, child := tr.StartFromHeader(context.Background(), nats.Header{schemas.HdrTrace: {inParent}}, "child", trace.SpanKindServer)
	if root.IsRecording() || !child.IsRecording() {
		t.Fatalf("ratio 0: new trace recording %v, sampled parent's child recording %v", root.IsRecording(), child.IsRecording())
	}
	if tracing.Traceparent(root) == "" || tracing.Traceparent(root)[53:] != "00" {
		t.Fatalf("an unsampled span still propagates, flagged unsampled: %q", tracing.Traceparent(root))
	}
	root.End()
	child.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(rcv.Spans()); n != 1 {
		t.Fatalf("%d spans exported, want 1", n)
	}
}

// Shutdown flushes within its context even with the collector gone.
func TestShutdownBounded(t *testing.T) {
	shutdown, err := Setup(context.Background(), Options{Endpoint: "http://127.0.0.1:" + fmt.Sprint(testenv.FreePort(t)), SampleRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tracing.NewTracer("t").Start(context.Background(), "x", trace.SpanKindInternal)
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = shutdown(ctx)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("shutdown took %s", d)
	}
	if tracing.Enabled() {
		t.Fatal("still enabled")
	}
}
