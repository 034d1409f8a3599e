package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/registry"
)

// uploadBoundary is the multipart boundary of the raw uploads below.
const uploadBoundary = "tokenbus-test-boundary"

// uploadHead is the start of a multipart upload of a file of fileBytes
// bytes: the purpose field and the file part's headers.
func uploadHead() string {
	return "--" + uploadBoundary + "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" +
		"--" + uploadBoundary + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n" +
		"Content-Type: application/octet-stream\r\n\r\n"
}

// uploadTail ends the multipart body.
const uploadTail = "\r\n--" + uploadBoundary + "--\r\n"

// rawUpload opens a connection to addr and sends the headers of POST
// /v1/files for a file of fileBytes bytes (Bearer key unless ""), and of
// the body only what comes before the file's bytes (fasthttp hands a body
// to its handler once some of it is there).
func rawUpload(t testing.TB, addr, key string, fileBytes int) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	length := len(uploadHead()) + fileBytes + len(uploadTail)
	hdr := "POST /v1/files HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: multipart/form-data; boundary=" + uploadBoundary +
		"\r\nContent-Length: " + fmt.Sprint(length) + "\r\n"
	if key != "" {
		hdr += "Authorization: Bearer " + key + "\r\n"
	}
	if _, err := io.WriteString(conn, hdr+"\r\n"+uploadHead()); err != nil {
		t.Fatal(err)
	}
	return conn
}

// sendBody sends the rest of a rawUpload: a file of fileBytes bytes ("{}\n"
// lines, the last one cut) and the end of the multipart body.
func sendBody(conn net.Conn, fileBytes int) error {
	line := bytes.Repeat([]byte("{}\n"), 64<<10/3)
	for left := fileBytes; left > 0; {
		n := min(left, len(line))
		if _, err := conn.Write(line[:n]); err != nil {
			return err
		}
		left -= n
	}
	_, err := io.WriteString(conn, uploadTail)
	return err
}

