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

// recordScript records many requests' usage in one call, each as described
// here with its own offsets (record i, from 0: KEYS[5i+1..5i+5], ARGV
// [11i+3..11i+13]). KEYS: the key's rate hash, its usage hash, the usage
// index, the record's seen marker, the key's hourly usage of the day. ARGV[1]
// now (ms or ""), ARGV[2] the number of records; per record: tokens used (0:
// none to count), key id, model, prompt tokens, completion tokens, tokens
// reserved (0: none), the reservation's window, whether to check and set the
// seen marker ("1"), the marker's lifetime (ms), the hour (unix hours), the
// hourly hash's lifetime (ms). Returns one flag per record: 1 for a record
// already counted.
var recordScript = redis.NewScript(nowLua + `
local dups = {}
for i = 0, tonumber(ARGV[2]) - 1 do
  local k, a = i * 5, 2 + i * 11
  if ARGV[a+8] == '1' and redis.call('EXISTS', KEYS[k+4]) == 1 then
    dups[i+1] = 1
  else
    local tokens, reserved = tonumber(ARGV[a+1]), tonumber(ARGV[a+6])
    if reserved > 0 then
      if tonumber(ARGV[a+7]) == win and tonumber(redis.call('HGET', KEYS[k+1], 'w')) == win then
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
    local m = ARGV[a+3]
    redis.call('HINCRBY', KEYS[k+2], 'requests|' .. m, 1)
    redis.call('HINCRBY', KEYS[k+2], 'prompt_tokens|' .. m, ARGV[a+4])
    redis.call('HINCRBY', KEYS[k+2], 'completion_tokens|' .. m, ARGV[a+5])
    redis.call('SADD', KEYS[k+3], ARGV[a+2])
    local h = ARGV[a+10]
    redis.call('HINCRBY', KEYS[k+5], h .. '|requests|' .. m, 1)
    redis.call('HINCRBY', KEYS[k+5], h .. '|prompt_tokens|' .. m, ARGV[a+4])
    redis.call('HINCRBY', KEYS[k+5], h .. '|completion_tokens|' .. m, ARGV[a+5])
    redis.call('PEXPIRE', KEYS[k+5], ARGV[a+11])
    if ARGV[a+8] == '1' then
      -- Last: a script that failed above left no marker, so its retry counts.
      redis.call('SET', KEYS[k+4], '1', 'PX', ARGV[a+9])
    end
    dups[i+1] = 0
  end
end
return dups
`)

// UsageSeenTTL is how long Record remembers a request id, so that a record
// delivered again within it is not counted twice. A record is delivered
// again when the ack of a recorded one is lost: after the usage consumer's
// AckWait (30 s), so 10 minutes is a wide margin, and it bounds the markers
// to 10 minutes of requests (about 60 MB at 1,000 requests/s).
const UsageSeenTTL = 10 * time.Minute

func seenKey(keyID, requestID string) string {
	return "{tokenbus}:usage:seen:" + keyID + ":" + requestID
}

// Record adds one finished request's usage to its key's counters for its
// model and settles its reservation (see Admit), in one atomic step. A
// record whose RequestID was recorded within UsageSeenTTL is not counted
// again (dup true): redelivered records count once. An empty KeyID (no API
// key: auth off) is counted as AnonymousKey, with no window.
func (l *Limiter) Record(ctx context.Context, rec schemas.UsageRecord) (dup bool, err error) {
	dups, err := l.RecordBatch(ctx, []schemas.UsageRecord{rec})
	return dups == 1, err
}

// RecordBatch is Record for many records in one Redis call (one script run:
// the usage consumer's records come in batches). dups counts the records
// already counted. On an error, the records recorded before it are marked
// seen, so that sending the whole batch again counts each once.
func (l *Limiter) RecordBatch(ctx context.Context, recs []schemas.UsageRecord) (dups int, err error) {
	if len(recs) == 0 {
		return 0, nil
	}
	clock := time.Now
	if l.Now != nil {
		clock = l.Now
	}
	hour := clock().Unix() / 3600
	keys := make([]string, 0, 5*len(recs))
	args := make([]any, 0, 2+11*len(recs))
	args = append(args, l.now(), len(recs))
	for _, rec := range recs {
		id, tokens, reserved := rec.KeyID, Tokens(rec.Usage), rec.Reserved
		if id == "" {
			id, tokens, reserved = AnonymousKey, 0, 0
		}
		check := "0"
		if rec.RequestID != "" {
			check = "1"
		}
		keys = append(keys, rateKey(id), usageKey(id), keyUsageIndex, seenKey(id, rec.RequestID), hourlyKey(id, hour/24))
		args = append(args, tokens, id, rec.Model, rec.Usage.PromptTokens, rec.Usage.CompletionTokens,
			max(reserved, 0), rec.Window, check, UsageSeenTTL.Milliseconds(), hour, UsageHourlyTTL.Milliseconds())
	}
	err = l.store.br.Do(ctx, func(ctx context.Context) error {
		flags, err := recordScript.Run(ctx, l.store.rdb, keys, args...).Int64Slice()
		for _, f := range flags {
			dups += int(f)
		}
		return storeErr(err)
	})
	return dups, err
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
