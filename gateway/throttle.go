package gateway

import (
	"log/slog"
	"math"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenbus/tokenbus/schemas"
)

// Failed credential checks back off. A wrong API key or admin token counts
// against the client's address and (for API keys) against the presented
// key's prefix (its first 6 characters, as the 401 shows them); a missing
// key is no guess and does not count. After Failures failures within
// Window, the address or prefix is blocked for BaseBlock; each failure after
// a block doubles it, up to MaxBlock. While blocked, attempts get 429
// too_many_auth_failures with Retry-After, without the key being looked up:
// a blocked guesser learns nothing and costs no Redis round trip.
//
// What still works from a blocked address: an API key the gateway already
// holds in memory (KeyCache.Peek: a map lookup on the key's SHA-256, no
// Redis, no timing that depends on the secret). Keys are 256 random bits,
// so answering for cached keys gives a guesser no useful oracle, and
// legitimate clients behind the same NAT or proxy keep working. A blocked
// key prefix (package auth) still has the key looked up: only misses get
// the 429, so knowing a key's first characters cannot lock its holder out.
// The admin
// token is chosen by a person and may be weak: a blocked address gets 429
// for every admin request, right token or not.
//
// The table is bounded: MaxEntries buckets, each forgotten once quiet for
// MaxBlock past its block (or Window, if never blocked). When it is full of
// live buckets, addresses and prefixes not in it share one overflow bucket,
// so rotating addresses neither grows memory nor escapes the throttle.
// IPv6 addresses are counted by /64.

// ThrottleConfig tunes a Throttle. Zero values take the defaults shown.
type ThrottleConfig struct {
	Failures   int           // failures within Window that start a block. Default 10
	Window     time.Duration // Default 1m
	BaseBlock  time.Duration // the first block. Default 1s
	MaxBlock   time.Duration // the longest block. Default 15m
	MaxEntries int           // buckets kept. Default 65536
	// LogInterval: at most one log line per bucket per interval. Default 1m.
	LogInterval time.Duration
}

func (c *ThrottleConfig) defaults() {
	if c.Failures <= 0 {
		c.Failures = 10
	}
	if c.Window <= 0 {
		c.Window = time.Minute
	}
	if c.BaseBlock <= 0 {
		c.BaseBlock = time.Second
	}
	if c.MaxBlock <= 0 {
		c.MaxBlock = 15 * time.Minute
	}
	if c.MaxBlock < c.BaseBlock {
		c.MaxBlock = c.BaseBlock
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = 65536
	}
	if c.LogInterval <= 0 {
		c.LogInterval = time.Minute
	}
}

// Throttle counts failed credential checks. Make one with NewThrottle; the
// zero of *Throttle (nil) throttles nothing.
type Throttle struct {
	cfg  ThrottleConfig
	what string // "API key" or "admin token", for the log
	log  *slog.Logger
	now  func() time.Time

	mu        sync.Mutex
	buckets   map[string]*bucket
	overflow  bucket
	lastSweep time.Time

	failures  *prometheus.CounterVec // by reason
	throttled prometheus.Counter
}

type bucket struct {
	fails        int       // failures in the current window
	windowStart  time.Time // of the current window
	strikes      int       // blocks so far: the next is BaseBlock << strikes
	blockedUntil time.Time
	last         time.Time // last failure
	lastLog      time.Time
}

// NewThrottle makes a throttle; what names the credential in log lines
// ("API key", "admin token"), api labels its metrics ("openai", "admin").
// reg may be nil.
func NewThrottle(cfg ThrottleConfig, what, api string, log *slog.Logger, reg prometheus.Registerer) *Throttle {
	cfg.defaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Throttle{cfg: cfg, what: what, log: log, now: time.Now, buckets: map[string]*bucket{},
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "tokenbus_auth_failures_total",
			Help:        "Failed credential checks (a missing credential is not counted), by reason.",
			ConstLabels: prometheus.Labels{"api": api},
		}, []string{"reason"}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "tokenbus_auth_throttled_total",
			Help:        "Requests refused with 429 too_many_auth_failures, without checking their credential.",
			ConstLabels: prometheus.Labels{"api": api},
		}),
	}
	if reg != nil {
		reg.MustRegister(t.failures, t.throttled, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "tokenbus_auth_throttle_buckets",
			Help:        "Client addresses and key prefixes with recent credential failures (bounded).",
			ConstLabels: prometheus.Labels{"api": api},
		}, func() float64 { return float64(t.Len()) }))
	}
	return t
}

// Len is the number of buckets held.
func (t *Throttle) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.buckets)
}

// Blocked returns how long the first of keys that is blocked stays so (0:
// none is). keys are bucket names: AddrKey, PrefixKey.
func (t *Throttle) Blocked(keys ...string) time.Duration {
	if t == nil {
		return 0
	}
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	var longest time.Duration
	for _, k := range keys {
		if k == "" {
			continue
		}
		b := t.find(k)
		if b != nil && now.Before(b.blockedUntil) {
			longest = max(longest, b.blockedUntil.Sub(now))
		}
	}
	return longest
}

// Refused counts a request refused because it was blocked.
func (t *Throttle) Refused() {
	if t != nil {
		t.throttled.Inc()
	}
}

// Reasons makes the failures metric's series of each reason the caller
// will Fail with, at 0, so that they exist from start-up.
func (t *Throttle) Reasons(reasons ...string) {
	if t == nil {
		return
	}
	for _, r := range reasons {
		t.failures.WithLabelValues(r)
	}
}

