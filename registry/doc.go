// Package registry is tokenbus's control-plane state in Redis: the models
// and LoRA adapters that exist, API keys (stored as hashes), rate-limit
// windows, usage counters and tenants' quotas. Gateways and dispatchers read
// models through a Cache, keys through a KeyCache and quotas through a
// QuotaCache, so serving goes on while Redis is down.
//
// The calls on a request's path (key lookups, limit checks, usage writes)
// go through the store's Breaker, if it has one: a bounded wait each, and
// after repeated failures none at all until a probe finds Redis back.
//
// The Redis is a single node, a Sentinel-watched master or a Redis Cluster
// (Topology, topology.go; Valkey as well). The keys are laid out for
// Cluster (layout.go; the table with who writes each is docs/redis.md):
// every key of one API key's state carries its id as the hash tag, so the
// scripts on a request's path (admission, usage) touch one slot and spread
// over the shards by key, and what spans keys (listings, usage across keys)
// reads small index sets and then each key's own keys. Usage records and
// API keys' creation and deletion wait for replicas (WAIT, durable.go)
// before they count as written, so that a master's loss loses none of them.
//
// Tokenbus imports: schemas.
package registry
