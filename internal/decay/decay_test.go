package decay

import (
	"math"
	"testing"
	"time"
)

func TestRate(t *testing.T) {
	const hl = 10 * time.Second
	now := time.Unix(1000, 0)
	var r Rate
	for range 1000 { // 10 events a second for 100 s: ten half-lives
		now = now.Add(100 * time.Millisecond)
		r.Count(now, hl)
	}
	if v := r.Now(now, hl); v < 9.6 || v > 10.4 {
		t.Fatalf("steady 10/s reads %.2f", v)
	}
	v0 := r.Now(now, hl)
	if v := r.Now(now.Add(hl), hl); math.Abs(v-v0/2) > 1e-9 {
		t.Fatalf("a half-life later %.4f, want %.4f", v, v0/2)
	}
	if v := r.Now(now.Add(-time.Second), hl); v != r.V {
		t.Fatalf("before At: %.4f, want the rate as of At %.4f", v, r.V)
	}
}
