// Package scheduler is flow control's policy (docs/scheduling.md): which
// queued request goes next when a worker frees a slot. It is a pure,
// deterministic core: no NATS, no clock of its own, no goroutines; the
// dispatcher feeds it events (Push, Pop, Remove, Expire, Settle) under its
// lock and carries out what it decides.
//
// Every request belongs to a flow: its tenant within a priority band
// (schemas.Band). Bands are strict: nothing of a lower band leaves while a
// higher one has items. Within a band, flows share what is served in
// proportion to their weights, by cost rather than by count, with
// start-time fair queueing (Goyal, Vin and Cheng, 1996): each flow carries
// a virtual start tag that grows by cost/weight for each request served;
// the backlogged flow with the smallest tag goes next; a flow that becomes
// backlogged starts at the band's virtual time (the tag of the latest
// request served), so idle time earns no credit. Costs are estimates, and
// Settle corrects a flow's tag once the real cost is known. Within a flow,
// requests go by their own priority, then first come first served.
//
// A full queue makes room by evicting the newest request of the flow that
// holds the most of it for its weight, in the lowest band: one tenant
// cannot fill the queue against the others.
//
// Tokenbus imports: schemas.
package scheduler