// readAnswer reads one HTTP response from conn within d.
func readAnswer(t testing.TB, conn net.Conn, d time.Duration) (*http.Response, string) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within %s: %v", d, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// devWithKeys starts dev with API keys on a real redis-server, with cfg
// changed by configure, and makes a key for each tenant.
func devWithKeys(t *testing.T, tenants []string, configure ...func(*program.DevConfig)) (*dev, *registry.Store, map[string]string) {
	t.Helper()
	rd, store := startStore(t)
	d := startDev(t, append([]func(*program.DevConfig){func(c *program.DevConfig) {
		c.Redis.URL, c.HTTP.Auth, c.HTTP.AdminToken = rd.URL, true, "admin-secret"
		c.HTTP.Limits.Breaker.Timeout = patientBreaker
	}}, configure...)...)
	keys := map[string]string{}
	for _, tenant := range tenants {
		_, secret, err := store.CreateKey(context.Background(), registry.KeySpec{Name: tenant, Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		keys[tenant] = secret
	}
	return d, store, keys
}

// TestUploadAdmittedBeforeBody is issue 32's finding 3: an upload is
// judged on its headers (API key, the tenant's and the gateway's upload
// limits, the file limit) and answered before any of its body is read;
// an admitted one is streamed into the store, and the connection serves
// the next request.
// Not parallel: answers awaited within 5 s, each.
func TestUploadAdmittedBeforeBody(t *testing.T) {
	d, _, keys := devWithKeys(t, []string{"acme", "beta"}, func(c *program.DevConfig) {
		c.HTTP.Batch.UploadsPerTenant, c.HTTP.Batch.UploadsMax = 2, 3
		c.HTTP.Batch.FileLimit = 50 << 20
	})
	addr := strings.TrimPrefix(d.URL, "http://")
	const big = 20 << 20

	// No key, then a wrong one: 401 on the headers (and the multipart
	// preamble) alone; reading the 20 MiB first would wait for the client
	// to send them, here for ever.
	for _, key := range []string{"", "tb-not-a-real-key-0000000000000000000000000000"} {
		conn := rawUpload(t, addr, key, big)
		resp, body := readAnswer(t, conn, 5*time.Second)
		if resp.StatusCode != 401 || errorBody(t, body).Code == nil || *errorBody(t, body).Code != "invalid_api_key" {
			t.Fatalf("key %q: %d %s, want 401 invalid_api_key before the body", key, resp.StatusCode, body)
		}
		if !resp.Close {
			t.Errorf("key %q: the connection stays open with a body unread", key)
		}
	}
	// Over the file limit by its Content-Length: 413 before the body.
	resp, body := readAnswer(t, rawUpload(t, addr, keys["acme"], 60<<20), 5*time.Second)
	if resp.StatusCode != 413 || *errorBody(t, body).Code != "file_too_large" {
		t.Fatalf("over the file limit: %d %s", resp.StatusCode, body)
	}

	// Two of acme's uploads open (headers and a part of the body sent):
	// its third is 429 at once; beta's first fills the gateway (3), its
	// second is 503.
	a1, a2 := rawUpload(t, addr, keys["acme"], 1<<20), rawUpload(t, addr, keys["acme"], 1<<20)
	b1 := rawUpload(t, addr, keys["beta"], 1<<20)
	for _, c := range []net.Conn{a1, a2, b1} {
		if _, err := io.WriteString(c, "{}\n"); err != nil {
			t.Fatal(err)
		}
	}
	// The three are admitted once their handlers run: wait for that on
	// the gateway's gauge of uploads being read.
	testenv.WaitFor(t, 10*time.Second, func() error {
		if n := metricValue(t, d.URL, "tokenbus_gateway_uploads"); n != 3 {
			return fmt.Errorf("%v uploads being read, want 3", n)
		}
		return nil
	})
	// The gateway is full: 503 with Retry-After.
	resp, body = readAnswer(t, rawUpload(t, addr, keys["beta"], 1<<20), 5*time.Second)
	if resp.StatusCode != 503 || *errorBody(t, body).Code != "uploads_busy" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("gateway full: %d %s", resp.StatusCode, body)
	}
	resp, body = readAnswer(t, rawUpload(t, addr, keys["acme"], 1<<20), 5*time.Second)
	if resp.StatusCode != 429 || *errorBody(t, body).Code != "too_many_uploads" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("acme's third: %d %s, want 429 too_many_uploads", resp.StatusCode, body)
	}
	// The admitted ones finish and are stored.
	for _, c := range []net.Conn{a1, a2, b1} {
		if err := sendBody(c, 1<<20-3); err != nil {
			t.Fatal(err)
		}
		resp, body := readAnswer(t, c, 10*time.Second)
		if resp.StatusCode != 200 || !strings.Contains(body, `"purpose":"batch"`) {
			t.Fatalf("admitted upload: %d %s", resp.StatusCode, body)
		}
	}

	// The SDK (file part first, purpose after it), and a chunked upload
	// of unknown length; then the same connection serves the next request.
	client := openai.NewClient(option.WithBaseURL(d.URL+"/v1"), option.WithAPIKey(keys["acme"]), option.WithMaxRetries(0))
	f, err := client.Files.New(context.Background(), openai.FileNewParams{File: strings.NewReader(line("sdk")),
		Purpose: openai.FilePurposeBatch})
	if err != nil || f.Bytes != int64(len(line("sdk"))) {
		t.Fatalf("SDK upload: %+v %v", f, err)
	}
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	fw, _ := mw.CreateFormFile("file", "chunked.jsonl")
	_, _ = fw.Write([]byte(line("chunked")))
	_ = mw.WriteField("purpose", "batch")
	_ = mw.Close()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n",
		keys["acme"], mw.FormDataContentType(), mp.Len(), mp.Bytes())
	br := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	r1, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b1body, _ := io.ReadAll(r1.Body)
	if r1.StatusCode != 200 || r1.Close {
		t.Fatalf("chunked upload: %d close=%v %s", r1.StatusCode, r1.Close, b1body)
	}
	fmt.Fprintf(conn, "GET /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", keys["acme"])
	r2, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the connection after an upload: %v", err)
	}
	list, _ := io.ReadAll(r2.Body)
	if r2.StatusCode != 200 || strings.Count(string(list), `"object":"file"`) != 4 {
		t.Fatalf("acme's files after 4 uploads: %d %s", r2.StatusCode, list)
	}

	// A purpose after the file that is not 'batch': 400, and no file kept.
	mp.Reset()
	mw = multipart.NewWriter(&mp)
	fw, _ = mw.CreateFormFile("file", "x.jsonl")
	_, _ = fw.Write([]byte(line("x")))
	_ = mw.WriteField("purpose", "fine-tune")
	_ = mw.Close()
	st, raw, err := httpJSON("POST", d.URL+"/v1/files", mw.FormDataContentType(), &mp, nil, "Authorization", "Bearer "+keys["beta"])
	if err != nil || st != 400 || !strings.Contains(string(raw), `"param":"purpose"`) {
		t.Fatalf("bad purpose after the file: %d %v %s", st, err, raw)
	}
	st, raw, _ = httpJSON("GET", d.URL+"/v1/files", "", nil, nil, "Authorization", "Bearer "+keys["beta"])
	if st != 200 || strings.Count(string(raw), `"object":"file"`) != 1 {
		t.Fatalf("beta's files after a refused upload: %d %s", st, raw)
	}
}

// line is a batch input line with this custom_id.
func line(id string) string {
	return `{"custom_id":"` + id + `","method":"POST","url":"/v1/chat/completions","body":{"model":"llama-8b","messages":[{"role":"user","content":"hi"}]}}` + "\n"
}
