package schemas

import "testing"

func TestParseBand(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Band
		ok   bool
	}{
		{"", BandInteractive, true}, {"critical", BandCritical, true}, {"Interactive", BandInteractive, true},
		{"BATCH", BandBatch, true}, {"urgent", BandInteractive, false}, {"0", BandInteractive, false},
	} {
		b, ok := ParseBand(tc.in)
		if b != tc.want || ok != tc.ok {
			t.Errorf("ParseBand(%q) = %v, %v; want %v, %v", tc.in, b, ok, tc.want, tc.ok)
		}
	}
	for b := BandCritical; b < NumBands; b++ {
		if got, ok := ParseBand(b.String()); !ok || got != b {
			t.Errorf("%v does not round-trip: %v %v", b, got, ok)
		}
	}
}

func TestParseWeight(t *testing.T) {
	for in, want := range map[string]int{"": 1, "3": 3, "1000": 1000, "1001": 1, "0": 1, "-2": 1, "x": 1} {
		if got := ParseWeight(in); got != want {
			t.Errorf("ParseWeight(%q) = %d, want %d", in, got, want)
		}
	}
}