// Fail counts a failed check against each of keys; reason labels the
// metric.
func (t *Throttle) Fail(reason string, keys ...string) {
	if t == nil {
		return
	}
	t.failures.WithLabelValues(reason).Inc()
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		if k == "" {
			continue
		}
		b, ok := t.buckets[k]
		if !ok {
			b = t.insert(k, now)
		}
		t.fail(b, k, reason, now)
	}
}

// find is k's bucket; the overflow bucket when k is not held and the table
// is full; nil when k is not held and there is room. Under mu.
func (t *Throttle) find(k string) *bucket {
	if b, ok := t.buckets[k]; ok {
		return b
	}
	if len(t.buckets) >= t.cfg.MaxEntries {
		return &t.overflow
	}
	return nil
}

// insert adds a bucket for k (the overflow one if the table stays full
// after forgetting quiet buckets, at most once a second). Under mu.
func (t *Throttle) insert(k string, now time.Time) *bucket {
	if len(t.buckets) >= t.cfg.MaxEntries {
		if now.Sub(t.lastSweep) < time.Second {
			return &t.overflow
		}
		t.lastSweep = now
		for key, b := range t.buckets {
			if t.quiet(b, now) {
				delete(t.buckets, key)
			}
		}
		if len(t.buckets) >= t.cfg.MaxEntries {
			return &t.overflow
		}
	}
	b := &bucket{windowStart: now}
	t.buckets[k] = b
	return b
}

// quiet: b can be forgotten.
func (t *Throttle) quiet(b *bucket, now time.Time) bool {
	keep := t.cfg.Window
	if b.strikes > 0 {
		keep = t.cfg.MaxBlock
	}
	return now.After(b.blockedUntil) && now.Sub(b.last) > keep
}

// fail records one failure in b. Under mu.
func (t *Throttle) fail(b *bucket, k, reason string, now time.Time) {
	if t.quiet(b, now) {
		*b = bucket{lastLog: b.lastLog}
	}
	if now.Sub(b.windowStart) > t.cfg.Window {
		b.fails, b.windowStart = 0, now
	}
	b.fails++
	b.last = now
	// A first block after Failures failures; once blocked, every further
	// checked failure blocks again, twice as long.
	if b.fails < t.cfg.Failures && b.strikes == 0 {
		return
	}
	block := t.cfg.BaseBlock << min(b.strikes, 30)
	if block <= 0 || block > t.cfg.MaxBlock {
		block = t.cfg.MaxBlock
	}
	b.strikes++
	b.fails = 0
	b.blockedUntil = now.Add(block)
	if now.Sub(b.lastLog) >= t.cfg.LogInterval {
		b.lastLog = now
		bucketName := k
		if b == &t.overflow {
			bucketName = "overflow"
		}
		// The bucket is an address or a key prefix (the 6 characters the
		// 401 shows), never a key.
		t.log.Warn(t.what+" failures: throttling", "bucket", bucketName, "reason", reason,
			"blocks", b.strikes, "blocked_for", block)
	}
}

// AddrKey is the bucket of a client address: the address, IPv6 by /64.
func AddrKey(ip netip.Addr) string {
	if !ip.IsValid() {
		return ""
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return "addr:" + p.String()
	}
	return "addr:" + ip.String()
}

// PrefixKey is the bucket of a presented key's prefix: its first 6
// characters (what the 401 shows), for keys that look like tokenbus keys;
// "" for others.
func PrefixKey(secret, keyPrefix string) string {
	if !strings.HasPrefix(secret, keyPrefix) || len(secret) < 16 {
		return ""
	}
	return "prefix:" + secret[:6]
}

// ThrottledError is the 429 for a blocked client: Retry-After is the rest of
// the block, rounded up.
func ThrottledError(d time.Duration) *schemas.Error {
	secs := int(math.Ceil(d.Seconds()))
	return schemas.ErrTooManyAuthFailures.New(secs).WithRetryAfter(secs)
}

// ClientAddr is the request's client address: the TCP peer, or, when the
// peer is one of trusted (a reverse proxy), the rightmost address of
// X-Forwarded-For that is not trusted. X-Forwarded-For from anyone else is
// ignored: clients could name any address.
func ClientAddr(c *fiber.Ctx, trusted []netip.Prefix) netip.Addr {
	peer, _ := netip.AddrFromSlice(c.Context().RemoteIP())
	peer = peer.Unmap()
	if len(trusted) == 0 || !inAny(peer, trusted) {
		return peer
	}
	xff := c.Get(fiber.HeaderXForwardedFor)
	for xff != "" {
		var hop string
		if i := strings.LastIndexByte(xff, ','); i >= 0 {
			hop, xff = xff[i+1:], xff[:i]
		} else {
			hop, xff = xff, ""
		}
		ip, err := netip.ParseAddr(strings.TrimSpace(hop))
		if err != nil {
			return peer // a garbled list: the proxy is the best we know
		}
		ip = ip.Unmap()
		if !inAny(ip, trusted) {
			return ip
		}
		peer = ip
	}
	return peer
}

func inAny(ip netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// ParseTrustedProxies reads a comma-separated list of addresses and CIDR
// prefixes ("10.0.0.0/8,127.0.0.1").
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if strings.Contains(f, "/") {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return nil, err
			}
			out = append(out, p.Masked())
			continue
		}
		ip, err := netip.ParseAddr(f)
		if err != nil {
			return nil, err
		}
		ip = ip.Unmap()
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out, nil
}
