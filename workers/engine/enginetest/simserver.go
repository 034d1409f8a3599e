package enginetest

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/workers/engine/sim"
	"github.com/tokenbus/tokenbus/workers/engine/sim/simserver"
)

// SimConfig is the sim engine the suite runs against, in-process or behind
// SimServer: serving model, a millisecond per decode step (a request of a
// few tokens takes milliseconds, one of thousands seconds), no prefill time,
// adapters that load at once.
func SimConfig(model string) sim.Config {
	c := sim.DefaultConfig()
	c.Model = model
	c.PrefillBase, c.PrefillPerToken, c.DecodePerSeq, c.AdapterLoadTime = 0, 0, 0, 0
	c.DecodeBase = time.Millisecond
	return c
}

// SimServer serves a sim engine of sc behind tokenbus's sim-server (vLLM's
// HTTP API, package simserver) on a loopback port and returns its root URL:
// the server the HTTP engines run the suite against. Both stop with the
// test.
func SimServer(t testing.TB, sc sim.Config, cfg simserver.Config) string {
	t.Helper()
	eng, err := sim.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(simserver.New(cfg, eng, nil))
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		eng.Close()
	})
	return hs.URL
}
