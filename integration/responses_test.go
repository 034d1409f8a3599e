package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// TestResponsesSDK: the official Python and Node SDKs' Responses API
// calls, unchanged, against tokenbus dev (issue 17).
func TestResponsesSDK(t *testing.T) {
	t.Parallel()
	d := startDev(t)
	for _, tt := range []struct{ name, env, script, ok string }{
		{"python", "TOKENBUS_TEST_PYTHON", "clients/python_responses.py", "python responses ok"},
		{"node", "TOKENBUS_TEST_NODE", "clients/node_responses.mjs", "node responses ok"},
	} {
		t.Run(tt.name, func(t *testing.T) { runSDK(t, tt.env, tt.ok, tt.script, d.URL) })
	}
}

// TestResponseResumesOnAnotherGateway is issue 17's crash test: a
// background response started on gateway A, followed there, A killed -9
// mid-generation; the stream is resumed on gateway B with starting_after,
// and B's runner continues the generation after AckWait. Every sequence
// number from 0 to the terminal event comes exactly once, in order.
func TestResponseResumesOnAnotherGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes and kill -9")
	}
	t.Parallel()
	natsProc, w, gateway := gatewaysOnJetStream(t)
	// B starts once A's runner generates the response: the only runner
	// then, so that killing A kills the generation and B's runner must
	// take it over.
	a, baseA := gateway("gateway-a")
	var resp struct{ ID, Status string }
	if st, raw, err := httpJSON("POST", baseA+"/v1/responses", "application/json", strings.NewReader(
		`{"model":"llama-8b","input":"tell a long story","max_output_tokens":150,"background":true}`), &resp); st != 200 || err != nil {
		t.Fatalf("create: %d %v %s", st, err, raw)
	}
	seqs := []int{}
	var terminal string
	follow := func(base string, after int, stopAt int) {
		t.Helper()
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/v1/responses/%s?stream=true&starting_after=%d", base, resp.ID, after), nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("follow %s: %v", base, err)
		}
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev struct {
				Type           string `json:"type"`
				SequenceNumber int    `json:"sequence_number"`
			}
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("event %q: %v", line, err)
			}
			seqs = append(seqs, ev.SequenceNumber)
			if strings.HasPrefix(ev.Type, "response.") && (ev.Type == "response.completed" || ev.Type == "response.incomplete" || ev.Type == "response.failed") {
				terminal = ev.Type
				return
			}
			if stopAt >= 0 && ev.SequenceNumber >= stopAt {
				return
			}
		}
	}
	follow(baseA, -1, 30)
	b, baseB := gateway("gateway-b")
	defer func() {
		for _, p := range []*proc{b, w, natsProc} {
			_ = p.stop(t, 10*time.Second)
		}
	}()
	if terminal != "" {
		t.Fatalf("the response ended (%s) before the kill: nothing tested", terminal)
	}
	t.Logf("kill -9 gateway A after event %d", seqs[len(seqs)-1])
	a.kill9(t)
	follow(baseB, seqs[len(seqs)-1], -1)
	// The continuation is a new chat request: the sim may end it before
	// max_output_tokens (completed) or at it (incomplete).
	if terminal != "response.incomplete" && terminal != "response.completed" {
		t.Fatalf("the response ended with %q", terminal)
	}
	for i, s := range seqs {
		if s != i {
			t.Fatalf("sequence numbers %v: %d at %d (lost or repeated)", seqs, s, i)
		}
	}
	var got struct {
		Status string
		Usage  struct {
			OutputTokens int `json:"output_tokens"`
		}
	}
	if st, raw, err := httpJSON("GET", baseB+"/v1/responses/"+resp.ID, "", nil, &got); st != 200 || err != nil || "response."+got.Status != terminal || got.Usage.OutputTokens <= 30 {
		t.Fatalf("retrieve on B: %d %v %s", st, err, raw)
	}
	t.Logf("%d events, resumed on B", len(seqs))
}

