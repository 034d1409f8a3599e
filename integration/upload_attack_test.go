package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
)

// TestUploadAttackMemory is issue 32's measurement of finding 3: a gateway
// (the built binary, a process of its own, with --auth, on a standalone
// nats-server and redis-server) under 100 connections each uploading a
// 20 MiB file at once, first without an API key, then with a valid one.
// It samples the gateway's resident memory from /proc every 20 ms and
// fails if the peak passes 300 MB, or if a temporary file is left behind.
//
//	TOKENBUS_UPLOAD_ATTACK=1 go test -count=1 -v -run TestUploadAttackMemory ./integration/
//
// TOKENBUS_GATEWAY_BIN=path runs another build of the tokenbus binary
// instead (the figure before the fix: a build of the older commit).
func TestUploadAttackMemory(t *testing.T) {
	if os.Getenv("TOKENBUS_UPLOAD_ATTACK") == "" {
		t.Skip("set TOKENBUS_UPLOAD_ATTACK=1: 2 x 100 uploads of 20 MiB against a gateway process, ~1 min")
	}
	const (
		conns     = 100
		fileBytes = 20 << 20
		limitRSS  = 300 << 20
	)
	bin := os.Getenv("TOKENBUS_GATEWAY_BIN")
	if bin == "" {
		bin = tokenbusBinary(t)
	}
	rd, store := startStore(t)
	natsPort, httpPort := testenv.FreePort(t), testenv.FreePort(t)
	startProc(t, "nats-server", natsServer(t), "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-js", "-sd", t.TempDir())
	tmp := t.TempDir() // the gateway's TMPDIR: where multipart files would go
	addr := fmt.Sprintf("127.0.0.1:%d", httpPort)
	gw := exec.Command(bin, "gateway", "--http", addr, "--auth", "--admin", "",
		"--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", natsPort), "--redis-url", rd.URL, "--log-level", "error")
	gw.Env = append(os.Environ(), "TMPDIR="+tmp)
	gw.Stdout, gw.Stderr = testWriter{t}, testWriter{t}
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Process.Kill(); _ = gw.Wait() })
	waitPath(t, "http://"+addr, "/health")
	_, key, err := store.CreateKey(context.Background(), registry.KeySpec{Name: "attacker", Tenant: "attacker"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gateway RSS at rest: %d MB", rss(t, gw.Process.Pid)>>20)

	for _, phase := range []struct{ name, key string }{{"unauthenticated", ""}, {"authenticated", key}} {
		stop := make(chan struct{})
		peak := make(chan int64)
		go func() {
			var top int64
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				if v := rss(t, gw.Process.Pid); v > top {
					top = v
				}
				select {
				case <-stop:
					peak <- top
					return
				case <-tick.C:
				}
			}
		}()
		start := time.Now()
		var mu sync.Mutex
		statuses := map[string]int{}
		var wg sync.WaitGroup
		for range conns {
			wg.Go(func() {
				st := attackUpload(addr, phase.key, fileBytes)
				mu.Lock()
				statuses[st]++
				mu.Unlock()
			})
		}
		wg.Wait()
		close(stop)
		top := <-peak
		var seen []string
		for st, n := range statuses {
			seen = append(seen, fmt.Sprintf("%s x%d", st, n))
		}
		sort.Strings(seen)
		t.Logf("%s: %d x %d MiB in %s; answers %s; peak gateway RSS %d MB", phase.name, conns, fileBytes>>20,
			time.Since(start).Round(time.Millisecond), strings.Join(seen, ", "), top>>20)
		if top > limitRSS {
			t.Errorf("%s: peak RSS %d MB, over %d MB", phase.name, top>>20, limitRSS>>20)
		}
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "multipart-*"))
	if len(left) > 0 {
		t.Errorf("%d temporary multipart files left in the gateway's TMPDIR", len(left))
	}
}

// attackUpload sends one upload of a fileBytes file as fast as it can (the
// whole body, whatever the server answers meanwhile) and returns the
// answer's status, or what went wrong.
func attackUpload(addr, key string, fileBytes int) string {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return "dial error"
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Minute))
	length := len(uploadHead()) + fileBytes + len(uploadTail)
	hdr := "POST /v1/files HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: multipart/form-data; boundary=" + uploadBoundary +
		"\r\nContent-Length: " + strconv.Itoa(length) + "\r\n"
	if key != "" {
		hdr += "Authorization: Bearer " + key + "\r\n"
	}
	answer := make(chan string, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			answer <- "no answer"
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		answer <- strconv.Itoa(resp.StatusCode)
	}()
	if _, err := io.WriteString(conn, hdr+"\r\n"+uploadHead()); err == nil {
		_ = sendBody(conn, fileBytes)
	}
	return <-answer
}

// rss is the resident memory of process pid in bytes, from /proc.
func rss(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
