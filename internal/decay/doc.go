// Package decay is an exponentially decayed event rate: each event counts
// half as much a half-life later, so a steady r events per second reads r.
// Adapter demand is counted so, by dispatchers (placement, and the choice
// of a worker to load on) and by workers (which adapter to evict).
//
// Tokenbus imports: none.
package decay
