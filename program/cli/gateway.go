package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
)

// registerHTTP defines the gateway's HTTP flags on c, c's values as defaults.
func registerHTTP(fs *pflag.FlagSet, c *program.HTTPConfig) {
	fs.StringVar(&c.Listen, "http", c.Listen, "listen address of the OpenAI-compatible HTTP API")
	fs.IntVar(&c.BodyLimit, "body-limit", c.BodyLimit, "largest request body in bytes (also capped by the NATS server's max_payload); past it: 413")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", c.RequestTimeout, "longest a request may take end to end")
	fs.BoolVar(&c.ReadyWithoutWorkers, "ready-without-workers", c.ReadyWithoutWorkers, "/ready needs NATS only, not a live worker: for worker pools scaled to zero, whose first request must reach a gateway to start one (docs/capacity.md)")
	fs.DurationVar(&c.HoldKeepalive, "hold-keepalive", c.HoldKeepalive, "a stream waiting for a worker to start, wake or switch (docs/capacity.md) begins its 200 after this long and gets an SSE comment this often until its first token; negative: never")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "on SIGTERM, how long open streams may go on")
	fs.BoolVar(&c.Auth, "auth", c.Auth, "require API keys (Authorization: Bearer tb-...; create them with POST /keys on the admin API) and enforce their model lists and rate limits")
	fs.BoolVar(&c.FlowFromUser, "flow-from-user", c.FlowFromUser, `flow control: a request with no API key belongs to the flow its "user" field names, so end users share capacity fairly (any client can write any "user": for trusted clients; docs/scheduling.md)`)
	fs.DurationVar(&c.KeyCacheTTL, "key-cache-ttl", c.KeyCacheTTL, "how long a gateway trusts an API key lookup before asking Redis again (deletions apply at once through an event)")
	fs.StringVar(&c.Admin, "admin", c.Admin, `listen address of the admin API (models, adapters, workers, keys, usage); "" turns it off`)
	fs.StringVar(&c.AdminToken, "admin-token", c.AdminToken, "bearer token the admin API requires (prefer the environment variable to the command line)")
	registerLimits(fs, &c.Limits)
	l := &c.Limits
	fs.DurationVar(&l.KeyMaxStale, "key-max-stale", l.KeyMaxStale, "while Redis is down, API keys it confirmed within this long keep working (others get 503)")
	fs.IntVar(&c.AuthFailures, "auth-failures", c.AuthFailures, "failed API key or admin token checks within a minute from one client address (or with one key prefix) before further attempts get 429 with Retry-After, doubling up to 15m")
	fs.StringVar(&c.TrustedProxies, "trusted-proxies", c.TrustedProxies, `addresses and CIDR prefixes of reverse proxies whose X-Forwarded-For names the client (comma-separated); "" trusts none: the client is the TCP peer`)
	fs.Int64Var(&l.UsageStream.MaxBytes, "usage-stream-max-bytes", l.UsageStream.MaxBytes, "bytes of usage records the JetStream stream TOKENBUS_USAGE holds while Redis is down (full: new records wait in memory)")
	fs.DurationVar(&l.UsageStream.MaxAge, "usage-stream-max-age", l.UsageStream.MaxAge, "how long a usage record may wait in the stream for Redis before it is dropped")
	fs.IntVar(&l.UsageBuffer, "usage-buffer", l.UsageBuffer, "usage records a gateway holds in memory while JetStream cannot take them (past it they are dropped and counted)")
	fs.IntVar(&c.MigrationLimit, "migration-limit", c.MigrationLimit, "how many times a request whose worker dies, refuses or goes silent is sent to another worker: retried before its first token, migrated (continued) after it; 0 turns it off")
	fs.IntVar(&c.MigrationMaxSeqLen, "migration-max-seq-len", c.MigrationMaxSeqLen, "chunks of a stream kept so that it can be continued on another worker; a longer stream whose worker fails ends with stream_lost")
	fs.StringSliceVar(&c.CORS.Origins, "cors-origins", c.CORS.Origins, `origins (scheme://host[:port]) whose browser pages may call the OpenAI API, comma-separated; * any; "" turns CORS off`)
	fs.StringSliceVar(&c.CORS.Methods, "cors-methods", c.CORS.Methods, "HTTP methods a CORS preflight allows, comma-separated; * any")
	fs.StringSliceVar(&c.CORS.Headers, "cors-headers", c.CORS.Headers, "request headers a CORS preflight allows, comma-separated; * any (Authorization included)")
	fs.BoolVar(&c.CORS.Credentials, "cors-credentials", c.CORS.Credentials, "let browsers send credentials (cookies, HTTP auth) cross-origin: the allowed Origin is then echoed, never *")
	registerBatch(fs, &c.Batch)
	registerResponses(fs, &c.Responses)
	registerQuotas(fs, &c.Quotas)
	fs.DurationVar(&c.QuotaCacheTTL, "quota-cache-ttl", c.QuotaCacheTTL, "how long a gateway trusts a tenant's quotas before asking Redis again (changes apply at once through an event)")
}

