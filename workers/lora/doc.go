// Package lora is the one LoRA adapter manager of a worker: every engine's
// adapters are loaded and unloaded through a Manager. An engine only
// provides the primitives, engine.Adapters (LoadAdapter, UnloadAdapter),
// and says what it has loaded and how many slots it has
// (engine.Stats().Adapters and MaxLoras); the Manager adds the rest:
//
//   - A request for an adapter the engine lacks, with the adapter's path
//     (from the registry, through the dispatcher), loads it before it runs.
//     There is at most one operation (load or unload) per adapter at a
//     time, and every caller that wants the adapter meanwhile waits for it
//     and shares its result. A load runs apart from the caller that started
//     it (the others must not fail because that one gave up), bounded by
//     Config.LoadTimeout.
//   - When the engine's slots (Stats().MaxLoras; 0: no limit) are all taken
//     (loaded adapters and loads in progress), the adapter with the lowest
//     request rate (requests/s, exponentially decayed with a 10 s
//     half-life, Config.HalfLife) that no request is running on or waiting
//     for is evicted first, the least recently used of equal rates. By rate,
//     not recency: with more adapters than slots, one asked for steadily
//     stays while one-off requests for the rest take turns in the coldest
//     slot, where a least-recently-used choice lets a string of one-offs
//     push it out (docs/routing.md has the measurement). When every loaded
//     adapter has requests running, the caller waits until one is free (or
//     its context ends): an adapter is never pulled from under a running
//     request, and the cap is never exceeded. This is the one policy, for
//     every engine.
//   - Config.Changed is called when a load starts (Loading lists it, so a
//     heartbeat sent now sends the next requests for it here), when it ends
//     and when an adapter is unloaded.
//
// The engine's own list of loaded adapters is the truth; the Manager keeps
// only what the engine does not know: uses, request rates, recency and the
// operations in progress. Adapters loaded behind its back, or by a control
// load no request has used yet, count as never asked for.
//
// Tokenbus imports: internal/decay, schemas, workers/engine.
package lora
