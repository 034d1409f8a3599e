package registry

import (
	"cmp"
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/schemas"
)

// Rate limits are counted in fixed one-minute windows (Unix time / 60 s on
// Redis's clock, so every gateway replica agrees on the window), one small
// hash per key: w (the window), r (requests admitted in it), t (tokens
// counted in it), expiring a minute after its window.
//
// Admission reserves: the script that checks a request also counts its
// prompts in r and its reservation in t (Admission: the prompt's estimate
// plus the most it may generate), so replicas never admit more than RPM and
// concurrent requests see each other's tokens at once. A request is admitted
// while r + prompts <= RPM and t < TPM, so t exceeds TPM by at most one
// request's reservation. When the request ends, Record settles: it adds
// actual − reserved to the reservation's window if that window is still the
// current one (a past window's count no longer matters). A request that
// never ends with usage keeps its reservation until the window ends. Fixed
// windows let a burst of up to 2x the limit straddle a window boundary; that
// is the usual trade for exact, cheap counting with an exact reset time.
// The window is rateKey(id) (layout.go).

// Limiter checks and counts rate limits and records usage. Its zero Now uses
// Redis's clock; tests pin it.
type Limiter struct {
	store *Store
	Now   func() time.Time

	// indexed is the key ids RecordBatch has put in the usage index, so
	// that a batch writes the index (one master, and a round trip) only
	// for keys new to this process; cleared when it holds maxIndexed.
	mu      sync.Mutex
	indexed map[string]struct{}
}

// maxIndexed bounds Limiter.indexed (about 10 MB of ids).
const maxIndexed = 100_000

// NewLimiter makes a limiter on store.
func NewLimiter(store *Store) *Limiter { return &Limiter{store: store} }

// Decision is the outcome of Admit, with what the x-ratelimit-* headers say.
type Decision struct {
	Allowed  bool
	Exceeded string        // "requests" or "tokens" when refused
	RPM, TPM int           // the key's limits (0: none)
	Requests int           // requests counted in the window, this one included if allowed
	Tokens   int           // tokens counted in the window before this request's reservation
	Reset    time.Duration // until the window ends and both counts start over
	// Reserved is what an allowed request reserved against TPM in Window
	// (0: nothing, e.g. a key without limits): what Record settles.
	Reserved int
	Window   int64
}

// RemainingRequests is what the key may still send in the window.
func (d Decision) RemainingRequests() int { return max(d.RPM-d.Requests, 0) }

// RemainingTokens is what the key may still use in the window.
func (d Decision) RemainingTokens() int { return max(d.TPM-d.Tokens, 0) }

// nowLua sets now (ms) from ARGV[1], or from Redis's clock when it is empty.
// Scripts that read TIME and then write need effect replication, which Redis
// 7 always uses and older Redis turns on with replicate_commands.
const nowLua = `
local now = tonumber(ARGV[1])
if not now then
  if redis.replicate_commands then pcall(redis.replicate_commands) end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local win = math.floor(now / 60000)
local reset = (win + 1) * 60000 - now
`

// admitScript: KEYS[1] the key's rate hash, KEYS[2] (optional) the
// request's admission record; ARGV now (ms or ""), rpm, tpm, requests
// (prompts), tokens to reserve, the record's lifetime (ms). Returns
// {refused: 0 no, 1 requests, 2 tokens; requests; tokens before the
// reservation; reset ms; window}.
var admitScript = redis.NewScript(nowLua + `
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local n, reserve = tonumber(ARGV[4]), tonumber(ARGV[5])
local v = redis.call('HMGET', KEYS[1], 'w', 'r', 't')
local r, t = 0, 0
if tonumber(v[1]) == win then
  r, t = tonumber(v[2]) or 0, tonumber(v[3]) or 0
end
if rpm > 0 and r + n > rpm then return {1, r, t, reset, win} end
if tpm > 0 and t >= tpm then return {2, r, t, reset, win} end
redis.call('HSET', KEYS[1], 'w', win, 'r', r + n, 't', t + reserve)
redis.call('PEXPIRE', KEYS[1], reset + 60000)
if KEYS[2] then
  redis.call('HSET', KEYS[2], 'w', win, 'res', reserve, 'n', 0)
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
end
return {0, r + n, t, reset, win}
`)