// registerQuotas defines the flags of the default quotas of a tenant (the
// admin API sets a tenant's own).
func registerQuotas(fs *pflag.FlagSet, q *registry.Quotas) {
	fs.Int64Var(&q.FileBytes, "quota-file-bytes", q.FileBytes, "bytes of files (uploads and batch output) a tenant may keep, unless the admin API gives it its own quota; 0: no limit")
	fs.Int64Var(&q.Files, "quota-files", q.Files, "files a tenant may keep, unless the admin API gives it its own quota; 0: no limit")
	fs.Int64Var(&q.Batches, "quota-batches", q.Batches, "batches not yet ended a tenant may have, unless the admin API gives it its own quota; 0: no limit")
}

// registerBatch defines the flags of the Files and Batches APIs and the
// batch runner.
func registerBatch(fs *pflag.FlagSet, b *program.BatchConfig) {
	fs.BoolVar(&b.Enabled, "batches", b.Enabled, "serve the Files and Batches APIs (/v1/files, /v1/batches), their state in JetStream")
	fs.BoolVar(&b.Runner, "batch-runner", b.Runner, "run batches in this process: validate them, send their lines through the bus at low priority, write their output files (any number of gateways may)")
	fs.Int64Var(&b.FileLimit, "file-limit", b.FileLimit, "largest file POST /v1/files takes, in bytes; past it: 413")
	fs.IntVar(&b.UploadsMax, "uploads-max", b.UploadsMax, "uploads (POST /v1/files) a gateway reads at once; past it 503 before the body is read")
	fs.IntVar(&b.UploadsPerTenant, "uploads-per-tenant", b.UploadsPerTenant, "uploads of one tenant a gateway reads at once; past it 429 before the body is read")
	fs.Int64Var(&b.FilesMaxBytes, "files-max-bytes", b.FilesMaxBytes, "bytes the JetStream files bucket TOKENBUS_FILES may hold (full: uploads and batch output get 507; deletes still work)")
	fs.Int64Var(&b.QueueMaxBytes, "batch-queue-max-bytes", b.QueueMaxBytes, "bytes of batch lines the JetStream work queue TOKENBUS_BATCH may hold (full: a new batch waits in validating)")
	fs.Int64Var(&b.ResultsMaxBytes, "batch-results-max-bytes", b.ResultsMaxBytes, "bytes of answered batch lines the JetStream stream TOKENBUS_BATCH_RESULTS may hold until their batches are finalised (full: lines run again later)")
	fs.Int64Var(&b.RecordsMaxBytes, "batch-records-max-bytes", b.RecordsMaxBytes, "bytes each of the JetStream buckets TOKENBUS_BATCHES (batch records) and TOKENBUS_INDEX (files and batches by tenant) may hold")
	fs.IntVar(&b.MaxLines, "batch-max-lines", b.MaxLines, "most requests (lines) one batch may have; past it the batch fails validation")
	fs.IntVar(&b.MaxInFlight, "batch-max-in-flight", b.MaxInFlight, "batch lines this runner runs at once, in all (each also waits for a free slot of the model's workers)")
	fs.IntVar(&b.MaxPerBatch, "batch-max-per-batch", b.MaxPerBatch, "lines of one batch this runner runs at once (batches take turns)")
	fs.IntVar(&b.Priority, "batch-priority", b.Priority, "Tb-Priority of batch lines: dispatchers serve lower values first, and interactive requests have 0")
	fs.DurationVar(&b.AckWait, "batch-ack-wait", b.AckWait, "a batch line taken by a runner that died runs again after this long")
	fs.IntVar(&b.Replicas, "batch-replicas", b.Replicas, "replicas of the batch streams and buckets in JetStream (3 on a NATS cluster of 3 or more)")
	fs.Float64Var(&b.Headroom, "batch-headroom", b.Headroom, "share of a model's worker slots batch lines leave free for interactive requests (0 to 1)")
	fs.DurationVar(&b.ResponseRetention, "response-retention", b.ResponseRetention, "stored responses (/v1/responses) and background responses' events are kept this long")
	fs.DurationVar(&b.ResponseAckWait, "response-ack-wait", b.ResponseAckWait, "a background response whose runner (gateway) died is continued by another runner after this long")
}

