package registry

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// AnonymousKey is the key id under which requests without an API key (auth
// off) are counted.
const AnonymousKey = "anonymous"

// Usage is stored per key as one hash, usageKey (layout.go), with the
// fields "<counter>|<model>" (the counter names have no '|', so a model name
// may), and an index set of the key ids that have usage, keyUsageIndex.
// Usage outlives its key, for billing. A key the index lists may have no
// usage hash (a crash between the index and the count): it has no rows.

// UsageRow is what one key used of one model.
type UsageRow struct {
	KeyID            string `json:"key_id"`
	Model            string `json:"model"`
	Requests         int64  `json:"requests"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	TotalTokens      int64  `json:"total_tokens"`
}

// Usage returns usage per key and model, sorted by key id then model; an
// empty keyID or model matches all.
func (s *Store) Usage(ctx context.Context, keyID, model string) ([]UsageRow, error) {
	ids := []string{keyID}
	if keyID == "" {
		var err error
		if ids, err = s.rdb.SMembers(ctx, keyUsageIndex).Result(); err != nil {
			return nil, storeErr(err)
		}
	}
	cmds := make([]*redis.MapStringStringCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HGetAll(ctx, usageKey(id))
		}
		return nil
	})
	if err != nil {
		return nil, storeErr(err)
	}
	out := []UsageRow{}
	for i, id := range ids {
		rows := map[string]*UsageRow{}
		for field, v := range cmds[i].Val() {
			counter, m, ok := strings.Cut(field, "|")
			if !ok || model != "" && m != model {
				continue
			}
			r := rows[m]
			if r == nil {
				r = &UsageRow{KeyID: id, Model: m}
				rows[m] = r
			}
			r.set(counter, v)
		}
		for _, r := range rows {
			r.TotalTokens = r.PromptTokens + r.CompletionTokens
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b UsageRow) int {
		return cmp.Or(strings.Compare(a.KeyID, b.KeyID), strings.Compare(a.Model, b.Model))
	})
	return out, nil
}

// Usage is also kept per hour, for a view over time: one hash per key and
// day, hourlyKey (layout.go), with the fields "<unix hour>|<counter>|
// <model>", kept UsageHourlyTTL after the day's last request.

// UsageHourlyTTL is how long hourly usage is kept.
const UsageHourlyTTL = 8 * 24 * time.Hour

// HourlyUsageRow is what one key used of one model in one hour.
type HourlyUsageRow struct {
	Hour int64 `json:"hour"` // unix seconds of the hour's start
	UsageRow
}

// UsageHourly returns usage per hour, key and model from the hour of since
// to now, sorted by hour, key id and model; an empty keyID or model matches
// all. Hours with no requests have no row.
func (s *Store) UsageHourly(ctx context.Context, keyID, model string, since, now time.Time) ([]HourlyUsageRow, error) {
	ids := []string{keyID}
	if keyID == "" {
		var err error
		if ids, err = s.rdb.SMembers(ctx, keyUsageIndex).Result(); err != nil {
			return nil, storeErr(err)
		}
	}
	from, to := since.Unix()/3600, now.Unix()/3600
	type read struct {
		id  string
		cmd *redis.MapStringStringCmd
	}
	var reads []read
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			for day := from / 24; day <= to/24; day++ {
				reads = append(reads, read{id, p.HGetAll(ctx, hourlyKey(id, day))})
			}
		}
		return nil
	})
	if err != nil {
		return nil, storeErr(err)
	}
	type slot struct {
		hour      int64
		id, model string
	}
	rows := map[slot]*HourlyUsageRow{}
	for _, r := range reads {
		for field, v := range r.cmd.Val() {
			hs, rest, ok1 := strings.Cut(field, "|")
			counter, m, ok2 := strings.Cut(rest, "|")
			h, err := strconv.ParseInt(hs, 10, 64)
			if !ok1 || !ok2 || err != nil || h < from || h > to || model != "" && m != model {
				continue
			}
			k := slot{h, r.id, m}
			row := rows[k]
			if row == nil {
				row = &HourlyUsageRow{Hour: h * 3600, UsageRow: UsageRow{KeyID: r.id, Model: m}}
				rows[k] = row
			}
			row.set(counter, v)
		}
	}
	out := make([]HourlyUsageRow, 0, len(rows))
	for _, r := range rows {
		r.TotalTokens = r.PromptTokens + r.CompletionTokens
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b HourlyUsageRow) int {
		return cmp.Or(cmp.Compare(a.Hour, b.Hour), cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(a.Model, b.Model))
	})
	return out, nil
}

// set stores one counter of a usage hash's field (requests, prompt_tokens,
// completion_tokens) in r; other counters are ignored.
func (r *UsageRow) set(counter, value string) {
	n, _ := strconv.ParseInt(value, 10, 64)
	switch counter {
	case "requests":
		r.Requests = n
	case "prompt_tokens":
		r.PromptTokens = n
	case "completion_tokens":
		r.CompletionTokens = n
	}
}