// TestResumableChatStream: a chat stream opted in with Tokenbus-Resumable
// on gateway A, A killed -9 mid-stream; the same request with
// Last-Event-ID to gateway B continues it: every event id once, in order,
// to [DONE].
func TestResumableChatStream(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: separate processes and kill -9")
	}
	t.Parallel()
	natsProc, w, gateway := gatewaysOnJetStream(t)
	a, baseA := gateway("gateway-a")
	const body = `{"model":"llama-8b","max_tokens":120,"ignore_eos":true,"stream":true,"messages":[{"role":"user","content":"a long one"}]}`
	var ids []string
	var text strings.Builder
	done, tokens := false, 0
	read := func(base, lastID string, stopAt int) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Tokenbus-Resumable", "true")
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("POST %s: %v %v", base, err, res)
		}
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
				ids = append(ids, id)
				continue
			}
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			if data == "[DONE]" {
				done = true
				return
			}
			var ch struct {
				Choices []struct{ Delta struct{ Content string } }
			}
			if err := json.Unmarshal([]byte(data), &ch); err != nil {
				t.Fatalf("chunk %q: %v", data, err)
			}
			if len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
				text.WriteString(ch.Choices[0].Delta.Content)
				tokens++
			}
			if stopAt > 0 && len(ids) >= stopAt {
				return
			}
		}
	}
	read(baseA, "", 20)
	if done || len(ids) != 20 {
		t.Fatalf("before the kill: %d events, done %v", len(ids), done)
	}
	a.kill9(t)
	b, baseB := gateway("gateway-b")
	defer func() {
		for _, p := range []*proc{b, w, natsProc} {
			_ = p.stop(t, 10*time.Second)
		}
	}()
	read(baseB, ids[len(ids)-1], 0)
	if !done {
		t.Fatal("no [DONE] after the resume")
	}
	stream, _, _ := strings.Cut(ids[0], ":")
	for i, id := range ids {
		if want := fmt.Sprintf("%s:%d", stream, i+1); id != want {
			t.Fatalf("event %d has id %s, want %s (lost or repeated)", i, id, want)
		}
	}
	// The continuation asks for what is left of max_tokens: 120 in all.
	if tokens != 120 {
		t.Errorf("%d chunks with text, want 120 (max_tokens, ignore_eos)", tokens)
	}
	t.Logf("%d events, %d bytes of text, resumed on B", len(ids), text.Len())
}

