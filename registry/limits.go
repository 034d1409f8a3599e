package registry

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tokenbus/tokenbus/schemas"
)

// Rate limits are counted in fixed one-minute windows (Unix time / 60 s on
// Redis's clock, so every gateway replica agrees on the window), one small
// hash per key: w (the window), r (requests admitted in it), t (tokens used
// in it), expiring a minute after its window. A request is admitted while r < RPM and t < TPM, and counted in r
// by the same script that checked, so replicas never admit more than RPM.
// Its tokens are unknown until it ends: Record adds prompt + completion
// tokens to the window in which it finished, so a key can overshoot its TPM
// by the requests in flight when it crosses the limit, and no more requests
// are admitted until the window ends. Fixed windows let a burst of up to 2x
// the limit straddle a window boundary; that is the usual trade for exact,
// cheap counting with an exact reset time.
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
	Tokens   int           // tokens counted in the window
	Reset    time.Duration // until the window ends and both counts start over
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

// admitScript: KEYS[1] the key's rate hash; ARGV now (ms or ""), rpm, tpm.
// Returns {refused: 0 no, 1 requests, 2 tokens; requests; tokens; reset ms}.
var admitScript = redis.NewScript(nowLua + `
local rpm, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'w', 'r', 't')
local r, t = 0, 0
if tonumber(v[1]) == win then
  r, t = tonumber(v[2]) or 0, tonumber(v[3]) or 0
end
if rpm > 0 and r >= rpm then return {1, r, t, reset} end
if tpm > 0 and t >= tpm then return {2, r, t, reset} end
r = r + 1
redis.call('HSET', KEYS[1], 'w', win, 'r', r, 't', t)
redis.call('PEXPIRE', KEYS[1], reset + 60000)
return {0, r, t, reset}
`)

// Admit checks the key's limits and, if the request is allowed, counts it.
// A key without limits is allowed without asking Redis. An error means Redis
// did not answer (ErrUnavailable): the caller decides to fail open.
func (l *Limiter) Admit(ctx context.Context, k Key) (Decision, error) {
	d := Decision{Allowed: true, RPM: k.RPM, TPM: k.TPM}
	if !k.Limited() {
		return d, nil
	}
	res, err := admitScript.Run(ctx, l.store.rdb, []string{rateKey(k.ID)},
		l.now(), k.RPM, k.TPM).Int64Slice()
	if err != nil {
		return d, storeErr(err)
	}
	d.Requests, d.Tokens, d.Reset = int(res[1]), int(res[2]), time.Duration(res[3])*time.Millisecond
	switch res[0] {
	case 1:
		d.Allowed, d.Exceeded = false, "requests"
	case 2:
		d.Allowed, d.Exceeded = false, "tokens"
	}
	return d, nil
}

// recordScript: KEYS[1] the key's rate hash, KEYS[2] its usage hash, KEYS[3]
// the usage index; ARGV now (ms or ""), tokens to count against TPM (0:
// none), key id, model, prompt tokens, completion tokens.
var recordScript = redis.NewScript(nowLua + `
local tokens = tonumber(ARGV[2])
if tokens > 0 then
  if tonumber(redis.call('HGET', KEYS[1], 'w')) == win then
    redis.call('HINCRBY', KEYS[1], 't', tokens)
  else
    redis.call('HSET', KEYS[1], 'w', win, 'r', 0, 't', tokens)
  end
  redis.call('PEXPIRE', KEYS[1], reset + 60000)
end
local m = ARGV[4]
redis.call('HINCRBY', KEYS[2], 'requests|' .. m, 1)
redis.call('HINCRBY', KEYS[2], 'prompt_tokens|' .. m, ARGV[5])
redis.call('HINCRBY', KEYS[2], 'completion_tokens|' .. m, ARGV[6])
redis.call('SADD', KEYS[3], ARGV[3])
return 0
`)

// Record adds one finished request's usage to key keyID's counters for
// model and its tokens to the key's current rate-limit window, in one atomic
// step. An empty keyID (no API key: auth off) is counted as AnonymousKey,
// with no window.
func (l *Limiter) Record(ctx context.Context, keyID, model string, u schemas.Usage) error {
	id, tokens := keyID, Tokens(u)
	if id == "" {
		id, tokens = AnonymousKey, 0
	}
	err := recordScript.Run(ctx, l.store.rdb, []string{rateKey(id), usageKey(id), keyUsageIndex},
		l.now(), tokens, id, model, u.PromptTokens, u.CompletionTokens).Err()
	return storeErr(err)
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
