package integration

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

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
)

// tenantAPI is one tenant's calls on the OpenAI API, with its key.
type tenantAPI struct {
	t    *testing.T
	base string
	key  string
}

// upload posts a file of size bytes (lines of "{}"); chunked sends it with
// no Content-Length. It returns the status and the body.
func (a tenantAPI) upload(size int, chunked bool) (int, string) {
	a.t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write(bytes.Repeat([]byte("{}\n"), size/3))
	_, _ = fw.Write([]byte("\n\n")[:size%3])
	_ = mw.Close()
	var r io.Reader = &body
	if chunked {
		r = io.MultiReader(&body) // no length known: sent chunked
	}
	req, _ := http.NewRequest("POST", a.base+"/v1/files", r)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+a.key)
	resp, err := httpClient.Do(req)
	if err != nil {
		a.t.Fatalf("upload: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// call sends a JSON request and returns the status and body.
func (a tenantAPI) call(method, path, body string) (int, string) {
	a.t.Helper()
	var r io.Reader
	ctype := ""
	if body != "" {
		r, ctype = strings.NewReader(body), "application/json"
	}
	st, b, err := httpJSON(method, a.base+path, ctype, r, nil, "Authorization", "Bearer "+a.key)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	return st, string(b)
}

func (a tenantAPI) fileID(body string) string {
	var f struct{ ID string }
	if json.Unmarshal([]byte(body), &f) != nil || f.ID == "" {
		a.t.Fatalf("not a file: %s", body)
	}
	return f.ID
}

// wantCode checks an error answer's status and code.
func wantCode(t *testing.T, what string, st int, body string, status int, code string) {
	t.Helper()
	if st != status {
		t.Fatalf("%s: %d %s, want %d %s", what, st, body, status, code)
	}
	if e := errorBody(t, body); e.Code == nil || *e.Code != code {
		t.Fatalf("%s: %s, want code %s", what, body, code)
	}
}

// tenantView is what the admin API shows of a tenant.
type tenantView struct {
	Tenant    string          `json:"tenant"`
	Quotas    registry.Quotas `json:"quotas"`
	Effective registry.Quotas `json:"effective"`
	Use       *batch.FileUse  `json:"use"`
}

// TestTenantQuotas is issue 32's finding 4 (quotas): a tenant's quotas set
// on the admin API are enforced before anything is written (an upload over
// the bytes quota by its Content-Length before its body is read, a chunked
// one as soon as it passes, with nothing of it kept; the files count; the
// batches not yet ended), and with that tenant at its quotas another
// tenant uploads, makes batches and is served as usual.
//
// The lead's extension point: stored responses, background responses and
// resumable streams of the other tenant go where "beta is served" is.
func TestTenantQuotas(t *testing.T) {
	t.Parallel()
	d, _, keys := devWithKeys(t, []string{"acme", "beta"}, func(c *program.DevConfig) { c.HTTP.Batch.Runner = false })
	acme := tenantAPI{t, d.URL, keys["acme"]}
	beta := tenantAPI{t, d.URL, keys["beta"]}
	const mib = 1 << 20
	var view tenantView
	if st := adminCall(t, d, "admin-secret", "PUT", "/tenants/acme/quotas",
		fmt.Sprintf(`{"file_bytes":%d,"files":3,"batches":1}`, 2*mib), &view); st != 200 ||
		view.Effective.FileBytes != 2*mib || view.Effective.Files != 3 || view.Effective.Batches != 1 {
		t.Fatalf("PUT quotas: %d %+v", st, view)
	}

	if st := adminCall(t, d, "admin-secret", "PUT", "/tenants/acme/quotas", `{"filez":1}`, nil); st != 400 {
		t.Fatalf("PUT with an unknown field: %d", st)
	}
	if st := adminCall(t, d, "admin-secret", "PUT", "/tenants/a%2Fb/quotas", `{"files":-1}`, &view); st != 200 ||
		view.Tenant != "a/b" || view.Effective.Files != 0 {
		t.Fatalf("PUT for a tenant with a slash: %d %+v", st, view)
	}
	if st := adminCall(t, d, "admin-secret", "PUT", "/tenants/a%2Fb/quotas", `{}`, nil); st != 200 {
		t.Fatalf("PUT all zero: %d", st)
	}
	st, body := acme.upload(mib, false)
	if st != 200 {
		t.Fatalf("acme's first MiB: %d %s", st, body)
	}
	first := acme.fileID(body)
	// 1.5 MiB more by its Content-Length: refused on its headers.
	conn := rawUpload(t, strings.TrimPrefix(d.URL, "http://"), keys["acme"], 3*mib/2)
	resp, raw := readAnswer(t, conn, 5*time.Second)
	wantCode(t, "over the bytes quota by Content-Length", resp.StatusCode, raw, 403, "quota_exceeded")
	// The same chunked: cut once it passes, nothing of it kept.
	st, body = acme.upload(3*mib/2, true)
	wantCode(t, "over the bytes quota, chunked", st, body, 403, "quota_exceeded")
	if st := adminCall(t, d, "admin-secret", "GET", "/tenants/acme/quotas", "", &view); st != 200 ||
		view.Use == nil || view.Use.Files != 1 || view.Use.FileBytes != mib {
		t.Fatalf("acme's use after two refused uploads: %d %+v", st, view.Use)
	}
	if n := bucketBytes(t, d.NATSURL); n > mib+mib/4 {
		t.Fatalf("the files bucket holds %d bytes after the refused uploads: the cut one was kept", n)
	}
	// The count: two more small files, then the fourth is refused.
	for i := range 2 {
		if st, body := acme.upload(100, false); st != 200 {
			t.Fatalf("acme's small file %d: %d %s", i, st, body)
		}
	}
	st, body = acme.upload(100, false)
	wantCode(t, "over the files quota", st, body, 403, "quota_exceeded")

	// Batches: one not yet ended (no runner here: it stays validating),
	// then 429.
	st, body = acme.call("POST", "/v1/batches", `{"input_file_id":"`+first+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`)
	if st != 200 {
		t.Fatalf("acme's batch: %d %s", st, body)
	}
	st, body = acme.call("POST", "/v1/batches", `{"input_file_id":"`+first+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`)
	wantCode(t, "over the batches quota", st, body, 429, "quota_exceeded")

	// beta, meanwhile, is served as usual: uploads, a batch, a chat.
	st, body = beta.upload(3*mib, false)
	if st != 200 {
		t.Fatalf("beta's upload with acme at its quota: %d %s", st, body)
	}
	bf := beta.fileID(mustUpload(t, beta, line("b")))
	if st, body := beta.call("POST", "/v1/batches", `{"input_file_id":"`+bf+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`); st != 200 {
		t.Fatalf("beta's batch: %d %s", st, body)
	}
	client := openai.NewClient(option.WithBaseURL(d.URL+"/v1"), option.WithAPIKey(keys["beta"]), option.WithMaxRetries(0))
	if _, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "llama-8b",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(4)}); err != nil {
		t.Fatalf("beta's chat: %v", err)
	}

	// A delete frees acme's room at once.
	if st, body := acme.call("DELETE", "/v1/files/"+first, ""); st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}
	if st, body := acme.upload(mib, false); st != 200 {
		t.Fatalf("acme after a delete: %d %s", st, body)
	}
	// The admin API lists both, with their use.
	var tenants struct{ Data []tenantView }
	if st := adminCall(t, d, "admin-secret", "GET", "/tenants", "", &tenants); st != 200 || len(tenants.Data) != 2 ||
		tenants.Data[0].Tenant != "acme" || tenants.Data[0].Use.Files != 3 || tenants.Data[0].Use.Batches != 1 ||
		tenants.Data[1].Use.Files != 2 || tenants.Data[1].Effective.FileBytes != program.DefaultQuotas().FileBytes {
		t.Fatalf("GET /tenants: %d %+v", st, tenants.Data)
	}
}

// mustUpload uploads content as a file of the tenant and returns the answer.
func mustUpload(t *testing.T, a tenantAPI, content string) string {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write([]byte(content))
	_ = mw.Close()
	st, raw, err := httpJSON("POST", a.base+"/v1/files", mw.FormDataContentType(), &body, nil, "Authorization", "Bearer "+a.key)
	if err != nil || st != 200 {
		t.Fatalf("upload: %d %v %s", st, err, raw)
	}
	return string(raw)
}

// bucketBytes is what the files bucket's stream holds, in bytes.
func bucketBytes(t *testing.T, natsURL string) uint64 {
	t.Helper()
	js, err := jetstream.New(connectNATS(t, natsURL))
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(context.Background(), "OBJ_"+batch.FilesBucket)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Bytes
}

// TestFilesStoreFull is issue 32's finding 4 (a full store): with the files
// bucket at its limit (--files-max-bytes; no quotas), an upload gets 507
// storage_full and nothing of it is kept; a DELETE still works and frees
// the room at once, and another tenant then uploads. Batches and chats,
// on their own streams, are not touched by the full bucket.
func TestFilesStoreFull(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	d, _, keys := devWithKeys(t, []string{"acme", "beta"}, func(c *program.DevConfig) {
		c.HTTP.Batch.FilesMaxBytes = 4 * mib
		c.HTTP.Quotas = registry.Quotas{} // no quota: only the bucket's limit
	})
	acme := tenantAPI{t, d.URL, keys["acme"]}
	beta := tenantAPI{t, d.URL, keys["beta"]}
	var ids []string
	for i := 0; ; i++ {
		st, body := acme.upload(mib, false)
		if st == 200 {
			ids = append(ids, acme.fileID(body))
			continue
		}
		wantCode(t, "upload into a full bucket", st, body, 507, "storage_full")
		if i == 0 || i > 4 {
			t.Fatalf("the bucket took %d MiB files before it was full", i)
		}
		break
	}
	// Then what is left, with ever smaller files, until not a byte fits
	// (a delete that needed to write, as the object store's own does, would
	// fail now).
	for _, size := range []int{64 << 10, 8 << 10, 1 << 10, 128, 16, 1} {
		for {
			st, body := acme.upload(size, false)
			if st != 200 {
				wantCode(t, "a small upload into the full bucket", st, body, 507, "storage_full")
				break
			}
		}
	}
	full := bucketBytes(t, d.NATSURL)
	st, body := beta.upload(mib, false)
	wantCode(t, "beta into the full bucket", st, body, 507, "storage_full")
	if n := bucketBytes(t, d.NATSURL); n != full {
		t.Fatalf("a refused upload left %d bytes", n-full)
	}
	// Other surfaces go on: a batch (its own bucket), a chat.
	client := openai.NewClient(option.WithBaseURL(d.URL+"/v1"), option.WithAPIKey(keys["beta"]), option.WithMaxRetries(0))
	if _, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "llama-8b",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(4)}); err != nil {
		t.Fatalf("a chat with the files bucket full: %v", err)
	}
	if st, body := acme.call("POST", "/v1/batches", `{"input_file_id":"`+ids[0]+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`); st != 200 {
		t.Fatalf("a batch with the files bucket full: %d %s", st, body)
	}
	// DELETE on the full bucket: works, and the room is free at once.
	if st, body := acme.call("DELETE", "/v1/files/"+ids[1], ""); st != 200 {
		t.Fatalf("DELETE on a full bucket: %d %s", st, body)
	}
	if n := bucketBytes(t, d.NATSURL); n > full-mib {
		t.Fatalf("the bucket holds %d bytes after a delete, %d before: nothing freed", n, full)
	}
	if st, body := beta.upload(mib, false); st != 200 {
		t.Fatalf("beta after acme's delete: %d %s", st, body)
	}
	if st, body := acme.call("GET", "/v1/files/"+ids[1], ""); st != 404 {
		t.Fatalf("the deleted file: %d %s", st, body)
	}
}

// TestOneTenantAtEveryQuota is issue 32's "done when": with one tenant at
// every quota its admin record sets (files; stored responses, which count
// its background responses and resumable streams too; background
// responses and resumable streams in progress), set through the admin API
// on a real redis-server, that tenant gets 403/429 quota_exceeded, and the
// other tenant uploads, stores a response and reads it back, and streams
// (a plain chat stream, a resumable one, a background response) as usual.
func TestOneTenantAtEveryQuota(t *testing.T) {
	t.Parallel()
	d, _, keys := devWithKeys(t, []string{"acme", "beta"}, func(c *program.DevConfig) {
		c.Engine.Sim.DecodeBase, c.Engine.Sim.PrefillBase = 20*time.Millisecond, time.Millisecond
	})
	acme := tenantAPI{t, d.URL, keys["acme"]}
	beta := tenantAPI{t, d.URL, keys["beta"]}
	var view tenantView
	if st := adminCall(t, d, "admin-secret", "PUT", "/tenants/acme/quotas",
		`{"files":1,"stored_responses":3,"background":1,"resumable":1}`, &view); st != 200 {
		t.Fatalf("PUT quotas: %d %+v", st, view)
	}
	// acme fills each quota...
	if st, body := acme.upload(100, false); st != 200 {
		t.Fatalf("acme's file: %d %s", st, body)
	}
	if st, body := acme.call("POST", "/v1/responses", `{"model":"llama-8b","input":"hi","max_output_tokens":2}`); st != 200 {
		t.Fatalf("acme's stored response: %d %s", st, body)
	}
	if st, body := acme.call("POST", "/v1/responses", `{"model":"llama-8b","input":"hi","max_output_tokens":2000,"background":true,"store":true}`); st != 200 {
		t.Fatalf("acme's background response: %d %s", st, body)
	}
	long, st, err := resumable(t, d.URL, keys["acme"], 2000)
	if err != nil {
		t.Fatalf("acme's resumable stream: %d %v", st, err)
	}
	defer long.close()
	long.next()
	// ...and is refused past each, before anything is written.
	st, body := acme.upload(100, false)
	wantCode(t, "acme's second file", st, body, 403, "quota_exceeded")
	st, body = acme.call("POST", "/v1/responses", `{"model":"llama-8b","input":"hi","max_output_tokens":2}`)
	wantCode(t, "acme's second stored response", st, body, 429, "quota_exceeded")
	if _, st, err := resumable(t, d.URL, keys["acme"], 3); st != 429 || err == nil || !strings.Contains(err.Error(), "quota_exceeded") {
		t.Fatalf("acme's second resumable stream: %d %v", st, err)
	}

	// beta is served as usual.
	start := time.Now()
	if st, body := beta.upload(1<<20, false); st != 200 {
		t.Fatalf("beta's upload: %d %s", st, body)
	}
	var stored struct{ ID, Status string }
	st, body = beta.call("POST", "/v1/responses", `{"model":"llama-8b","input":"hi","max_output_tokens":3}`)
	if st != 200 || json.Unmarshal([]byte(body), &stored) != nil || stored.ID == "" {
		t.Fatalf("beta's stored response: %d %s", st, body)
	}
	if st, body := beta.call("GET", "/v1/responses/"+stored.ID, ""); st != 200 || !strings.Contains(body, stored.ID) {
		t.Fatalf("beta's stored response read back: %d %s", st, body)
	}
	client := openai.NewClient(option.WithBaseURL(d.URL+"/v1"), option.WithAPIKey(keys["beta"]), option.WithMaxRetries(0))
	chat := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "llama-8b",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(4)})
	chunks := 0
	for chat.Next() {
		chunks++
	}
	if err := chat.Err(); err != nil || chunks == 0 {
		t.Fatalf("beta's chat stream: %d chunks, %v", chunks, err)
	}
	rs, st, err := resumable(t, d.URL, keys["beta"], 3)
	if err != nil {
		t.Fatalf("beta's resumable stream: %d %v", st, err)
	}
	if ev := rs.rest(); len(ev) == 0 || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("beta's resumable stream: %v", ev)
	}
	rs.close()
	bg, st, err := openStream(t, "POST", d.URL+"/v1/responses", keys["beta"],
		`{"model":"llama-8b","input":"hi","max_output_tokens":3,"background":true,"stream":true}`)
	if err != nil {
		t.Fatalf("beta's background response: %d %v", st, err)
	}
	if ev := bg.rest(); len(ev) == 0 || !strings.Contains(ev[len(ev)-1], `"status":"incomplete"`) || !strings.Contains(ev[len(ev)-1], "max_output_tokens") {
		t.Fatalf("beta's background response ended with %v", ev[max(0, len(ev)-1):])
	}
	bg.close()
	t.Logf("beta's upload, stored response, chat stream, resumable stream and background response: %v", time.Since(start).Round(time.Millisecond))
}
