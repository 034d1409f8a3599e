package program

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/fleet"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// batchAPI is a client of one gateway's Files and Batches APIs, for tests.
type batchAPI struct {
	t    *testing.T
	base string
	key  string // API key, if any
}

func (a batchAPI) do(method, path, ctype string, body io.Reader, out any) int {
	a.t.Helper()
	req, err := http.NewRequest(method, a.base+path, body)
	if err != nil {
		a.t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if a.key != "" {
		req.Header.Set("Authorization", "Bearer "+a.key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(b, out); err != nil {
			if p, ok := out.(*[]byte); ok {
				*p = b
			} else {
				a.t.Fatalf("%s %s: %v: %s", method, path, err, b)
			}
		}
	} else if p, ok := out.(*[]byte); ok {
		*p = b
	}
	return resp.StatusCode
}

func (a batchAPI) upload(name string, content []byte) batch.File {
	a.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", name)
	_, _ = fw.Write(content)
	_ = mw.Close()
	var f batch.File
	if st := a.do("POST", "/v1/files", mw.FormDataContentType(), &buf, &f); st != 200 {
		a.t.Fatalf("upload: %d", st)
	}
	return f
}

func (a batchAPI) create(fileID, endpoint string) batch.Batch {
	a.t.Helper()
	var b batch.Batch
	body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":%q,"completion_window":"24h"}`, fileID, endpoint)
	if st := a.do("POST", "/v1/batches", "application/json", strings.NewReader(body), &b); st != 200 {
		a.t.Fatalf("create batch: %d", st)
	}
	return b
}

func (a batchAPI) wait(id string, until func(batch.Batch) bool) batch.Batch {
	a.t.Helper()
	var b batch.Batch
	testenv.WaitFor(a.t, 30*time.Second, func() error {
		b = batch.Batch{}
		if st := a.do("GET", "/v1/batches/"+id, "", nil, &b); st != 200 || !until(b) {
			return fmt.Errorf("batch %s: %d %s %+v", id, st, b.Status, b.RequestCounts)
		}
		return nil
	})
	return b
}

// eachOutputLine checks every line of an output file with check, which
// returns the line's custom_id: n lines, each custom_id once.
func (a batchAPI) eachOutputLine(fileID string, n int, check func(line []byte) string) {
	a.t.Helper()
	var out []byte
	if st := a.do("GET", "/v1/files/"+fileID+"/content", "", nil, &out); st != 200 {
		a.t.Fatalf("output content: %d %s", st, out)
	}
	seen := map[string]bool{}
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		id := check(line)
		if seen[id] {
			a.t.Fatalf("custom_id %q twice in the output", id)
		}
		seen[id] = true
	}
	if len(seen) != n {
		a.t.Fatalf("%d custom_ids in the output, want %d", len(seen), n)
	}
}

// startBatchDev starts tokenbus dev on free ports, no admin listener unless
// edit sets one, stopped with the test.
func startBatchDev(t *testing.T, edit func(*DevConfig)) (*Dev, batchAPI) {
	t.Helper()
	cfg := DefaultDev()
	cfg.HTTP.Listen, cfg.HTTP.Admin, cfg.NATSListen = "127.0.0.1:0", "", "127.0.0.1:-1"
	edit(&cfg)
	d, err := StartDev(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d, batchAPI{t: t, base: "http://" + d.Addr()}
}

func chatLines(n int, model string) []byte {
	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"hi %d"}]}}`+"\n", i, model, i)
	}
	return buf.Bytes()
}

// A batch through dev: upload, create, run, the output file in OpenAI's
// line format with every custom_id once.
func TestBatchRunsThroughDev(t *testing.T) {
	d, api := startBatchDev(t, func(cfg *DevConfig) {
		cfg.HTTP.Admin = "127.0.0.1:0"
		cfg.SimWorkers = 2
		fast(&cfg.Engine)
	})

	const n = 50
	f := api.upload("in.jsonl", chatLines(n, d.Models()[0]))
	if f.Object != "file" || f.Purpose != "batch" || f.Bytes != int64(len(chatLines(n, d.Models()[0]))) || f.Filename != "in.jsonl" {
		t.Fatalf("file %+v", f)
	}
	b := api.create(f.ID, "/v1/chat/completions")
	if b.Status != batch.StatusValidating || b.Object != "batch" || b.ExpiresAt == nil {
		t.Fatalf("created %+v", b)
	}
	b = api.wait(b.ID, func(b batch.Batch) bool { return b.Status == batch.StatusCompleted || b.Status == batch.StatusFailed })
	if b.Status != batch.StatusCompleted || b.RequestCounts != (batch.RequestCounts{Total: n, Completed: n}) ||
		b.OutputFileID == nil || b.ErrorFileID != nil || b.CompletedAt == nil || b.InProgressAt == nil || b.FinalizingAt == nil {
		t.Fatalf("ended %+v errors %+v", b, b.Errors)
	}
	// The admin API lists every tenant's batches; the metrics count lines.
	req, _ := http.NewRequest("GET", "http://"+d.AdminAddr()+"/batches", nil)
	req.Header.Set("Authorization", "Bearer "+d.AdminToken())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	adm, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(adm, []byte(`"id":"`+b.ID+`"`)) || !bytes.Contains(adm, []byte(`"queued_lines":0`)) {
		t.Fatalf("admin /batches: %d %s", resp.StatusCode, adm)
	}
	var metrics []byte
	if st := api.do("GET", "/metrics", "", nil, &metrics); st != 200 ||
		!bytes.Contains(metrics, []byte(fmt.Sprintf(`tokenbus_batch_lines_total{outcome="ok"} %d`, n))) ||
		!bytes.Contains(metrics, []byte("tokenbus_batch_lines_queued 0")) {
		t.Fatalf("metrics: %d\n%s", st, metrics)
	}
	api.eachOutputLine(*b.OutputFileID, n, func(line []byte) string {
		var ol struct {
			ID       string `json:"id"`
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int             `json:"status_code"`
				RequestID  string          `json:"request_id"`
				Body       json.RawMessage `json:"body"`
			} `json:"response"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(line, &ol); err != nil {
			t.Fatalf("output line %s: %v", line, err)
		}
		if !strings.HasPrefix(ol.ID, "batch_req_") || ol.Response.StatusCode != 200 ||
			string(ol.Error) != "null" || !bytes.Contains(ol.Response.Body, []byte(`"chat.completion"`)) {
			t.Fatalf("output line %s", line)
		}
		return ol.CustomID
	})
}