// registerLimits defines the flags of rate-limit admission on Redis (a
// gateway's, and a dispatcher's for NATS-native tenant requests).
func registerLimits(fs *pflag.FlagSet, l *program.LimitsConfig) {
	fs.DurationVar(&l.Breaker.Timeout, "redis-timeout", l.Breaker.Timeout, "longest a request waits on one Redis call (API key lookup, rate-limit check, usage write)")
	fs.IntVar(&l.Breaker.Failures, "redis-breaker-failures", l.Breaker.Failures, "Redis failures in a row that open the circuit breaker (then Redis calls fail at once)")
	fs.DurationVar(&l.Breaker.Cooldown, "redis-breaker-cooldown", l.Breaker.Cooldown, "how long the open circuit breaker waits before one call probes Redis again")
	fs.BoolVar(&l.FailClosed, "limits-fail-closed", l.FailClosed, "while Redis cannot check rate limits, refuse (503) the requests of keys with limits instead of allowing them")
	fs.IntVar(&l.DefaultMaxTokens, "default-max-tokens", l.DefaultMaxTokens, "tokens reserved against a key's TPM limit for a request without max_tokens, when its model has no registered max_model_len")
}

// checkHTTP reports flags that do not go together, before anything connects.
func checkHTTP(c program.HTTPConfig, haveRedis bool) error {
	switch {
	case c.Auth && !haveRedis:
		return fmt.Errorf("--auth needs Redis (--redis-url, --redis-sentinel or --redis-cluster): API keys live there; or run without keys: --auth=false")
	case c.Admin != "" && !haveRedis:
		return fmt.Errorf(`the admin API needs Redis (--redis-url, --redis-sentinel or --redis-cluster); or turn it off with --admin ""`)
	case c.Admin != "" && c.AdminToken == "":
		return fmt.Errorf(`--admin-token (or %s) is required for the admin API on %s; or turn it off with --admin ""`,
			flagenv.EnvName("admin-token"), c.Admin)
	}
	if err := c.CORS.Check(); err != nil {
		return fmt.Errorf("--cors-origins: %w", err)
	}
	return nil
}

func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagenv.NewFlagSet("gateway")
	cfg := program.DefaultGateway()
	var popts processOptions
	registerHTTP(fs, &cfg.HTTP)
	fs.BoolVar(&cfg.EmbedDispatcher, "embed-dispatcher", cfg.EmbedDispatcher, "route requests with a dispatcher inside the gateway, straight to workers (saves two NATS hops before the first token); standalone dispatchers still serve NATS-native clients")
	registerDispatcher(fs, &cfg.Dispatcher)
	cfg.NATS.Register(fs)
	rf := registerRedis(fs, &cfg.Redis, "Redis holding the registry, API keys, limits and usage (empty: none; then --auth=false --admin '' are needed)", true)
	popts.register(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := rf.check(); err != nil {
		return err
	}
	if err := checkHTTP(cfg.HTTP, cfg.Redis.Configured()); err != nil {
		return err
	}
	log, own, stop, err := popts.start(ctx, stderr, "gateway")
	if err != nil {
		return err
	}
	defer stop()
	cfg.Log, cfg.Version = log, Version
	gw, err := program.StartGateway(ctx, cfg)
	if err != nil {
		return err
	}
	own.Info("gateway listening", "http", "http://"+gw.Addr(), "auth", cfg.HTTP.Auth, "admin", gw.AdminAddr(), "embedded_dispatcher", cfg.EmbedDispatcher)
	return untilDone(ctx, gw, nil)
}
