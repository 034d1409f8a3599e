// Package gctune sets the Go collector's GOGC after every collection from
// the live heap: a small heap gets a large GOGC (few collections, cheap for a
// streaming server that makes short-lived garbage at every token), a large
// heap a small one, so that the heap grows past the live data by a bounded
// amount, not by a multiple of it. A fixed GOGC of 400 cost tokenbus dev
// 276 MB of resident memory at 256 streams, for a live heap of 64 MB.
//
// Tokenbus imports: none.
package gctune