// Cancelling a running batch: lines running finish, lines not started are
// answered as cancelled in the error file, and the batch ends cancelled
// with every line counted once.
func TestBatchCancel(t *testing.T) {
	d, api := startBatchDev(t, func(cfg *DevConfig) {
		cfg.SimWorkers = 1
		cfg.HTTP.Batch.MaxInFlight, cfg.HTTP.Batch.MaxPerBatch = 4, 4
		cfg.Engine.Sim.DecodeBase, cfg.Engine.Sim.PrefillBase = 20*time.Millisecond, time.Millisecond
	})
	const n = 200
	b := api.create(api.upload("in.jsonl", chatLines(n, d.Models()[0])).ID, "/v1/chat/completions")
	api.wait(b.ID, func(b batch.Batch) bool { return b.RequestCounts.Completed > 0 })
	var c batch.Batch
	if st := api.do("POST", "/v1/batches/"+b.ID+"/cancel", "", nil, &c); st != 200 || c.Status != batch.StatusCancelling || c.CancellingAt == nil {
		t.Fatalf("cancel: %d %+v", st, c)
	}
	b = api.wait(b.ID, func(b batch.Batch) bool { return b.Status == batch.StatusCancelled })
	rc := b.RequestCounts
	if rc.Total != n || rc.Completed+rc.Failed != n || rc.Completed == 0 || rc.Failed == 0 || b.ErrorFileID == nil || b.CancelledAt == nil {
		t.Fatalf("cancelled %+v counts %+v", b, rc)
	}
	var errs []byte
	if st := api.do("GET", "/v1/files/"+*b.ErrorFileID+"/content", "", nil, &errs); st != 200 ||
		bytes.Count(errs, []byte(`"code":"batch_cancelled"`)) != rc.Failed || bytes.Count(errs, []byte("\n")) != rc.Failed {
		t.Fatalf("error file: %d, %d lines, want %d cancelled:\n%.300s", st, bytes.Count(errs, []byte("\n")), rc.Failed, errs)
	}
	if st := api.do("POST", "/v1/batches/"+b.ID+"/cancel", "", nil, nil); st != 200 {
		t.Fatalf("cancel again: %d, want 200 (cancelled already)", st)
	}
}

