//go:build unix

package simserver

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkStream is one streamed request at a time over loopback, client
// included, the sim taking no simulated time (go test -bench . -benchmem).
// The sim then runs ahead of the client, so SSE writes coalesce: flushes/op
// is the number of writes per request (at most one per Sink.Chunks call).
// cpu-ns/token is the process's CPU time (server, sim and client) per token.
func BenchmarkStream(b *testing.B) {
	for _, tokens := range []int{16, 256} {
		for _, kind := range []string{"chat", "completion"} {
			b.Run(fmt.Sprintf("%s/tokens=%d", kind, tokens), func(b *testing.B) {
				benchGenerate(b, kind, tokens, true, 1)
			})
		}
	}
}

// BenchmarkStreamParallel runs 32 streams at a time.
func BenchmarkStreamParallel(b *testing.B) {
	benchGenerate(b, "chat", 256, true, 32)
}

// BenchmarkWhole is stream:false.
func BenchmarkWhole(b *testing.B) {
	benchGenerate(b, "chat", 256, false, 1)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchGenerate(b *testing.B, kind string, tokens int, stream bool, parallel int) {
	ts := start(b, Config{}, fastSim())
	path, body := "/v1/completions", fmt.Sprintf(`{"model":"base","prompt":"Hello there","max_tokens":%d,"ignore_eos":true,"stream":%v}`, tokens, stream)
	if kind == "chat" {
		path, body = "/v1/chat/completions", fmt.Sprintf(`{"model":"base","messages":[{"role":"user","content":"Hello there"}],"max_tokens":%d,"ignore_eos":true,"stream":%v}`, tokens, stream)
	}
	client := &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	run := func(buf *bytes.Buffer) {
		req, _ := http.NewRequest(http.MethodPost, ts.url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		buf.Reset()
		_, err = io.Copy(buf, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("%v %d %s", err, resp.StatusCode, buf.Bytes())
		}
	}
	buf := bytes.NewBuffer(make([]byte, 0, 256<<10))
	run(buf)
	if stream && !bytes.HasSuffix(buf.Bytes(), doneEvent) {
		b.Fatalf("no [DONE]: %s", buf.Bytes())
	}
	flushes := ts.flushes.Load()
	cpu := cpuTime()
	b.ReportAllocs()
	b.ResetTimer()
	if parallel > 1 {
		b.SetParallelism((parallel + 1) / 2) // × GOMAXPROCS goroutines
		b.RunParallel(func(pb *testing.PB) {
			buf := bytes.NewBuffer(make([]byte, 0, 256<<10))
			for pb.Next() {
				run(buf)
			}
		})
	} else {
		for b.Loop() {
			run(buf)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(tokens)*n/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(float64(cpuTime()-cpu)/(float64(tokens)*n), "cpu-ns/token")
	if stream {
		b.ReportMetric(float64(ts.flushes.Load()-flushes)/n, "flushes/op")
	}
}
