package registry

import "strconv"

// The registry's Redis keys, laid out for Redis Cluster (docs/redis.md has
// the table, with who writes each). A Cluster runs a script or a MULTI only
// on keys of one hash slot, and the slot of a key with braces is the slot
// of what the first pair of braces holds: so every key of one API key's
// state carries that key's id as its tag, {<key id>}, and the scripts and
// transactions on a request's path (admission, usage with its
// de-duplication, a key's deletion) touch one API key's keys only. The rest
// is one key each (the models, the quotas, two indexes), each in a slot of
// its own, never touched together with another in one command.
//
// What spans API keys (listing them, usage across keys) reads an index set
// and then each key's own keys, pipelined (go-redis sends each node its
// part). The indexes are written before the record they point to and
// cleared after it is deleted, and readers skip an index entry whose record
// is missing: a crash between two writes leaves an entry no reader shows,
// never a record no index finds. The record is the commit point.
//
// Every name starts with "tokenbus:"; the layout before Cluster support put
// everything under the one tag {tokenbus} ("{tokenbus}:keys" and so on),
// which `tokenbus redis migrate` copies from (migrate.go).
const (
	// keyModels is a hash: model name -> Model JSON.
	keyModels = "tokenbus:models"
	// keyQuotas is a hash: tenant -> Quotas JSON.
	keyQuotas = "tokenbus:quotas"
	// keyIndex is a set: the id of every API key.
	keyIndex = "tokenbus:keys"
	// keyUsageIndex is a set: the id of every API key with usage (usage
	// outlives its key, for billing).
	keyUsageIndex = "tokenbus:usage:keys"
)

// tagged is the prefix of every key of API key id's state: its id as the
// hash tag. Key ids are tokenbus's own ("key_" + hex, or AnonymousKey), but
// even an id with a brace in it keeps all its keys in one slot: they all
// begin with this same prefix, so the first brace pair is the same.
func tagged(id string) string { return "tokenbus:key:{" + id + "}" }

// recordKey is a string: the API key's record, JSON (with its secret's hash).
func recordKey(id string) string { return tagged(id) }

// secretKey is a string: the id of the API key whose secret hashes to hash.
// Its tag is the hash: a lookup by secret knows nothing else.
func secretKey(hash string) string { return "tokenbus:secret:{" + hash + "}" }

// rateKey is a hash: the API key's rate-limit window (w, r, t).
func rateKey(id string) string { return tagged(id) + ":rl" }

// admittedKey is a hash: one tenant request's admission (Readmit).
func admittedKey(keyID, requestID string) string { return tagged(keyID) + ":adm:" + requestID }

// usageKey is a hash: the API key's usage, "<counter>|<model>" -> count.
func usageKey(id string) string { return tagged(id) + ":usage" }

// hourlyKey is a hash: the API key's usage in the hours of one day,
// "<unix hour>|<counter>|<model>" -> count.
func hourlyKey(id string, day int64) string {
	return tagged(id) + ":hourly:" + strconv.FormatInt(day, 10)
}

// seenSet is a set: the request ids of the API key's usage records counted
// in one period of UsageSeenTTL, which a redelivered record is checked
// against. It shares the tag, so the check, the counting and the mark are
// one script: one unit on the master and in its replication stream, so a
// replica has the counts and the marks together or neither.
func seenSet(id string, period int64) string {
	return tagged(id) + ":seen:" + strconv.FormatInt(period, 10)
}