// The HTTP side of files: an upload over --file-limit is 413 and kept
// nowhere; list, get, content and delete in OpenAI's shapes.
func TestFilesHTTP(t *testing.T) {
	_, api := startBatchDev(t, func(cfg *DevConfig) {
		cfg.SimWorkers = 1
		cfg.HTTP.BodyLimit = 1 << 10
		cfg.HTTP.Batch.FileLimit = 100 << 10
	})

	// Past the body limit, within the file limit: files have their own.
	content := bytes.Repeat([]byte("x"), 50<<10)
	f := api.upload("a.jsonl", content)
	for _, size := range []int{100<<10 + 1, 1 << 20} {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		_ = mw.WriteField("purpose", "batch")
		fw, _ := mw.CreateFormFile("file", "big.jsonl")
		_, _ = fw.Write(bytes.Repeat([]byte("y"), size))
		_ = mw.Close()
		var body []byte
		if st := api.do("POST", "/v1/files", mw.FormDataContentType(), &buf, &body); st != 413 || !bytes.Contains(body, []byte("file_too_large")) {
			t.Fatalf("upload of %d bytes: %d %s", size, st, body)
		}
	}
	// The body limit still holds everywhere else.
	big := `{"model":"x","prompt":"` + strings.Repeat("z", 2<<10) + `"}`
	if st := api.do("POST", "/v1/completions", "application/json", strings.NewReader(big), nil); st != 413 {
		t.Fatalf("completion over the body limit: %d", st)
	}
	var l batch.FileList
	if st := api.do("GET", "/v1/files?purpose=batch", "", nil, &l); st != 200 || l.Object != "list" || len(l.Data) != 1 || l.Data[0].ID != f.ID {
		t.Fatalf("list: %d %+v", st, l)
	}
	var got []byte
	if st := api.do("GET", "/v1/files/"+f.ID+"/content", "", nil, &got); st != 200 || !bytes.Equal(got, content) {
		t.Fatalf("content: %d, %d bytes", st, len(got))
	}
	var del batch.FileDeleted
	if st := api.do("DELETE", "/v1/files/"+f.ID, "", nil, &del); st != 200 || !del.Deleted || del.ID != f.ID || del.Object != "file" {
		t.Fatalf("delete: %d %+v", st, del)
	}
	var body []byte
	if st := api.do("GET", "/v1/files/"+f.ID, "", nil, &body); st != 404 || !bytes.Contains(body, []byte("No such File object")) {
		t.Fatalf("after delete: %d %s", st, body)
	}
	if st := api.do("GET", "/v1/batches/batch_nope", "", nil, &body); st != 404 {
		t.Fatalf("unknown batch: %d %s", st, body)
	}
}

// A batch past its completion window: lines running finish, the rest are
// answered batch_expired in the error file, and it ends expired.
func TestBatchExpires(t *testing.T) {
	d, api := startBatchDev(t, func(cfg *DevConfig) {
		cfg.SimWorkers = 1
		cfg.HTTP.Batch.MaxInFlight, cfg.HTTP.Batch.MaxPerBatch = 2, 2
		cfg.Engine.Sim.DecodeBase, cfg.Engine.Sim.PrefillBase = 20*time.Millisecond, time.Millisecond
	})
	const n = 100
	b := api.create(api.upload("in.jsonl", chatLines(n, d.Models()[0])).ID, "/v1/chat/completions")
	api.wait(b.ID, func(b batch.Batch) bool { return b.RequestCounts.Completed > 0 })

	// The window ends now: move expires_at into the past, as 24 hours would.
	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), batch.BatchesBucket)
	if err != nil {
		t.Fatal(err)
	}
	for {
		e, err := kv.Get(context.Background(), b.ID)
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]any
		_ = json.Unmarshal(e.Value(), &rec)
		rec["expires_at"] = time.Now().Add(-time.Second).Unix()
		v, _ := json.Marshal(rec)
		if _, err := kv.Update(context.Background(), b.ID, v, e.Revision()); err == nil {
			break
		}
	}
	b = api.wait(b.ID, func(b batch.Batch) bool { return b.Status == batch.StatusExpired })
	rc := b.RequestCounts
	if rc.Total != n || rc.Completed+rc.Failed != n || rc.Failed == 0 || b.ExpiredAt == nil || b.ErrorFileID == nil {
		t.Fatalf("expired %+v", b)
	}
	var errs []byte
	if st := api.do("GET", "/v1/files/"+*b.ErrorFileID+"/content", "", nil, &errs); st != 200 ||
		bytes.Count(errs, []byte(`"response":null,"error":{"code":"batch_expired"`)) != rc.Failed {
		t.Fatalf("error file: %d\n%.300s", st, errs)
	}
}

