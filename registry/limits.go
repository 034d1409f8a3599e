package registry

import (
	"cmp"
	"context"
	"strconv"
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
func rateKey(id string) string { return "{tokenbus}:rl:" + id }

// Limiter checks and counts rate limits and records usage. Its zero Now uses
// Redis's clock; tests pin it.
type Limiter struct {
	store *Store
	Now   func() time.Time
}

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

// admitScript: KEYS[1] the key's rate hash; ARGV now (ms or ""), rpm, tpm,
// requests (prompts), tokens to reserve. Returns {refused: 0 no, 1
// requests, 2 tokens; requests; tokens before the reservation; reset ms;
// window}.
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
return {0, r + n, t, reset, win}
`)

// Admission is what one request asks of a key's limits.
type Admission struct {
	Requests int // counted against RPM: its prompts (at least 1)
	Tokens   int // reserved against TPM: the most it may use
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
	var res []int64
	err := l.store.br.Do(ctx, func(ctx context.Context) error {
		var err error
		res, err = admitScript.Run(ctx, l.store.rdb, []string{rateKey(k.ID)},
			l.now(), k.RPM, k.TPM, a.Requests, a.Tokens).Int64Slice()
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

// recordScript records a batch of usage, counted once: KEYS[1] the batch's
// seen marker, KEYS[2] the usage index; per group g (from 0: the batch's
// records summed by key, model and reservation window) KEYS[3g+3..3g+5]: the
// key's rate hash, its usage hash, its hourly usage of the day. ARGV[1] now
// (ms or ""), ARGV[2] whether to check and set the marker ("1"), ARGV[3] the
// marker's lifetime (ms), ARGV[4] the hour (unix hours), ARGV[5] the hourly
// hash's lifetime (ms), ARGV[6] the number of groups; per group
// ARGV[8g+7..8g+14]: key id, model, requests, prompt tokens, completion
// tokens, tokens used (0: none to count), tokens reserved (0: none), the
// reservation's window. Returns 1 for a batch already counted.
var recordScript = redis.NewScript(nowLua + `
if ARGV[2] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then
  return 1
end
local h = ARGV[4]
for g = 0, tonumber(ARGV[6]) - 1 do
  local k, a = 2 + g * 3, 6 + g * 8
  local tokens, reserved = tonumber(ARGV[a+6]), tonumber(ARGV[a+7])
  if reserved > 0 then
    if tonumber(ARGV[a+8]) == win and tonumber(redis.call('HGET', KEYS[k+1], 'w')) == win then
      local t = redis.call('HINCRBY', KEYS[k+1], 't', tokens - reserved)
      if t < 0 then redis.call('HSET', KEYS[k+1], 't', 0) end
    end
  elseif tokens > 0 then
    if tonumber(redis.call('HGET', KEYS[k+1], 'w')) == win then
      redis.call('HINCRBY', KEYS[k+1], 't', tokens)
    else
      redis.call('HSET', KEYS[k+1], 'w', win, 'r', 0, 't', tokens)
    end
    redis.call('PEXPIRE', KEYS[k+1], reset + 60000)
  end
  local m = ARGV[a+2]
  redis.call('HINCRBY', KEYS[k+2], 'requests|' .. m, ARGV[a+3])
  redis.call('HINCRBY', KEYS[k+2], 'prompt_tokens|' .. m, ARGV[a+4])
  redis.call('HINCRBY', KEYS[k+2], 'completion_tokens|' .. m, ARGV[a+5])
  redis.call('SADD', KEYS[2], ARGV[a+1])
  redis.call('HINCRBY', KEYS[k+3], h .. '|requests|' .. m, ARGV[a+3])
  redis.call('HINCRBY', KEYS[k+3], h .. '|prompt_tokens|' .. m, ARGV[a+4])
  redis.call('HINCRBY', KEYS[k+3], h .. '|completion_tokens|' .. m, ARGV[a+5])
  redis.call('PEXPIRE', KEYS[k+3], ARGV[5])
end
if ARGV[2] == '1' then
  -- Last: a script that failed above left no marker, so its retry counts.
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[3])
end
return 0
`)

// UsageSeenTTL is how long Record remembers a request id, so that a record
// delivered again within it is not counted twice. A record is delivered
// again when the ack of a recorded one is lost: after the usage consumer's
// AckWait (30 s), so 10 minutes is a wide margin, and it bounds the markers
// to 10 minutes of requests (about 60 MB at 1,000 requests/s).
const UsageSeenTTL = 10 * time.Minute

// usageSeenPrefix + a batch's id is its marker.
const usageSeenPrefix = "{tokenbus}:usage:seen:"

// Record adds one finished request's usage to its key's counters for its
// model and settles its reservation (see Admit), in one atomic step. A
// record whose RequestID was recorded within UsageSeenTTL is not counted
// again (dup true): redelivered records count once. An empty KeyID (no API
// key: auth off) is counted as AnonymousKey, with no window.
func (l *Limiter) Record(ctx context.Context, rec schemas.UsageRecord) (dup bool, err error) {
	id := ""
	if rec.RequestID != "" {
		id = cmp.Or(rec.KeyID, AnonymousKey) + ":" + rec.RequestID
	}
	return l.RecordBatch(ctx, id, []schemas.UsageRecord{rec})
}

// RecordBatch is Record for a batch of records (the usage consumer's come in
// batches), in one Redis call and counted once by the batch's id: a batch
// whose id was recorded within UsageSeenTTL counts nothing again (dup true;
// "" turns the check off). Records of one key, model and reservation window
// are summed first, so the call grows with the keys and models in the
// batch, not with its requests.
func (l *Limiter) RecordBatch(ctx context.Context, id string, recs []schemas.UsageRecord) (dup bool, err error) {
	if len(recs) == 0 {
		return false, nil
	}
	clock := time.Now
	if l.Now != nil {
		clock = l.Now
	}
	hour := clock().Unix() / 3600
	groups := sumUsage(recs)
	check := "0"
	if id != "" {
		check = "1"
	}
	keys := make([]string, 0, 2+3*len(groups))
	keys = append(keys, usageSeenPrefix+id, keyUsageIndex)
	args := make([]any, 0, 6+8*len(groups))
	args = append(args, l.now(), check, UsageSeenTTL.Milliseconds(), hour, UsageHourlyTTL.Milliseconds(), len(groups))
	for _, g := range groups {
		keys = append(keys, rateKey(g.key), usageKey(g.key), hourlyKey(g.key, hour/24))
		args = append(args, g.key, g.model, g.requests, g.prompt, g.completion, g.tokens, g.reserved, g.window)
	}
	var n int64
	err = l.store.br.Do(ctx, func(ctx context.Context) error {
		var err error
		n, err = recordScript.Run(ctx, l.store.rdb, keys, args...).Int64()
		return storeErr(err)
	})
	return n == 1, err
}

// usageSum is the usage of a batch's records of one key, model and
// reservation window.
type usageSum struct {
	key, model                                     string
	window                                         int64
	requests, prompt, completion, tokens, reserved int
}

// sumUsage groups recs by key (AnonymousKey for none: counted, never
// limited), model and the window a reservation was made in, keeping the
// records' order of first appearance.
func sumUsage(recs []schemas.UsageRecord) []usageSum {
	type group struct {
		key, model string
		window     int64
		reserved   bool
	}
	var sums []usageSum
	at := make(map[group]int, 4)
	for _, rec := range recs {
		key, tokens, reserved, window := rec.KeyID, Tokens(rec.Usage), max(rec.Reserved, 0), rec.Window
		if key == "" {
			key, tokens, reserved = AnonymousKey, 0, 0
		}
		if reserved == 0 {
			window = 0 // counted in the current window, whichever
		}
		g := group{key, rec.Model, window, reserved > 0}
		i, ok := at[g]
		if !ok {
			i = len(sums)
			at[g] = i
			sums = append(sums, usageSum{key: key, model: rec.Model, window: window})
		}
		s := &sums[i]
		s.requests++
		s.prompt += rec.Usage.PromptTokens
		s.completion += rec.Usage.CompletionTokens
		s.tokens += tokens
		s.reserved += reserved
	}
	return sums
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
