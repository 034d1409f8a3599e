package gateway

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// fakeClock is a throttle's time, moved by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func newTestThrottle(cfg ThrottleConfig) (*Throttle, *fakeClock) {
	th := NewThrottle(cfg, "API key", "openai", nil, nil)
	c := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	th.now = c.now
	return th, c
}

// The blocks: none before Failures failures, then BaseBlock, doubling with
// each failure after a block, capped at MaxBlock; forgotten after MaxBlock
// of quiet.
func TestThrottleBacksOffExponentially(t *testing.T) {
	th, clock := newTestThrottle(ThrottleConfig{Failures: 3, Window: time.Minute, BaseBlock: time.Second, MaxBlock: 10 * time.Second})
	const a = "addr:192.0.2.1"
	for i := range 2 {
		th.Fail("unknown_key", a)
		if d := th.Blocked(a); d != 0 {
			t.Fatalf("blocked after %d failures", i+1)
		}
	}
	th.Fail("unknown_key", a)
	var blocks []time.Duration
	for range 6 {
		d := th.Blocked(a)
		blocks = append(blocks, d)
		clock.add(d) // wait the block out, then fail once more
		if th.Blocked(a) != 0 {
			t.Fatal("still blocked after the block")
		}
		th.Fail("unknown_key", a)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	if fmt.Sprint(blocks) != fmt.Sprint(want) {
		t.Fatalf("blocks %v, want %v", blocks, want)
	}
	if th.Blocked("addr:192.0.2.2") != 0 {
		t.Fatal("another address blocked")
	}
	// Quiet for longer than MaxBlock past the block: forgotten, the next
	// failures start from scratch.
	clock.add(th.Blocked(a) + 11*time.Second)
	th.Fail("unknown_key", a)
	if th.Blocked(a) != 0 {
		t.Fatal("a forgotten address blocked at its first failure")
	}
}

// An attacker rotating addresses does not grow the table past MaxEntries;
// the addresses it cannot hold share the overflow bucket, which blocks.
func TestThrottleBoundedMemory(t *testing.T) {
	th, clock := newTestThrottle(ThrottleConfig{Failures: 5, MaxEntries: 100})
	for i := range 100_000 {
		th.Fail("unknown_key", fmt.Sprintf("addr:10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
		if i%1000 == 0 {
			clock.add(2 * time.Second) // let sweeps run: nothing is quiet yet
		}
	}
	if n := th.Len(); n > 100 {
		t.Fatalf("%d buckets, cap 100", n)
	}
	if th.Blocked("addr:198.51.100.1") == 0 {
		t.Fatal("a new address is not throttled while the table is full of failing ones")
	}
	// Once the failing addresses are quiet, a sweep makes room again.
	clock.add(time.Hour)
	th.Fail("unknown_key", "addr:198.51.100.1")
	if n := th.Len(); n != 1 {
		t.Fatalf("%d buckets after the sweep, want 1", n)
	}
}

func TestAddrKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.1":               "addr:192.0.2.1",
		"::ffff:192.0.2.1":        "addr:192.0.2.1",
		"2001:db8:1:2:3:4:5:6":    "addr:2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::9999": "addr:2001:db8:1:2::/64",
	} {
		if got := AddrKey(netip.MustParseAddr(in)); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

// X-Forwarded-For counts only from a trusted proxy, and then its rightmost
// untrusted address.
func TestClientAddr(t *testing.T) {
	trusted, err := ParseTrustedProxies("10.0.0.0/8, 127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	for _, tc := range []struct {
		peer, xff string
		trusted   []netip.Prefix
		want      string
	}{
		{"192.0.2.9", "198.51.100.1", trusted, "192.0.2.9"},             // not a proxy: XFF ignored
		{"192.0.2.9", "198.51.100.1", nil, "192.0.2.9"},                 // no proxies configured
		{"127.0.0.1", "198.51.100.1", trusted, "198.51.100.1"},          // the proxy's word
		{"127.0.0.1", "6.6.6.6, 198.51.100.1", trusted, "198.51.100.1"}, // the client's own XFF entry is not believed
		{"127.0.0.1", "6.6.6.6, 198.51.100.1, 10.1.2.3", trusted, "198.51.100.1"},
		{"127.0.0.1", "10.1.2.3", trusted, "10.1.2.3"}, // only proxies: the last one
		{"127.0.0.1", "garbage", trusted, "127.0.0.1"}, // unparsable: the peer
		{"127.0.0.1", "", trusted, "127.0.0.1"},        // none
		{"::ffff:127.0.0.1", "198.51.100.1", trusted, "198.51.100.1"},
	} {
		fctx := &fasthttp.RequestCtx{}
		fctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.ParseIP(tc.peer), Port: 1}, nil)
		if tc.xff != "" {
			fctx.Request.Header.Set("X-Forwarded-For", tc.xff)
		}
		c := app.AcquireCtx(fctx)
		if got := ClientAddr(c, tc.trusted); got.String() != tc.want {
			t.Errorf("peer %s, XFF %q: %s, want %s", tc.peer, tc.xff, got, tc.want)
		}
		app.ReleaseCtx(c)
	}
	if _, err := ParseTrustedProxies("10.0.0.0/33"); err == nil {
		t.Error("a bad prefix parsed")
	}
}

// A guesser that never stops (one attempt every 10 ms for an hour, with the
// default settings) gets its key checked 22 times: 10, then one after each
// block of 1 s, 2 s, ... 512 s, then one per 15 minutes. The other attempts
// are refused unchecked.
func TestThrottleGuessRate(t *testing.T) {
	th, clock := newTestThrottle(ThrottleConfig{})
	const a, p = "addr:192.0.2.1", "prefix:tb-abc"
	start := clock.t
	checked, refused := 0, 0
	for clock.t.Sub(start) < time.Hour {
		if th.Blocked(a, p) > 0 {
			refused++
		} else {
			checked++
			th.Fail("unknown_key", a, p)
		}
		clock.add(10 * time.Millisecond)
	}
	if checked != 22 {
		t.Fatalf("%d guesses checked in an hour (%d refused), want 22", checked, refused)
	}
	t.Logf("an hour of guessing every 10 ms: %d checked, %d refused", checked, refused)
}