// A runner that died holding a batch's lease (here: validating, as a
// record left by a crashed runner says) leaves it to another once the
// lease lapses; the batch then runs to its end.
func TestBatchLeaseTakeover(t *testing.T) {
	d, api := startBatchDev(t, func(cfg *DevConfig) {
		cfg.SimWorkers = 1
		fast(&cfg.Engine)
		cfg.HTTP.Batch.Runner = false // dev's gateway serves the API; no runner
	})
	b := api.create(api.upload("in.jsonl", chatLines(10, d.Models()[0])).ID, "/v1/chat/completions")

	nc, err := nats.Connect(d.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), batch.BatchesBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), b.ID)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	_ = json.Unmarshal(e.Value(), &rec)
	lapses := time.Now().Add(time.Second)
	rec["leaser"], rec["lease_until"] = "runner-that-died", lapses.UnixMilli()
	v, _ := json.Marshal(rec)
	if _, err := kv.Update(context.Background(), b.ID, v, e.Revision()); err != nil {
		t.Fatal(err)
	}

	// Another gateway, with a runner, on dev's NATS.
	gcfg := DefaultGateway()
	gcfg.NATS.URL, gcfg.Redis.URL = d.NATSURL(), ""
	gcfg.HTTP.Listen, gcfg.HTTP.Admin, gcfg.HTTP.Auth = "127.0.0.1:0", "", false
	gw, err := StartGateway(context.Background(), gcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	b = api.wait(b.ID, func(b batch.Batch) bool { return b.Status == batch.StatusCompleted })
	if b.InProgressAt == nil || *b.InProgressAt < lapses.Unix() || b.RequestCounts.Completed != 10 {
		t.Fatalf("completed %+v: in progress at %v, the lease lapsed at %d", b, b.InProgressAt, lapses.Unix())
	}
}

// Tenants share a runner fairly: one with three batches gets no more lines
// running than one with a single batch (per batch, it would get three
// quarters of them).
func TestBatchTenantsShareFairly(t *testing.T) {
	d, _ := startBatchDev(t, func(cfg *DevConfig) {
		cfg.HTTP.Auth = true
		cfg.SimWorkers = 1
		cfg.HTTP.Batch.MaxInFlight, cfg.HTTP.Batch.MaxPerBatch = 4, 4
		cfg.Engine.Sim.DecodeBase, cfg.Engine.Sim.PrefillBase = 5*time.Millisecond, time.Millisecond
	})
	store, err := registry.Open(context.Background(), d.StoreURL())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	_, keyA, err := store.CreateKey(context.Background(), registry.KeySpec{Tenant: "a"})
	if err != nil {
		t.Fatal(err)
	}
	kB, keyB, _ := store.CreateKey(context.Background(), registry.KeySpec{Tenant: "b"})
	a := batchAPI{t: t, base: "http://" + d.Addr(), key: keyA}
	b := batchAPI{t: t, base: "http://" + d.Addr(), key: keyB}
	const n = 40
	var ofA []string
	for range 3 {
		ofA = append(ofA, a.create(a.upload("a.jsonl", chatLines(n, d.Models()[0])).ID, "/v1/chat/completions").ID)
	}
	answeredA := func() int {
		done := 0
		for _, id := range ofA {
			var x batch.Batch
			if st := a.do("GET", "/v1/batches/"+id, "", nil, &x); st != 200 {
				t.Fatalf("A's batch: %d", st)
			}
			done += x.RequestCounts.Completed
		}
		return done
	}
	one := b.create(b.upload("b.jsonl", chatLines(n, d.Models()[0])).ID, "/v1/chat/completions")
	b.wait(one.ID, func(x batch.Batch) bool { return x.Status == batch.StatusInProgress })
	before := answeredA() // A ran alone until B's batch began
	b.wait(one.ID, func(x batch.Batch) bool { return x.Status == batch.StatusCompleted })
	during := answeredA() - before
	// Fair: about n of A's lines ran while B's n did; per batch it would
	// have been about 3n. 2n leaves room for timing.
	if before >= n {
		t.Fatalf("tenant A had %d lines answered before B's batch began: the test cannot tell a fair share", before)
	}
	if during > 2*n {
		t.Fatalf("tenant A had %d lines answered while tenant B's %d were: not a fair share", during, n)
	}
	t.Logf("while tenant B's %d lines ran, tenant A's three batches had %d answered", n, during)
	// And A's batches all end.
	for _, id := range ofA {
		a.wait(id, func(x batch.Batch) bool { return x.Status == batch.StatusCompleted })
	}
	// Batch tokens count in the key's usage (and its TPM window), each line once.
	testenv.WaitFor(t, 10*time.Second, func() error {
		rows, err := store.Usage(context.Background(), kB.ID, d.Models()[0])
		if err != nil || len(rows) != 1 || rows[0].Requests != n || rows[0].CompletionTokens != 4*n {
			return fmt.Errorf("usage of B's key: %+v %v", rows, err)
		}
		return nil
	})
	// Tenants see only their own.
	var l batch.BatchList
	if st := b.do("GET", "/v1/batches", "", nil, &l); st != 200 || len(l.Data) != 1 || l.Data[0].ID != one.ID {
		t.Fatalf("B's list: %d %+v", st, l)
	}
	if st := b.do("GET", "/v1/batches/"+ofA[0], "", nil, nil); st != 404 {
		t.Fatalf("A's batch as B: %d, want 404", st)
	}
}

