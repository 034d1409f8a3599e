// Package dispatcher routes requests to workers. Any number of dispatchers
// share the request subjects in a queue group; each keeps its own live view of
// the workers (a fleet.Fleet) from heartbeats and done notices, forwards every
// request to a worker serving its model, the least loaded or, for a prompt
// whose prefix a worker probably holds in its KV cache, that one when it is
// not much busier (prefix.go, docs/routing.md; the request then carries what
// the dispatcher predicts that worker holds, schemas.HdrPrefixCached), and queues it
// when every such worker is full: queued requests leave in flow control's
// order (package scheduler, flow.go, docs/scheduling.md: strict priority
// bands, tenants sharing each band by weight and by cost), and one that
// cannot start before its deadline is refused at once. It counts
// requests per LoRA adapter (a decayed rate, placement.go): a request whose
// adapter must evict another to load goes to the worker whose coldest idle
// adapter is coldest (fleet.Fleet.AdapterRate). With Config.Placement on it
// also places adapters by demand: it loads hot ones onto more workers,
// unloading cold spare replicas. Its per-model
// gauges (queue depth, workers, running) are read at each scrape for every
// model it knows, so an autoscaler reads 0, not nothing, while it is idle.
//
// Tokenbus imports: fleet, internal/decay, internal/tracing, registry, scheduler, schemas.
package dispatcher
