package bench

import (
	"slices"
	"testing"
)

func TestAdapterPicks(t *testing.T) {
	if adapterPicks(&config{}, 10) != nil {
		t.Fatal("picks without --adapters")
	}
	cfg := &config{adapters: 50, adapterZipf: 1.1, seed: 7}
	picks := adapterPicks(cfg, 5000)
	count := make([]int, 51)
	for _, k := range picks {
		if k < 1 || k > 50 {
			t.Fatalf("adapter %d out of 1..50", k)
		}
		count[k]++
	}
	// Zipf: the first adapter is the most asked for, and far more than the last.
	if slices.Max(count) != count[1] || count[1] < 10*count[50] {
		t.Fatalf("not Zipf-like: first %d, last three %v", count[1], count[48:])
	}
	if !slices.Equal(picks, adapterPicks(cfg, 5000)) {
		t.Fatal("not reproducible with one seed")
	}
	for _, bad := range []config{{adapters: -1}, {adapters: 5, adapterZipf: 1}, {adapters: 5, adapterZipf: 2, endpoint: "embeddings"}} {
		c := bad
		c.concurrency, c.numPrompts, c.timeout, c.rounds = 1, 1, 1, 1
		if c.endpoint == "" {
			c.endpoint = "chat"
		}
		if c.validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
