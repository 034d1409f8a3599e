package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
)

// gatewayOutMsgs is how many messages the NATS server has sent to the
// gateway's connection (its monitoring endpoint's /connz).
func gatewayOutMsgs(t *testing.T, monitor string) int64 {
	t.Helper()
	resp, err := http.Get(monitor + "/connz?limit=1000")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cz struct {
		Connections []struct {
			Name    string `json:"name"`
			OutMsgs int64  `json:"out_msgs"`
		} `json:"connections"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&cz); err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Connections {
		if c.Name == "tokenbus-gateway" {
			return c.OutMsgs
		}
	}
	t.Fatal("no tokenbus-gateway connection in /connz")
	return 0
}

// TestListingReadsOnlyOwnTenant is issue 32's finding 10: GET /v1/files
// and GET /v1/batches read the caller's own entries of the per-tenant
// index, not every tenant's objects and records. With another tenant's
// 1,000 files and 100 batches in the store, one tenant's listings cost the
// gateway a few messages from NATS (counted on the server's monitoring
// endpoint), not one per object.
func TestListingReadsOnlyOwnTenant(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 1,100 objects and records, ~10 s")
	}
	t.Parallel()
	ctx := context.Background()
	natsPort, monPort := testenv.FreePort(t), testenv.FreePort(t)
	startProc(t, "nats-server", natsServer(t), "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-m", strconv.Itoa(monPort),
		"-js", "-sd", t.TempDir())
	url, monitor := fmt.Sprintf("nats://127.0.0.1:%d", natsPort), fmt.Sprintf("http://127.0.0.1:%d", monPort)
	waitPath(t, monitor, "/healthz?js-enabled-only=true")
	// Another tenant's files and batches, as a trusted Go program writes
	// them (the batch store).
	s, err := batch.Open(ctx, connectNATS(t, url), batch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const otherFiles, otherBatches = 1000, 100
	var in batch.File
	for i := range otherFiles {
		if in, err = s.PutFile(ctx, "other", fmt.Sprintf("f%d.jsonl", i), "batch", strings.NewReader(line("x")), 0); err != nil {
			t.Fatal(err)
		}
	}
	for range otherBatches {
		if _, err := s.CreateBatch(ctx, "other", "", batch.CreateRequest{InputFileID: in.ID, Endpoint: "/v1/chat/completions",
			CompletionWindow: "24h"}); err != nil {
			t.Fatal(err)
		}
	}
	gcfg := program.DefaultGateway()
	gcfg.NATS, gcfg.Redis.URL = natsconn.Options{URL: url}, ""
	gcfg.HTTP.Listen, gcfg.HTTP.Admin, gcfg.HTTP.Auth = "127.0.0.1:0", "", false
	gcfg.HTTP.Batch.Runner = false // no runner reading the batches meanwhile
	gcfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	gw, err := program.StartGateway(ctx, gcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	base := "http://" + gw.Addr()
	own := tenantAPI{t, base, "unused"}
	for range 3 {
		mustUpload(t, own, line("mine"))
	}
	if st, body := own.call("POST", "/v1/batches", `{"input_file_id":"`+own.fileID(mustUpload(t, own, line("b")))+
		`","endpoint":"/v1/chat/completions","completion_window":"24h"}`); st != 200 {
		t.Fatalf("own batch: %d %s", st, body)
	}
	// The gateway reconciles its index at start (it reads everything
	// once): wait until its connection is quiet.
	last := int64(-1)
	testenv.WaitFor(t, 30*time.Second, func() error {
		n := gatewayOutMsgs(t, monitor)
		if n != last {
			last = n
			time.Sleep(200 * time.Millisecond)
			return fmt.Errorf("the gateway still receives messages (%d)", n)
		}
		return nil
	})
	before := gatewayOutMsgs(t, monitor)
	st, files := own.call("GET", "/v1/files?limit=100", "")
	if st != 200 || strings.Count(files, `"object":"file"`) != 4 {
		t.Fatalf("own files: %d %s", st, files)
	}
	st, batches := own.call("GET", "/v1/batches", "")
	if st != 200 || strings.Count(batches, `"object":"batch"`) != 1 {
		t.Fatalf("own batches: %d %s", st, batches)
	}
	used := gatewayOutMsgs(t, monitor) - before
	t.Logf("two listings of one tenant beside another's %d files and %d batches: %d messages to the gateway", otherFiles, otherBatches, used)
	if used > 50 {
		t.Fatalf("the listings took %d messages from NATS: they read other tenants' objects", used)
	}
}
