package decay

import (
	"math"
	"time"
)

// Rate is a decayed count of events per second: V as of At.
type Rate struct {
	V  float64
	At time.Time
}

// Now is the rate decayed to now.
func (r Rate) Now(now time.Time, halfLife time.Duration) float64 {
	if dt := now.Sub(r.At); dt > 0 {
		return r.V * math.Exp2(-float64(dt)/float64(halfLife))
	}
	return r.V
}

// Count adds one event at now. Each adds ln 2 / halfLife (the inverse of
// the mean life), so that a steady r events per second reads r.
func (r *Rate) Count(now time.Time, halfLife time.Duration) {
	r.V = r.Now(now, halfLife) + math.Ln2/halfLife.Seconds()
	r.At = now
}
