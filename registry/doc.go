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
// Every Redis key carries the hash tag {tokenbus}, so all of it lives in one
// slot of a Redis Cluster and multi-key transactions and scripts work there.
// The control plane is small and its write rate is about one script call per
// LLM request (admit) and one per finished request (usage), far below what
// one shard serves.
//
// Tokenbus imports: schemas.
package registry
