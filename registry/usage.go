package registry

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// AnonymousKey is the key id under which requests without an API key (auth
// off) are counted.
const AnonymousKey = "anonymous"

// Usage is stored per key as one hash, {tokenbus}:usage:<key id>, with the
// fields "<counter>|<model>" (the counter names have no '|', so a model name
// may), and an index set of the key ids that have usage. Usage outlives its
// key, for billing.
const keyUsageIndex = "{tokenbus}:usage:keys"

func usageKey(id string) string { return "{tokenbus}:usage:" + id }

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
			n, _ := strconv.ParseInt(v, 10, 64)
			switch counter {
			case "requests":
				r.Requests = n
			case "prompt_tokens":
				r.PromptTokens = n
			case "completion_tokens":
				r.CompletionTokens = n
			}
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