// TestResponsesTenancyAndErrors: with API keys, a response (and a
// resumable chat stream) is its key's tenant's: another tenant's key gets
// OpenAI's 404 for every route; errors come in OpenAI's shape.
func TestResponsesTenancyAndErrors(t *testing.T) {
	t.Parallel()
	d, _ := limitsDev(t)
	_, acme := newKey(t, d, `{"name":"a","tenant":"acme"}`)
	_, other := newKey(t, d, `{"name":"o","tenant":"other"}`)
	call := func(method, path, key, body string, hdr ...string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, d.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		for _, h := range hdr {
			k, v, _ := strings.Cut(h, ": ")
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	var r struct {
		ID, Status string
		Output     []struct{ ID string }
	}
	st, b := call("POST", "/v1/responses", acme, `{"model":"llama-8b","input":"hi","max_output_tokens":4}`)
	if st != 200 || json.Unmarshal(b, &r) != nil || r.ID == "" || len(r.Output) == 0 {
		t.Fatalf("create: %d %s", st, b)
	}
	type apiErr struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	for _, tt := range []struct{ method, path string }{
		{"GET", "/v1/responses/" + r.ID}, {"GET", "/v1/responses/" + r.ID + "/input_items"},
		{"DELETE", "/v1/responses/" + r.ID}, {"POST", "/v1/responses/" + r.ID + "/cancel"},
		{"GET", "/v1/responses/resp_nosuch"},
	} {
		st, b := call(tt.method, tt.path, other, "")
		var e apiErr
		if st != 404 || json.Unmarshal(b, &e) != nil || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, "not found") {
			t.Errorf("%s %s by another tenant: %d %s, want OpenAI's 404", tt.method, tt.path, st, b)
		}
	}
	if st, b := call("GET", "/v1/responses/"+r.ID, acme, ""); st != 200 {
		t.Fatalf("the owner: %d %s", st, b)
	}
	// input_items pages as OpenAI's: newest first, limit, after.
	st, b = call("POST", "/v1/responses", acme, `{"model":"llama-8b","max_output_tokens":2,"input":[{"role":"user","content":"1"},{"role":"assistant","content":"2"},{"role":"user","content":"3"}]}`)
	if st != 200 || json.Unmarshal(b, &r) != nil {
		t.Fatalf("create: %d %s", st, b)
	}
	type page struct {
		Data []struct {
			ID      string
			Content []struct{ Text string }
		}
		HasMore bool   `json:"has_more"`
		LastID  string `json:"last_id"`
	}
	var p1, p2 page
	if st, b := call("GET", "/v1/responses/"+r.ID+"/input_items?limit=2", acme, ""); st != 200 || json.Unmarshal(b, &p1) != nil ||
		len(p1.Data) != 2 || !p1.HasMore || p1.Data[0].Content[0].Text != "3" {
		t.Fatalf("page 1: %d %s", st, b)
	}
	if st, b := call("GET", "/v1/responses/"+r.ID+"/input_items?limit=2&after="+p1.LastID, acme, ""); st != 200 || json.Unmarshal(b, &p2) != nil ||
		len(p2.Data) != 1 || p2.HasMore || p2.Data[0].Content[0].Text != "1" {
		t.Fatalf("page 2: %d %s", st, b)
	}
	for _, tt := range []struct {
		body, param string
		status      int
		asOther     bool // sent with the other tenant's key
	}{
		{`{"model":"llama-8b","input":"x","background":true,"store":false}`, "background", 400, false},
		{`{"model":"llama-8b","input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]}`, "input[0].content[0].type", 400, false},
		{`{"model":"llama-8b","input":"x","tools":[{"type":"web_search"}]}`, "tools[0].type", 400, false},
		{`{"model":"llama-8b"}`, "input", 400, false},
		{`{"model":"nosuch","input":"x"}`, "model", 404, false},
		{`{"model":"llama-8b","input":"x","previous_response_id":"resp_nosuch"}`, "previous_response_id", 404, false},
		// An item of a stored response by reference: an id no response
		// made, and one of another tenant's response (other's request).
		{`{"model":"llama-8b","input":[{"type":"item_reference","id":"msg_nosuch"}]}`, "input[0].id", 404, false},
		{`{"model":"llama-8b","input":[{"type":"item_reference","id":"` + r.Output[0].ID + `"}]}`, "input[0].id", 404, true},
	} {
		key := acme
		if tt.asOther {
			key = other
		}
		st, b := call("POST", "/v1/responses", key, tt.body)
		var e apiErr
		if st != tt.status || json.Unmarshal(b, &e) != nil || e.Error.Param == nil || *e.Error.Param != tt.param {
			t.Errorf("%s: %d %s, want %d with param %s", tt.body, st, b, tt.status, tt.param)
		}
	}
	if st, _ := call("POST", "/v1/responses", "sk-wrong", `{"model":"llama-8b","input":"x"}`); st != 401 {
		t.Errorf("a wrong key: %d, want 401", st)
	}

	// A resumable chat stream: its id from the header, resumed by its
	// tenant only.
	req, _ := http.NewRequest("POST", d.URL+"/v1/chat/completions", strings.NewReader(
		`{"model":"llama-8b","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"x"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+acme)
	req.Header.Set("Tokenbus-Resumable", "true")
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("resumable: %v %v", err, res)
	}
	all, _ := io.ReadAll(res.Body)
	res.Body.Close()
	sid := res.Header.Get("Tokenbus-Stream-Id")
	if !strings.HasPrefix(sid, "cs_") || !strings.Contains(string(all), "id: "+sid+":1\n") || !strings.HasSuffix(string(all), "data: [DONE]\n\n") {
		t.Fatalf("resumable stream %q:\n%s", sid, all)
	}
	body := `{"model":"llama-8b","messages":[{"role":"user","content":"x"}],"stream":true}`
	if st, b := call("POST", "/v1/chat/completions", other, body, "Last-Event-ID: "+sid+":1"); st != 404 {
		t.Errorf("resume by another tenant: %d %s, want 404", st, b)
	}
	st, b = call("POST", "/v1/chat/completions", acme, body, "Last-Event-ID: "+sid+":1")
	if st != 200 || strings.Contains(string(b), "id: "+sid+":1\n") || !strings.Contains(string(b), "id: "+sid+":2\n") {
		t.Errorf("resume after 1 by its tenant: %d\n%s", st, b)
	}
}

// gatewaysOnJetStream starts, as separate processes, a JetStream nats-server
// and a sim worker (20 ms a token), and returns them with a function that
// starts a gateway (a 2 s response ack wait) and returns it with its base URL
// once it is ready: the set-up of the crash tests that kill a gateway.
func gatewaysOnJetStream(t *testing.T) (natsProc, worker *proc, gateway func(name string) (*proc, string)) {
	t.Helper()
	bin := tokenbusBinary(t)
	natsPort := testenv.FreePort(t)
	natsProc = startProc(t, "nats-server", natsServer(t), "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-js", "-sd", t.TempDir())
	common := []string{"--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", natsPort), "--redis-url", ""}
	worker = startProc(t, "w1", bin, append([]string{"worker", "--id", "w1", "--sim-decode-base", "20ms", "--drain-timeout", "1s"}, common...)...)
	gateway = func(name string) (*proc, string) {
		port := testenv.FreePort(t)
		p := startProc(t, name, bin, append([]string{"gateway", "--http", fmt.Sprintf("127.0.0.1:%d", port), "--auth=false",
			"--admin", "", "--response-ack-wait", "2s"}, common...)...)
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		waitReady(t, base)
		return p, base
	}
	return natsProc, worker, gateway
}
