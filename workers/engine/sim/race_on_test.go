//go:build race

package sim

// Allocation counts are not meaningful under the race detector.
const raceEnabled = true
