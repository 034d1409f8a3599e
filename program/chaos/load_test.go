package chaos

import (
	"strings"
	"testing"
	"time"
)

func TestTally(t *testing.T) {
	ref := strings.Fields("a b c d e f")
	for _, tc := range []struct {
		name      string
		got       string
		lost, dup int
	}{
		{"exact", "a b c d e f", 0, 0},
		{"cut short", "a b c", 3, 0},
		{"a token skipped", "a b d e f", 1, 0},
		{"a stretch repeated", "a b c d c d e f", 0, 2},
		{"restarted from the beginning", "a b c a b c d e f", 0, 3},
		{"skipped and repeated", "a b b d e f", 1, 1},
		{"nothing", "", 6, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lost, dup := tally(ref, strings.Fields(tc.got))
			if lost != tc.lost || dup != tc.dup {
				t.Errorf("tally = lost %d, dup %d; want %d, %d", lost, dup, tc.lost, tc.dup)
			}
		})
	}
}

func TestErrorCode(t *testing.T) {
	for _, tc := range []struct {
		body   string
		code   string
		shaped bool
	}{
		{`{"error":{"message":"worker went silent","type":"server_error","code":"stream_lost"}}`, "stream_lost", true},
		{`{"error":{"message":"x","type":"server_error","code":null}}`, "no_code", false},
		{`{"error":{"message":"x","code":"queue_full"}}`, "queue_full", false},
		{`Service Unavailable`, "not_json", false},
		{`{"detail":"nope"}`, "not_json", false},
	} {
		code, shaped := errorCode([]byte(tc.body))
		if code != tc.code || shaped != tc.shaped {
			t.Errorf("errorCode(%s) = %q, %v; want %q, %v", tc.body, code, shaped, tc.code, tc.shaped)
		}
	}
}

func TestLongestGap(t *testing.T) {
	t0 := time.Unix(0, 0)
	s := &stream{events: []time.Time{t0, t0.Add(10 * time.Millisecond), t0.Add(3 * time.Second), t0.Add(3010 * time.Millisecond)}}
	if g := s.longestGap(); g != 2990*time.Millisecond {
		t.Errorf("longestGap = %v, want 2.99s", g)
	}
	if g := (&stream{}).longestGap(); g != 0 {
		t.Errorf("no events: longestGap = %v, want 0", g)
	}
}
