package otlp

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tokenbus/tokenbus/internal/tracing"
)

// Options configure Setup.
type Options struct {
	// Endpoint is the OTLP/HTTP collector, e.g. http://127.0.0.1:4318; the
	// traces path /v1/traces is appended to a URL that has no path. A URL
	// with a path is used as it is. Empty: tracing stays off.
	Endpoint string
	// Insecure is for an Endpoint given as host:port without a scheme:
	// plain HTTP instead of HTTPS. With a scheme, the scheme decides.
	Insecure bool
	// ServiceName is the resource's service.name (OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override it, as everywhere in OpenTelemetry).
	ServiceName    string
	ServiceVersion string
	// SampleRatio is the share of new traces sampled, 0..1 (the flag's
	// default is 1); a request that arrives with a trace context follows its
	// sampled flag.
	SampleRatio float64
	// Headers are sent with every export (collector authentication).
	Headers map[string]string
	// Logger gets the exporter's errors (default: discarded).
	Logger *slog.Logger
}

// Setup installs an OTLP/HTTP exporter and a tracer provider for the process,
// and the W3C trace-context propagator as otel's global propagator. With no
// Endpoint it installs nothing (no exporter, no goroutine, no network) and
// returns a no-op shutdown. shutdown flushes what is buffered (bounded by its
// context) and turns tracing off again.
func Setup(ctx context.Context, o Options) (shutdown func(context.Context) error, err error) {
	if o.Endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	eopts, err := exporterOptions(o)
	if err != nil {
		return nil, err
	}
	if o.SampleRatio < 0 || o.SampleRatio > 1 {
		return nil, fmt.Errorf("trace sample ratio %v is not between 0 and 1", o.SampleRatio)
	}
	exp, err := otlptracehttp.New(ctx, eopts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(newResource(o)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))),
	)
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	uninstall := tracing.Install(tp)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(tracing.Propagator())
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "err", err) }))
	var once sync.Once
	return func(ctx context.Context) error {
		var err error
		once.Do(func() {
			uninstall()
			otel.SetTracerProvider(noop.NewTracerProvider())
			err = tp.Shutdown(ctx)
		})
		return err
	}, nil
}

func exporterOptions(o Options) ([]otlptracehttp.Option, error) {
	ep := o.Endpoint
	if !strings.Contains(ep, "://") {
		scheme := "https"
		if o.Insecure {
			scheme = "http"
		}
		ep = scheme + "://" + ep
	}
	u, err := url.Parse(ep)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("OTLP endpoint %q is not an http(s) URL", o.Endpoint)
	}
	path := u.Path
	if path == "" || path == "/" {
		path = "/v1/traces"
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path),
		otlptracehttp.WithTimeout(10 * time.Second)}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	if len(o.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(o.Headers))
	}
	return opts, nil
}

func newResource(o Options) *resource.Resource {
	name := o.ServiceName
	if name == "" {
		name = "tokenbus"
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	if o.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", o.ServiceVersion))
	}
	ours := resource.NewSchemaless(attrs...)
	r, err := resource.Merge(resource.Default(), ours)
	if err != nil {
		return ours
	}
	if env, err := resource.Merge(r, resource.Environment()); err == nil {
		r = env
	}
	return r
}
