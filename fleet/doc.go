// Package fleet is the live view of tokenbus's workers: who is up, what each
// serves (models, LoRA adapters loaded and loading, slots), how loaded it is,
// and whether it drains. A Fleet is built from the workers' heartbeats and
// done notices (Watch subscribes to both; a dispatcher feeds its own Fleet from
// its subscriptions) and forgets a worker whose heartbeats stop.
//
// One Fleet, one mutex. Choosing a worker and counting one more request on it
// must be one step, or two routing decisions at once would both see the same
// free slot; so the selection (Acquire, AcquireAdapter) lives here, beside the
// load estimates and the adapter loads a Fleet's owner caused and no heartbeat
// has confirmed yet (pending loads) and the adapters it routed requests for
// lately (in use there: no eviction victim), and the record of which prompt blocks
// each worker's prefix cache probably holds (prefix.go, kvevents.go: fed by
// the owner's routing and the workers' KV events).
//
// Everything else only reads: gateways (/ready, /v1/models, 404 or 503) and the
// admin API (GET /workers, model status, adapter unloads) take a View, which
// *Fleet implements, and never reach into a dispatcher.
//
// Imports: schemas (heartbeats, done notices, subjects) and nats.go (Watch);
// nothing else of tokenbus. Dispatcher, gateway, admin and the programs import
// fleet, never the other way.
//
// Tokenbus imports: schemas.
package fleet
