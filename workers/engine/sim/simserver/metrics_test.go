package simserver

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

func TestMetrics(t *testing.T) {
	ts := start(t, Config{GPUCacheMetric: true, AllowRuntimeLoRA: true}, slowSim())
	ml := []string{"model_name", "base", "engine", "0"}

	fams := scrape(t, ts.url)
	for _, name := range []string{mRunning, mWaiting, mKVCache, mGPUCache, mLoRAInfo, mPrompt, mGeneration, mSuccess,
		mQueries, mHits, mPreemptions, mTTFT, mITL, mE2E} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	if f := scrape(t, start(t, Config{}, fastSim()).url); f[mGPUCache] != nil || f[mKVCache] == nil {
		t.Errorf("without GPUCacheMetric: %s present %v, %s present %v", mGPUCache, f[mGPUCache] != nil, mKVCache, f[mKVCache] != nil)
	}
	for _, r := range finishReasons {
		if v := value(fams, mSuccess, append(ml, "finished_reason", r)...); v != 0 {
			t.Errorf("%s{finished_reason=%q} = %v before any request", mSuccess, r, v)
		}
	}
	if v := value(fams, mLoRAInfo, "max_lora", "4", "running_lora_adapters", "", "waiting_lora_adapters", ""); v < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("%s = %v, want a recent timestamp", mLoRAInfo, v)
	}

	// Two requests to the end, the same prompt twice: the second finds it in the prefix cache.
	prompt := `"prompt":"` + longPrompt + `","max_tokens":4,"ignore_eos":true`
	readAll(t, do(t, http.MethodPost, ts.url+"/v1/completions", `{`+prompt+`}`))
	resp := do(t, http.MethodPost, ts.url+"/v1/completions", `{`+prompt+`,"stream":true}`)
	sse(t, resp)
	fams = scrape(t, ts.url)
	for _, c := range []struct {
		name   string
		labels []string
		min    float64
		max    float64
	}{
		{mGeneration, ml, 8, 8},
		{mSuccess, append(ml, "finished_reason", "length"), 2, 2},
		{mPrompt, ml, 40, 1000},
		{mQueries, ml, 40, 1000},
		{mHits, ml, 16, 1000},
		{mRunning, ml, 0, 0},
		{mKVCache, ml, 0, 0.01},
		{mTTFT, ml, 1, 1}, // streams only
		{mITL, ml, 3, 3},
		{mE2E, ml, 2, 2},
	} {
		if v := value(fams, c.name, c.labels...); v < c.min || v > c.max {
			t.Errorf("%s%v = %v, want %v..%v", c.name, c.labels, v, c.min, c.max)
		}
	}

	// A client that goes away mid-stream: the request leaves the batch.
	readAll(t, do(t, http.MethodPost, ts.url+"/v1/load_lora_adapter", `{"lora_name":"ad","lora_path":"/ad"}`))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp = doCtx(t, ctx, http.MethodPost, ts.url+"/v1/chat/completions",
		`{"model":"ad","messages":[{"role":"user","content":"hi"}],"max_tokens":5000,"ignore_eos":true,"stream":true}`)
	firstEvent(t, resp)
	testenv.WaitFor(t, 5*time.Second, func() error {
		f := scrape(t, ts.url)
		if value(f, mRunning, ml...) != 1 || value(f, mKVCache, ml...) <= 0 ||
			value(f, mLoRAInfo, "max_lora", "4", "running_lora_adapters", "ad") <= 0 {
			return fmt.Errorf("the stream is not running on adapter ad: running %v, KV cache %v",
				value(f, mRunning, ml...), value(f, mKVCache, ml...))
		}
		return nil
	})
	cancel()
	resp.Body.Close()
	testenv.WaitFor(t, 5*time.Second, func() error {
		f := scrape(t, ts.url)
		if r, a := value(f, mRunning, ml...), value(f, mSuccess, append(ml, "finished_reason", "abort")...); r != 0 || a != 1 {
			return fmt.Errorf("the request still runs after its client left: running %v, aborted %v", r, a)
		}
		return nil
	})
	// The newest lora_requests_info sample has no adapter running any more.
	f := scrape(t, ts.url)
	newest, labels := 0.0, ""
	for _, m := range f[mLoRAInfo].GetMetric() {
		if v := m.GetGauge().GetValue(); v > newest {
			newest, labels = v, m.String()
		}
	}
	if value(f, mLoRAInfo, "running_lora_adapters", "", "waiting_lora_adapters", "") != newest {
		t.Errorf("newest %s sample: %s", mLoRAInfo, labels)
	}
}

const longPrompt = "The quick brown fox jumps over the lazy dog while the cat watches from the old stone wall " +
	"and the farmer walks down the road to the market with a basket of apples and bread for the family"
