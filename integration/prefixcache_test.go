package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// prefixCounts reads the workers' predicted-vs-actual series from /metrics,
// summed over workers: cached tokens predicted and reported, and the number
// of requests compared.
func prefixCounts(t *testing.T, base string) (predicted, actual float64, compared uint64) {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if f := families["tokenbus_worker_prefix_cached_tokens_total"]; f != nil {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				switch {
				case l.GetName() == "source" && l.GetValue() == "predicted":
					predicted += m.Counter.GetValue()
				case l.GetName() == "source" && l.GetValue() == "actual":
					actual += m.Counter.GetValue()
				}
			}
		}
	}
	if f := families["tokenbus_worker_prefix_prediction_error_tokens"]; f != nil {
		for _, m := range f.Metric {
			compared += m.Histogram.GetSampleCount()
		}
	}
	return predicted, actual, compared
}

// Predicted against actual cached tokens, end to end through NATS with sim
// workers (which report usage.prompt_tokens_details.cached_tokens): a prompt
// seen for the first time is predicted and found uncached; the same prompt
// again goes to the same worker, predicted cached and found cached, the two
// within a block of 16 tokens of each other.
func TestPrefixCachePredictedVsActual(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	system := strings.Repeat("You are a careful assistant who answers in plain words and short sentences. ", 30)
	body := fmt.Sprintf(`{"model":"llama-8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":4,`+
		`"messages":[{"role":"system","content":%q},{"role":"user","content":"What is a cat?"}]}`, system)
	var cached []int
	for i := range 2 {
		s := post(t, d.URL, "/v1/chat/completions", body)
		checkStream(t, s, true, 1, true)
		var u struct {
			Usage struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(s.Events[len(s.Events)-2]), &u); err != nil || u.Usage.PromptTokens < 400 {
			t.Fatalf("request %d: usage chunk %s (%v)", i, s.Events[len(s.Events)-2], err)
		}
		cached = append(cached, u.Usage.PromptTokensDetails.CachedTokens)
		testenv.WaitFor(t, 5*time.Second, func() error { // the worker counts after the last frame
			if _, _, n := prefixCounts(t, d.URL); n != uint64(i+1) {
				return fmt.Errorf("%d requests compared, want %d", n, i+1)
			}
			return nil
		})
		predicted, actual, _ := prefixCounts(t, d.URL)
		if i == 0 && (predicted != 0 || actual != 0) {
			t.Fatalf("first sight of the prompt: predicted %v, actual %v cached tokens, want 0 and 0", predicted, actual)
		}
		if i == 1 {
			t.Logf("repeated prompt: predicted %v, actual %v cached tokens (engine: %v)", predicted, actual, cached)
			if actual != float64(cached[0]+cached[1]) || actual < 400 {
				t.Errorf("actual %v, but the engine reported %v cached tokens", actual, cached)
			}
			if diff := predicted - actual; diff < -16 || diff > 16 {
				t.Errorf("repeated prompt: predicted %v, actual %v cached tokens: more than a block apart", predicted, actual)
			}
		}
	}
}
