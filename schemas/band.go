package schemas

import (
	"strconv"
	"strings"
)

// Band is a priority band of flow control (docs/scheduling.md): every
// queued request of a higher band goes before any of a lower one. Within a
// band, tenants share the capacity by weight.
type Band uint8

// The bands, highest first. The zero value is no band: a reader takes it as
// BandDefault, so that a request nobody classified is never critical.
const (
	BandCritical Band = iota + 1
	BandInteractive
	BandBatch
	NumBands // one past the last: arrays indexed by Band have this length
)

// BandDefault is the band of a request whose key or sender names none.
const BandDefault = BandInteractive

var bandNames = [NumBands]string{"", "critical", "interactive", "batch"}

func (b Band) String() string {
	if b > 0 && b < NumBands {
		return bandNames[b]
	}
	return "band(" + strconv.Itoa(int(b)) + ")"
}

// Valid reports whether b is one of the bands.
func (b Band) Valid() bool { return b > 0 && b < NumBands }

// ParseBand reads a band's name; "" is BandDefault. ok is false for any
// other string.
func ParseBand(s string) (b Band, ok bool) {
	if s == "" {
		return BandDefault, true
	}
	for i, n := range bandNames[1:] {
		if strings.EqualFold(s, n) {
			return Band(i + 1), true
		}
	}
	return BandDefault, false
}

// BandNames lists the bands' names, highest first (for messages and docs).
func BandNames() []string { return bandNames[1:] }

// MaxWeight bounds a flow's weight (HdrWeight, an API key's weight).
const MaxWeight = 1000

// ParseWeight reads HdrWeight: an integer in 1..MaxWeight; anything else
// (absent, malformed, out of range) is 1.
func ParseWeight(v string) int {
	if v == "" {
		return 1
	}
	w, err := strconv.Atoi(v)
	if err != nil || w < 1 || w > MaxWeight {
		return 1
	}
	return w
}
