package workers

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/schemas"
)

func TestPrefixPredictionCompare(t *testing.T) {
	details := func(cached int) *schemas.TokenDetails { return &schemas.TokenDetails{CachedTokens: cached} }
	tests := []struct {
		name      string
		header    string
		usage     schemas.Usage
		estimated bool
		want      prefixComparison
	}{
		{"all cached", "960/1000", schemas.Usage{PromptTokens: 250, PromptTokensDetails: details(240)}, false, prefixComparison{240, 240, true}},
		{"none predicted, some found", "0/1000", schemas.Usage{PromptTokens: 250, PromptTokensDetails: details(32)}, false, prefixComparison{0, 32, true}},
		{"predicted, evicted", "500/1000", schemas.Usage{PromptTokens: 101, PromptTokensDetails: details(0)}, false, prefixComparison{51, 0, true}}, // 50.5 rounds up
		{"engine reports no cached tokens", "960/1000", schemas.Usage{PromptTokens: 250}, false, prefixComparison{}},
		{"usage estimated", "960/1000", schemas.Usage{PromptTokens: 250, PromptTokensDetails: details(240)}, true, prefixComparison{}},
		{"no prediction (routed by load)", "", schemas.Usage{PromptTokens: 250, PromptTokensDetails: details(240)}, false, prefixComparison{}},
		{"malformed header", "x/1000", schemas.Usage{PromptTokens: 250, PromptTokensDetails: details(240)}, false, prefixComparison{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := nats.Header{}
			if tt.header != "" {
				h.Set(schemas.HdrPrefixCached, tt.header)
			}
			if got := readPrefixPrediction(h).compare(&tt.usage, tt.estimated); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
