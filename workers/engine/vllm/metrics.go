package vllm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vLLM's gauges that make up the load.
const (
	metricRunning  = "vllm:num_requests_running"
	metricWaiting  = "vllm:num_requests_waiting"
	metricKVCache  = "vllm:kv_cache_usage_perc"
	metricGPUCache = "vllm:gpu_cache_usage_perc" // the name before vLLM 0.10
	metricLoRAInfo = "vllm:lora_requests_info"
)

var wantedMetrics = []string{metricRunning, metricWaiting, metricKVCache, metricGPUCache, metricLoRAInfo}

// Metrics is the load read from vLLM's /metrics.
type Metrics struct {
	Running      int     // vllm:num_requests_running, summed over label sets (model_name, engine)
	Waiting      int     // vllm:num_requests_waiting, summed
	KVCacheUsage float64 // vllm:kv_cache_usage_perc (else vllm:gpu_cache_usage_perc), 0..1, the largest over label sets

	// From the newest vllm:lora_requests_info sample (its value is a
	// timestamp): max_lora, running_lora_adapters, waiting_lora_adapters.
	MaxLora         int
	RunningAdapters []string
	WaitingAdapters []string

	At time.Time // when it was scraped; zero if never
}

// errNoMetrics: GET /metrics answered 404.
var errNoMetrics = errors.New("GET /metrics answered 404")

// freshMetrics is the last scrape if it is recent enough to trust.
func (e *Engine) freshMetrics() *Metrics {
	m := e.metrics.Load()
	if m == nil || time.Since(m.At) > max(5*e.cfg.MetricsInterval, 5*time.Second) {
		return nil
	}
	return m
}

func (e *Engine) metricsLoop() {
	t := time.NewTicker(e.cfg.MetricsInterval)
	defer t.Stop()
	var lastErr string
	for {
		err := e.scrape()
		if errors.Is(err, errNoMetrics) {
			// Asking again would change nothing, and on a server that runs
			// one request at a time every ask would interrupt generation.
			e.core.Logger().Error("the engine has no /metrics, so it is not vLLM: load is tokenbus's own requests in flight; no more scrapes (use --engine openai for another OpenAI-compatible server)",
				"url", e.core.URL())
			return
		}
		switch {
		case err != nil && err.Error() != lastErr:
			e.core.Logger().Warn("vLLM metrics not read", "err", err)
			lastErr = err.Error()
		case err == nil && lastErr != "":
			e.core.Logger().Info("vLLM metrics read again")
			lastErr = ""
		}
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (e *Engine) scrape() error {
	ctx, cancel := context.WithTimeout(e.ctx, max(e.cfg.MetricsInterval, 2*time.Second))
	defer cancel()
	status, body, err := e.core.Call(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return err
	}
	if status == http.StatusNotFound {
		return errNoMetrics
	}
	if status != http.StatusOK {
		return fmt.Errorf("GET /metrics answered %d", status)
	}
	m, err := ParseMetrics(bytes.NewReader(body))
	if err != nil {
		return err
	}
	m.At = time.Now()
	e.metrics.Store(&m)
	return nil
}

// ParseMetrics reads vLLM's load from Prometheus text. Lines of other
// metrics are dropped before parsing (vLLM's histograms are most of the
// text), so the cost is a scan of the text and a parse of a few lines.
func ParseMetrics(r io.Reader) (Metrics, error) {
	var m Metrics
	kept, err := filterMetrics(r, wantedMetrics)
	if err != nil {
		return m, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(kept))
	if err != nil {
		return m, fmt.Errorf("parsing /metrics: %v", err)
	}
	sum := func(name string) (total float64, found bool) {
		f := fams[name]
		for _, s := range f.GetMetric() {
			total += value(s)
		}
		return total, f != nil
	}
	run, _ := sum(metricRunning)
	wait, _ := sum(metricWaiting)
	m.Running, m.Waiting = int(run+0.5), int(wait+0.5)

	kv := fams[metricKVCache]
	if kv == nil {
		kv = fams[metricGPUCache]
	}
	for _, s := range kv.GetMetric() {
		m.KVCacheUsage = max(m.KVCacheUsage, value(s))
	}
	m.KVCacheUsage = min(max(m.KVCacheUsage, 0), 1)

	var newest *dto.Metric
	for _, s := range fams[metricLoRAInfo].GetMetric() {
		if newest == nil || value(s) > value(newest) {
			newest = s
		}
	}
	for _, l := range newest.GetLabel() {
		switch l.GetName() {
		case "max_lora":
			_, _ = fmt.Sscan(l.GetValue(), &m.MaxLora)
		case "running_lora_adapters":
			m.RunningAdapters = splitList(l.GetValue())
		case "waiting_lora_adapters":
			m.WaitingAdapters = splitList(l.GetValue())
		}
	}
	return m, nil
}

func value(s *dto.Metric) float64 {
	switch {
	case s.Gauge != nil:
		return s.Gauge.GetValue()
	case s.Untyped != nil:
		return s.Untyped.GetValue()
	case s.Counter != nil:
		return s.Counter.GetValue()
	}
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// filterMetrics keeps the sample, HELP and TYPE lines of the named metrics.
func filterMetrics(r io.Reader, names []string) ([]byte, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var out []byte
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A line this long is no gauge of ours: skip it.
			for err == bufio.ErrBufferFull {
				_, err = br.ReadSlice('\n')
			}
			continue
		}
		if len(line) > 0 && wanted(line, names) {
			out = append(out, line...)
			if line[len(line)-1] != '\n' {
				out = append(out, '\n')
			}
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func wanted(line []byte, names []string) bool {
	if rest, ok := bytes.CutPrefix(line, []byte("# ")); ok {
		// "# HELP name ..." or "# TYPE name ..."
		if i := bytes.IndexByte(rest, ' '); i >= 0 {
			line = rest[i+1:]
		} else {
			return false
		}
	}
	for _, n := range names {
		if len(line) > len(n) && string(line[:len(n)]) == n && (line[len(n)] == ' ' || line[len(n)] == '{' || line[len(n)] == '\t') {
			return true
		}
	}
	return false
}
