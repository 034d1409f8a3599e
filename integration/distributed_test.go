package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/sysmon"
	"github.com/tokenbus/tokenbus/internal/testenv"
)

// natsServer is the standalone nats-server: TOKENBUS_TEST_NATS_SERVER, built
// once by scripts/test, or else built here from the Go module once.
var natsOnce sync.Once
var natsBin string
var natsErr error

func natsServer(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("TOKENBUS_TEST_NATS_SERVER"); bin != "" { // built once by scripts/test
		return bin
	}
	natsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nats-server-bin-")
		if err != nil {
			natsErr = err
			return
		}
		natsBin = filepath.Join(dir, "nats-server")
		out, err := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsErr != nil {
		t.Fatal(natsErr)
	}
	return natsBin
}

// proc is a child process whose output goes to the test log.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan error
}

func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			t.Logf("[%s] %s", name, sc.Text())
		}
	}()
	go func() { err := cmd.Wait(); pw.Close(); p.done <- err }()
	t.Cleanup(func() { p.stop(t, 10*time.Second) })
	return p
}

// stop sends SIGTERM and waits; it reports the exit error.
func (p *proc) stop(t *testing.T, wait time.Duration) error {
	if p.cmd.ProcessState != nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		t.Errorf("%s did not exit within %s of SIGTERM", p.name, wait)
		return fmt.Errorf("killed")
	}
}

// TestDistributed runs gateway, two dispatchers and two workers as separate
// processes against a standalone nats-server and redis-server.
func TestDistributed(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes of the built binary, ~10 s")
	}
	t.Parallel()
	bin := tokenbusBinary(t)
	redis := testenv.StartRedis(t)
	natsPort := testenv.FreePort(t)
	startProc(t, "nats-server", natsServer(t), "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-js", "-sd", t.TempDir())
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	httpPort := testenv.FreePort(t)
	common := []string{"--nats-url", natsURL, "--redis-url", redis.URL}
	for i := range 2 {
		startProc(t, fmt.Sprintf("dispatcher-%d", i+1), bin, append([]string{"dispatcher"}, common...)...)
	}
	var workers []*proc
	for i := range 2 {
		id := fmt.Sprintf("w%d", i+1)
		workers = append(workers, startProc(t, id, bin, append([]string{"worker", "--id", id, "--sim-decode-base", "5ms", "--drain-timeout", "20s"}, common...)...))
	}
	startProc(t, "gateway", bin, append([]string{"gateway", "--http", fmt.Sprintf("127.0.0.1:%d", httpPort), "--auth=false", "--admin", ""}, common...)...)
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	waitReady(t, base)
	// Every server re-executed itself (same process) with sysmon calmed.
	for _, w := range workers {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", w.cmd.Process.Pid))
		if err != nil || !bytes.Contains(env, []byte("GODEBUG="+sysmon.Setting+"\x00")) {
			t.Errorf("%s: GODEBUG=%s not in its environment (%v)", w.name, sysmon.Setting, err)
		}
	}
	hb := watchHeartbeats(t, natsURL)
	testenv.WaitFor(t, 10*time.Second, func() error {
		hb.mu.Lock()
		defer hb.mu.Unlock()
		if len(hb.last) != 2 {
			return fmt.Errorf("%d workers seen", len(hb.last))
		}
		return nil
	})

	// Requests of every shape, spread over both dispatchers and workers.
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"llama-8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":16,"ignore_eos":true,"messages":[{"role":"user","content":"r%d"}]}`, i)
			toks := checkStream(t, post(t, base, "/v1/chat/completions", body), true, 1, true)
			if toks[0] != 16 {
				t.Errorf("request %d: %d tokens", i, toks[0])
			}
		}()
	}
	wg.Wait()
	s := post(t, base, "/v1/completions", `{"model":"llama-8b","max_tokens":4,"prompt":"hi"}`)
	if s.Status != 200 {
		t.Fatalf("non-stream: %d %s", s.Status, s.Body)
	}
	s = post(t, base, "/v1/completions", `{"model":"unknown-model","max_tokens":4,"prompt":"hi"}`)
	if s.Status != 404 {
		t.Fatalf("unknown model: %d %s", s.Status, s.Body)
	}

	// SIGTERM on a worker with streams open: they finish, then it exits.
	results := make(chan sse, 6)
	for i := range 6 {
		go func() {
			results <- post(t, base, "/v1/chat/completions", fmt.Sprintf(`{"model":"llama-8b","stream":true,"stream_options":{"include_usage":true},"max_tokens":600,"ignore_eos":true,"messages":[{"role":"user","content":"long %d"}]}`, i))
		}()
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		hb.mu.Lock()
		defer hb.mu.Unlock()
		if hb.last["w1"].Running == 0 || runningLocked(hb) < 6 {
			return fmt.Errorf("streams not spread yet: %+v", hb.last)
		}
		return nil
	})
	if err := workers[0].stop(t, 30*time.Second); err != nil {
		t.Errorf("worker exit after SIGTERM: %v", err)
	}
	for range 6 {
		toks := checkStream(t, <-results, true, 1, true)
		if toks[0] != 600 {
			t.Errorf("a stream on the draining worker was cut: %d tokens", toks[0])
		}
	}
	// The remaining worker serves everything now.
	checkStream(t, post(t, base, "/v1/chat/completions", `{"model":"llama-8b","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"after"}]}`), true, 1, false)
}

func runningLocked(h *heartbeats) int {
	n := 0
	for _, hb := range h.last {
		n += hb.Running
	}
	return n
}