// A line the endpoint refuses is answered with its error, in the error
// file, and counted failed; the batch still completes.
func TestBatchLineErrors(t *testing.T) {
	d, api := startBatchDev(t, func(cfg *DevConfig) {
		cfg.SimWorkers = 1
		fast(&cfg.Engine)
	})
	lines := chatLines(2, d.Models()[0])
	lines = append(lines, fmt.Sprintf(`{"custom_id":"bad","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":0,"messages":[{"role":"user","content":"x"}]}}`+"\n", d.Models()[0])...)
	b := api.create(api.upload("in.jsonl", lines).ID, "/v1/chat/completions")
	b = api.wait(b.ID, func(b batch.Batch) bool { return b.Status == batch.StatusCompleted })
	if b.RequestCounts != (batch.RequestCounts{Total: 3, Completed: 2, Failed: 1}) || b.OutputFileID == nil || b.ErrorFileID == nil {
		t.Fatalf("ended %+v", b)
	}
	var errs []byte
	if st := api.do("GET", "/v1/files/"+*b.ErrorFileID+"/content", "", nil, &errs); st != 200 ||
		!bytes.Contains(errs, []byte(`"custom_id":"bad","response":{"status_code":400`)) ||
		!bytes.Contains(errs, []byte(`"code":"integer_below_min_value"`)) || !bytes.Contains(errs, []byte(`"error":null}`)) {
		t.Fatalf("error file: %d %s", st, errs)
	}
}

// An embeddings batch: each line a /v1/embeddings request, each answer
// OpenAI's embeddings list.
func TestBatchEmbeddings(t *testing.T) {
	d, api := startBatchDev(t, func(cfg *DevConfig) {
		fast(&cfg.Engine)
	})
	const n = 10
	var lines bytes.Buffer
	for i := range n {
		fmt.Fprintf(&lines, `{"custom_id":"e-%d","method":"POST","url":"/v1/embeddings","body":{"model":%q,"input":"text number %d"}}`+"\n", i, d.Models()[0], i)
	}
	b := api.create(api.upload("emb.jsonl", lines.Bytes()).ID, "/v1/embeddings")
	b = api.wait(b.ID, func(b batch.Batch) bool { return b.Status == batch.StatusCompleted || b.Status == batch.StatusFailed })
	if b.Status != batch.StatusCompleted || b.RequestCounts != (batch.RequestCounts{Total: n, Completed: n}) || b.OutputFileID == nil {
		t.Fatalf("ended %+v errors %+v", b, b.Errors)
	}
	api.eachOutputLine(*b.OutputFileID, n, func(line []byte) string {
		var ol struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int `json:"status_code"`
				Body       struct {
					Object string `json:"object"`
					Data   []struct {
						Object    string    `json:"object"`
						Embedding []float64 `json:"embedding"`
					} `json:"data"`
				} `json:"body"`
			} `json:"response"`
		}
		if err := json.Unmarshal(line, &ol); err != nil {
			t.Fatalf("output line %s: %v", line, err)
		}
		r := ol.Response
		if r.StatusCode != 200 || r.Body.Object != "list" || len(r.Body.Data) != 1 || r.Body.Data[0].Object != "embedding" || len(r.Body.Data[0].Embedding) == 0 {
			t.Fatalf("output line %s", line)
		}
		return ol.CustomID
	})
}