// Admission is what one request asks of a key's limits.
type Admission struct {
	Requests int // counted against RPM: its prompts (at least 1)
	Tokens   int // reserved against TPM: the most it may use
	// RequestID, when set (a dispatcher's tenant request), keeps an
	// allowed admission under the request's id for ReadmitTTL, so that
	// Readmit lets the same request in again without counting it twice.
	RequestID string
}

// A request its client sends again after its worker failed (a retry before
// its first token, a migration after: client/failover.go) is the same
// request: Readmit lets it in on its first admission's count and
// reservation, at most MaxReadmits times within ReadmitTTL of that
// admission (the client package's default migration limit is 3; a stream
// may run for minutes before its worker fails). A sending past either is
// counted as a new request. The record is a small hash per admitted tenant
// request of a limited key, admittedKey (layout.go), in its key's slot.
const (
	ReadmitTTL  = 10 * time.Minute
	MaxReadmits = 3
)

// readmitScript: KEYS[1] the request's admission record; ARGV[1] the most
// readmissions. Returns {0} (not found, or readmitted too often) or {1,
// window, reserved}.
var readmitScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'w', 'res', 'n')
if not v[1] then return {0} end
if (tonumber(v[3]) or 0) >= tonumber(ARGV[1]) then return {0} end
redis.call('HINCRBY', KEYS[1], 'n', 1)
return {1, tonumber(v[1]), tonumber(v[2]) or 0}
`)

// Readmit lets request requestID of key k in again, counted and reserved
// as its first admission was (see MaxReadmits): ok is true and the
// decision carries that admission's Reserved and Window, for the usage
// record that settles it. ok false: admit it as a new request. A key
// without limits is never recorded, and needs nothing: ok false.
func (l *Limiter) Readmit(ctx context.Context, k Key, requestID string) (d Decision, ok bool, err error) {
	d = Decision{Allowed: true, RPM: k.RPM, TPM: k.TPM}
	if !k.Limited() || requestID == "" {
		return d, false, nil
	}
	var res []int64
	err = l.store.br.Do(ctx, func(ctx context.Context) error {
		var err error
		res, err = readmitScript.Run(ctx, l.store.rdb, []string{admittedKey(k.ID, requestID)}, MaxReadmits).Int64Slice()
		return storeErr(err)
	})
	if err != nil || len(res) < 3 || res[0] != 1 {
		return d, false, err
	}
	d.Window, d.Reserved = res[1], int(res[2])
	return d, true, nil
}

// PromptBytesPerToken is the estimate of a prompt's tokens at admission:
// one per 4 bytes of the request body (JSON syntax included, so it errs
// high for text; settling corrects it when the real count arrives).
const PromptBytesPerToken = 4

// AdmissionOf is what req reserves: n prompts count n requests, and it
// reserves its body's bytes / PromptBytesPerToken for the prompts plus
// prompts × n (choices) × its max_tokens (or max_completion_tokens) for the
// completions, maxTokens when it sets neither. maxTokens also caps it: a
// request cannot generate more than its model's context. A request that
// generates nothing (embeddings: one request per input; tokenize,
// detokenize) reserves its prompt estimate only.
func AdmissionOf(req *schemas.Request, maxTokens int) Admission {
	prompts := 1
	switch req.Kind {
	case schemas.KindCompletion:
		prompts = max(req.Prompt.Len(), 1)
	case schemas.KindEmbedding:
		prompts = max(req.Input.Len(), 1)
	}
	promptEst := (len(req.Body) + PromptBytesPerToken - 1) / PromptBytesPerToken
	if !req.Kind.Generates() {
		return Admission{Requests: prompts, Tokens: promptEst}
	}
	gen := req.MaxTokens
	if gen <= 0 || maxTokens > 0 && gen > maxTokens {
		gen = maxTokens
	}
	return Admission{Requests: prompts, Tokens: promptEst + prompts*max(req.N, 1)*max(gen, 0)}
}

// Admit checks the key's limits and, if the request is allowed, counts its
// requests and reserves its tokens (Decision.Reserved, .Window: hand them
// to Record in the usage record). A key without limits is allowed without
// asking Redis. An error means Redis did not answer (ErrUnavailable): the
// caller decides to fail open or closed.
func (l *Limiter) Admit(ctx context.Context, k Key, a Admission) (Decision, error) {
	d := Decision{Allowed: true, RPM: k.RPM, TPM: k.TPM}
	if !k.Limited() {
		return d, nil
	}
	a.Requests = max(a.Requests, 1)
	a.Tokens = max(a.Tokens, 0)
	keys := []string{rateKey(k.ID)}
	if a.RequestID != "" {
		keys = append(keys, admittedKey(k.ID, a.RequestID))
	}
	var res []int64
	err := l.store.br.Do(ctx, func(ctx context.Context) error {
		var err error
		res, err = admitScript.Run(ctx, l.store.rdb, keys,
			l.now(), k.RPM, k.TPM, a.Requests, a.Tokens, ReadmitTTL.Milliseconds()).Int64Slice()
		return storeErr(err)
	})
	if err != nil {
		return d, err
	}
	d.Requests, d.Tokens, d.Reset = int(res[1]), int(res[2]), time.Duration(res[3])*time.Millisecond
	switch res[0] {
	case 0:
		d.Reserved, d.Window = a.Tokens, res[4]
	case 1:
		d.Allowed, d.Exceeded = false, "requests"
	case 2:
		d.Allowed, d.Exceeded = false, "tokens"
	}
	return d, nil
}

// recordScript records one API key's usage records of a batch, each counted
// once by its request id. All its keys carry the API key's tag (layout.go):
// KEYS[1] this period's set of recorded request ids, KEYS[2] the last
// period's, KEYS[3] the key's rate hash, KEYS[4] its usage hash, KEYS[5] its
// hourly usage of the day. ARGV[1] now (ms or ""), ARGV[2] the sets'
// lifetime (ms), ARGV[3] the hour (unix hours), ARGV[4] the hourly hash's
// lifetime (ms), ARGV[5] groups G, ARGV[6] records N; per group g (from 0:
// the records of one model and reservation window) ARGV[2g+7..2g+8]: model,
// the reservation's window (0: none reserved); per record i
// ARGV[6+2G+6i+1..+6]: its request id ("": not checked), its group (from
// 1), prompt tokens, completion tokens, tokens used (0: none to count),
// tokens reserved. Returns the records already counted. The checks cost two
// calls per script, not two per record: the embedded store of tokenbus dev
// makes buffers for every call.
var recordScript = redis.NewScript(nowLua + `
local G, N = tonumber(ARGV[5]), tonumber(ARGV[6])
local base = 6 + 2 * G
local ids, at, skip = {}, {}, {}
for i = 0, N - 1 do
  local id = ARGV[base + 6 * i + 1]
  if id ~= '' then
    ids[#ids + 1] = id
    at[#ids] = i
  end
end
if #ids > 0 then
  for _, set in ipairs({KEYS[1], KEYS[2]}) do
    local seen = redis.call('SMISMEMBER', set, unpack(ids))
    for j = 1, #ids do
      if seen[j] == 1 then skip[at[j]] = true end
    end
  end
end
local req, p, c, t, res = {}, {}, {}, {}, {}
for g = 1, G do req[g], p[g], c[g], t[g], res[g] = 0, 0, 0, 0, 0 end
local dups, once = 0, {}
for i = 0, N - 1 do
  local r = base + 6 * i
  local id = ARGV[r + 1]
  if skip[i] or (id ~= '' and once[id]) then
    dups = dups + 1
  else
    if id ~= '' then once[id] = true end
    local g = tonumber(ARGV[r + 2])
    req[g] = req[g] + 1
    p[g] = p[g] + tonumber(ARGV[r + 3])
    c[g] = c[g] + tonumber(ARGV[r + 4])
    t[g] = t[g] + tonumber(ARGV[r + 5])
    res[g] = res[g] + tonumber(ARGV[r + 6])
  end
end
local h = ARGV[3]
for g = 1, G do
  if req[g] > 0 then
    local a = 6 + 2 * (g - 1)
    local tokens, reserved = t[g], res[g]
    if reserved > 0 then
      if tonumber(ARGV[a + 2]) == win and tonumber(redis.call('HGET', KEYS[3], 'w')) == win then
        local n = redis.call('HINCRBY', KEYS[3], 't', tokens - reserved)
        if n < 0 then redis.call('HSET', KEYS[3], 't', 0) end
      end
    elseif tokens > 0 then
      if tonumber(redis.call('HGET', KEYS[3], 'w')) == win then
        redis.call('HINCRBY', KEYS[3], 't', tokens)
      else
        redis.call('HSET', KEYS[3], 'w', win, 'r', 0, 't', tokens)
      end
      redis.call('PEXPIRE', KEYS[3], reset + 60000)
    end
    local m = ARGV[a + 1]
    redis.call('HINCRBY', KEYS[4], 'requests|' .. m, req[g])
    redis.call('HINCRBY', KEYS[4], 'prompt_tokens|' .. m, p[g])
    redis.call('HINCRBY', KEYS[4], 'completion_tokens|' .. m, c[g])
    redis.call('HINCRBY', KEYS[5], h .. '|requests|' .. m, req[g])
    redis.call('HINCRBY', KEYS[5], h .. '|prompt_tokens|' .. m, p[g])
    redis.call('HINCRBY', KEYS[5], h .. '|completion_tokens|' .. m, c[g])
    redis.call('PEXPIRE', KEYS[5], ARGV[4])
  end
end
if #ids > 0 then
  -- Last: a script that failed above left no ids, so its retry counts.
  -- Every id goes in this period's set, duplicates too, and its lifetime
  -- is set again: so the script always writes (a batch of records without
  -- ids counts them above), and the WAIT after it covers every write the
  -- master took on this connection, also a first delivery's that it has
  -- not replicated yet (WAIT waits for a connection's last write only).
  redis.call('SADD', KEYS[1], unpack(ids))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return dups
`)

// indexScript adds ARGV to the set KEYS[1], and always writes: ARGV[1] is
// removed first, then added again with the rest. A plain SADD of members
// already there writes nothing, and WAIT, which waits for its connection's
// last write, would then confirm nothing: not an earlier delivery's SADD
// that the master took and did not replicate yet.
var indexScript = redis.NewScript(`
redis.call('SREM', KEYS[1], ARGV[1])
return redis.call('SADD', KEYS[1], unpack(ARGV))
`)

// UsageSeenTTL is how long Record remembers a request id, so that a record
// delivered again within it is not counted twice. A record is delivered
// again when the ack of a recorded one is lost, or when its replicas did
// not confirm it in time (Topology.MinReplicas): after the usage
// consumer's retry wait or AckWait (30 s), so 10 minutes is a wide margin.
// The ids are kept in one set per key and 10 minutes, each set for 20:
// every id is remembered for 10 to 20 minutes, which bounds them to 20
// minutes of requests (about 80 MB at 1,000 requests/s).
const UsageSeenTTL = 10 * time.Minute

// Record adds one finished request's usage to its key's counters for its
// model and settles its reservation (see Admit), in one atomic step. A
// record whose RequestID was recorded within UsageSeenTTL is not counted
// again (dup true): redelivered records count once. An empty KeyID (no API
// key: auth off) is counted as AnonymousKey, with no window.
func (l *Limiter) Record(ctx context.Context, rec schemas.UsageRecord) (dup bool, err error) {
	dups, err := l.RecordBatch(ctx, []schemas.UsageRecord{rec})
	return dups == 1, err
}

// RecordBatch is Record for many records (the usage consumer's come in
// batches): one Redis script per API key in the batch, after one write of
// the usage index for the keys this Limiter has not indexed yet; dups counts records already counted. Records of one
// key, model and reservation window are summed, so a script's commands grow
// with the models in the batch, not its requests.
//
// Each key's script is atomic, with its de-duplication marks, but the batch
// is not: on an error some keys' records may have been counted and others
// not. The batch may be sent again whole: the counted ones are then
// duplicates (by request id; a record without one would count again). When
// the store waits for replicas (Topology.MinReplicas), RecordBatch returns
// only once they confirmed every write, also of a batch that was all
// duplicates: the marks it found may be ones the master took and did not
// yet replicate.
func (l *Limiter) RecordBatch(ctx context.Context, recs []schemas.UsageRecord) (dups int, err error) {
	if len(recs) == 0 {
		return 0, nil
	}
	clock := time.Now
	if l.Now != nil {
		clock = l.Now
	}
	now := clock()
	hour := now.Unix() / 3600
	groups, of := sumUsage(recs)
	// A request id stays in this period's set or the last one's: counted
	// once for at least UsageSeenTTL.
	period := now.UnixMilli() / UsageSeenTTL.Milliseconds()
	// One script per API key: its groups, then its records.
	type perKey struct {
		groups []int       // indexes into groups
		at     map[int]int // index into groups -> the group's number in the key's script (from 1)
		recs   []int       // indexes into recs
	}
	var order []string
	keys := map[string]*perKey{}
	for gi, g := range groups {
		k := keys[g.key]
		if k == nil {
			k = &perKey{at: map[int]int{}}
			keys[g.key] = k
			order = append(order, g.key)
		}
		k.at[gi] = len(k.groups) + 1
		k.groups = append(k.groups, gi)
	}
	for i := range recs {
		k := keys[groups[of[i]].key]
		k.recs = append(k.recs, i)
	}
	// The index first: a key whose usage a crash left unwritten is listed
	// with no usage, never a key with usage unlisted. Only the keys this
	// process has not indexed yet: its failure fails the batch, which
	// comes again, while the batches of keys indexed go on.
	var index []any
	l.mu.Lock()
	for _, id := range order {
		if _, ok := l.indexed[id]; !ok {
			index = append(index, id)
		}
	}
	l.mu.Unlock()
	var writes []slotWrite
	if len(index) > 0 {
		writes = append(writes, slotWrite{key: keyUsageIndex, write: func(ctx context.Context, c redis.Cmdable) error {
			return l.store.br.Do(ctx, func(ctx context.Context) error {
				return storeErr(indexScript.Run(ctx, c, []string{keyUsageIndex}, index...).Err())
			})
		}})
	}
	var total int64
	for _, id := range order {
		k := keys[id]
		args := make([]any, 0, 6+2*len(k.groups)+6*len(k.recs))
		args = append(args, l.now(), 2*UsageSeenTTL.Milliseconds(), hour, UsageHourlyTTL.Milliseconds(), len(k.groups), len(k.recs))
		for _, gi := range k.groups {
			args = append(args, groups[gi].model, groups[gi].window)
		}
		for _, i := range k.recs {
			rec := recs[i]
			tokens, reserved := Tokens(rec.Usage), max(rec.Reserved, 0)
			if id == AnonymousKey && rec.KeyID == "" {
				tokens, reserved = 0, 0 // counted, never limited
			}
			args = append(args, rec.RequestID, k.at[of[i]], rec.Usage.PromptTokens, rec.Usage.CompletionTokens, tokens, reserved)
		}
		script := []string{seenSet(id, period), seenSet(id, period-1), rateKey(id), usageKey(id), hourlyKey(id, hour/24)}
		writes = append(writes, slotWrite{key: rateKey(id), write: func(ctx context.Context, c redis.Cmdable) error {
			return l.store.br.Do(ctx, func(ctx context.Context) error {
				n, err := recordScript.Run(ctx, c, script, args...).Int64()
				total += n
				return storeErr(err)
			})
		}})
	}
	err = l.store.writeDurably(ctx, writes...)
	if err == nil && len(index) > 0 {
		// Indexed, and confirmed by the replicas.
		l.mu.Lock()
		if l.indexed == nil || len(l.indexed)+len(index) > maxIndexed {
			l.indexed = make(map[string]struct{}, len(index))
		}
		for _, id := range index {
			l.indexed[id.(string)] = struct{}{}
		}
		l.mu.Unlock()
	}
	return int(total), err
}

// usageGroup is the records of a batch of one key, model and reservation
// window.
type usageGroup struct {
	key, model string
	window     int64 // 0: nothing reserved
}

// sumUsage groups recs by key (AnonymousKey for none), model and the window
// a reservation was made in, in order of first appearance; of[i] is recs[i]'s
// group.
func sumUsage(recs []schemas.UsageRecord) (groups []usageGroup, of []int) {
	type group struct {
		usageGroup
		reserved bool
	}
	at := make(map[group]int, 4)
	of = make([]int, len(recs))
	for i, rec := range recs {
		key, window, reserved := cmp.Or(rec.KeyID, AnonymousKey), rec.Window, rec.Reserved > 0 && rec.KeyID != ""
		if !reserved {
			window = 0 // counted in the current window, whichever
		}
		g := group{usageGroup{key, rec.Model, window}, reserved}
		n, ok := at[g]
		if !ok {
			n = len(groups)
			at[g] = n
			groups = append(groups, g.usageGroup)
		}
		of[i] = n
	}
	return groups, of
}

// Tokens is what a request's usage counts against a TPM limit: prompt plus
// completion tokens (the total when an engine reported only that).
func Tokens(u schemas.Usage) int {
	if n := u.PromptTokens + u.CompletionTokens; n > 0 {
		return n
	}
	return max(u.TotalTokens, 0)
}

// now is ARGV[1] of the scripts: empty for Redis's clock.
func (l *Limiter) now() string {
	if l.Now == nil {
		return ""
	}
	return strconv.FormatInt(l.Now().UnixMilli(), 10)
}