// The console's batch routes on the admin API act for any tenant: cancel a
// running batch, then download its output and error files, the same bytes
// as the tenant gets from /v1/files/{id}/content.
func TestAdminBatchRoutes(t *testing.T) {
	d, api := startBatchDev(t, func(cfg *DevConfig) {
		cfg.HTTP.Admin = "127.0.0.1:0"
		cfg.SimWorkers = 1
		cfg.HTTP.Batch.MaxInFlight, cfg.HTTP.Batch.MaxPerBatch = 4, 4
		cfg.Engine.Sim.DecodeBase, cfg.Engine.Sim.PrefillBase = 20*time.Millisecond, time.Millisecond
	})
	adm := batchAPI{t: t, base: "http://" + d.AdminAddr(), key: d.AdminToken()}
	const n = 100
	b := api.create(api.upload("in.jsonl", chatLines(n, d.Models()[0])).ID, "/v1/chat/completions")
	var body []byte
	if st := adm.do("GET", "/batches/"+b.ID+"/output", "", nil, &body); st != 404 || !bytes.Contains(body, []byte("No such File object: "+b.ID+" output")) {
		t.Fatalf("output before there is one: %d %s", st, body)
	}
	if st := adm.do("POST", "/batches/batch_nope/cancel", "", nil, &body); st != 404 || !bytes.Contains(body, []byte("No batch found with id")) {
		t.Fatalf("cancel of no batch: %d %s", st, body)
	}
	api.wait(b.ID, func(b batch.Batch) bool { return b.RequestCounts.Completed > 0 })
	var c batch.Batch
	if st := adm.do("POST", "/batches/"+b.ID+"/cancel", "", nil, &c); st != 200 || c.Status != batch.StatusCancelling {
		t.Fatalf("admin cancel: %d %+v", st, c)
	}
	b = api.wait(b.ID, func(b batch.Batch) bool { return b.Status == batch.StatusCancelled })
	if b.OutputFileID == nil || b.ErrorFileID == nil {
		t.Fatalf("cancelled %+v: want an output and an error file", b)
	}
	for _, f := range []struct{ route, id string }{{"output", *b.OutputFileID}, {"errors", *b.ErrorFileID}} {
		var viaAdmin, viaAPI []byte
		if st := adm.do("GET", "/batches/"+b.ID+"/"+f.route, "", nil, &viaAdmin); st != 200 || len(viaAdmin) == 0 {
			t.Fatalf("admin %s: %d %s", f.route, st, viaAdmin)
		}
		if st := api.do("GET", "/v1/files/"+f.id+"/content", "", nil, &viaAPI); st != 200 || !bytes.Equal(viaAdmin, viaAPI) {
			t.Fatalf("%s: admin gave %d bytes, /v1/files %d (status %d)", f.route, len(viaAdmin), len(viaAPI), st)
		}
	}
}

// The runner's capacity check: what is idle less headroom where workers
// serve the model; one line (a held request: demand for a worker to start)
// where none does.
func TestFreeSlots(t *testing.T) {
	fl := fleet.New()
	now := time.Now()
	fl.Observe(schemas.Heartbeat{Worker: "w1", Models: []string{"m"}, MaxConcurrency: 10, Running: 4, Healthy: true}, now)
	fl.Observe(schemas.Heartbeat{Worker: "w2", Models: []string{"m"}, MaxConcurrency: 10, Healthy: true, Draining: true}, now)
	free := freeSlots(fl, 0.2)
	for _, tc := range []struct {
		model string
		want  int
	}{
		{"m", 6 - 2}, // w1's 6 free less 20 % of its 10; w2 drains
		{"cold", 1},  // no worker: one line, held until one comes
	} {
		if got := free(tc.model); got != tc.want {
			t.Errorf("free(%s) = %d, want %d", tc.model, got, tc.want)
		}
	}
}
