package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
)

// adminCall sends an admin API request and decodes its JSON answer into out.
func adminCall(t *testing.T, d *dev, token, method, path, body string, out any) int {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, d.AdminURL+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

// tokenbus dev --auth: keys made on the admin API work with the official
// client, are refused without a key or for a model they may not use, count
// usage, and stop working when deleted. /v1/models needs a key and lists the
// key's models; the adapter registered by default is there under its base.
func TestDevWithKeys(t *testing.T) {
	t.Parallel()
	const adminToken = "test-admin-token"
	d := startDev(t, func(c *program.DevConfig) {
		c.HTTP.Auth, c.HTTP.AdminToken = true, adminToken
		c.HTTP.Limits.Breaker.Timeout = patientBreaker // a 50 ms limit check failed open under the suite's load
	})
	if d.AdminURL == "" {
		t.Fatal("dev has no admin API")
	}
	ctx := context.Background()
	var key struct{ ID, Key string }
	if st := adminCall(t, d, adminToken, "POST", "/keys", `{"name":"it","tenant":"acme","models":["llama-8b"],"rpm":100}`, &key); st != 201 {
		t.Fatalf("POST /keys: %d", st)
	}

	var apiErr *openai.Error
	anon := openaiClient(d.URL + "/v1")
	_, err := anon.Models.List(ctx)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Fatalf("listing models without a key: %v", err)
	}
	_, err = anon.Completions.New(ctx, openai.CompletionNewParams{
		Model: "llama-8b", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Fatalf("without a key: %v", err)
	}

	c := openai.NewClient(option.WithBaseURL(d.URL+"/v1"), option.WithAPIKey(key.Key), option.WithMaxRetries(0))
	var hdr *http.Response
	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model: "llama-8b", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens: openai.Int(7)}, option.WithResponseInto(&hdr))
	if err != nil || comp.Usage.CompletionTokens != 7 || hdr.Header.Get("x-ratelimit-remaining-requests") != "99" {
		t.Fatalf("with a key: %+v %v", comp, err)
	}
	_, err = c.Completions.New(ctx, openai.CompletionNewParams{
		Model: "llama-8b-lora", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 403 || apiErr.Code != "model_not_allowed" {
		t.Fatalf("model not allowed: %v", err)
	}

	// The key lists only its own model; a key for every model sees the
	// adapter too, under its base.
	models, err := c.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "llama-8b" {
		t.Fatalf("models of a llama-8b key: %+v %v", models.Data, err)
	}
	var anyKey struct{ Key string }
	if st := adminCall(t, d, adminToken, "POST", "/keys", `{"name":"all","tenant":"acme"}`, &anyKey); st != 201 {
		t.Fatalf("POST /keys: %d", st)
	}
	all := openai.NewClient(option.WithBaseURL(d.URL+"/v1"), option.WithAPIKey(anyKey.Key), option.WithMaxRetries(0))
	models, err = all.Models.List(ctx)
	if err != nil || len(models.Data) != 2 || models.Data[1].ID != "llama-8b-lora" ||
		!strings.Contains(models.Data[1].RawJSON(), `"parent":"llama-8b"`) {
		t.Fatalf("models: %+v %v", models.Data, err)
	}

	testenv.WaitFor(t, 5*time.Second, func() error {
		var u struct {
			Data []struct {
				Requests         int64 `json:"requests"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"data"`
		}
		adminCall(t, d, adminToken, "GET", "/usage?key_id="+key.ID, "", &u)
		if len(u.Data) != 1 || u.Data[0].Requests != 1 || u.Data[0].CompletionTokens != 7 {
			return errors.New("usage not there yet")
		}
		return nil
	})

	if st := adminCall(t, d, adminToken, "DELETE", "/keys/"+key.ID, "", nil); st != 200 {
		t.Fatalf("DELETE /keys: %d", st)
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		_, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model: "llama-8b", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}})
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
			return errors.New("deleted key still works")
		}
		return nil
	})
}

// Redis stopped mid-test: streaming for known models goes on from the
// caches, admin writes answer 503, and both recover when Redis returns.
func TestRedisOutage(t *testing.T) {
	t.Parallel()
	const adminToken = "outage-admin-token"
	rd := testenv.StartRedis(t)
	d := startDev(t, func(c *program.DevConfig) { c.Redis.URL, c.HTTP.AdminToken = rd.URL, adminToken })
	stream := `{"model":"llama-8b","stream":true,"max_tokens":6,"messages":[{"role":"user","content":"hi"}]}`
	checkStream(t, post(t, d.URL, "/v1/chat/completions", stream), true, 1, false)

	rd.Stop()
	for range 3 {
		checkStream(t, post(t, d.URL, "/v1/chat/completions", stream), true, 1, false)
	}
	if st := adminCall(t, d, adminToken, "POST", "/models", `{"name":"during-outage"}`, nil); st != 503 {
		t.Fatalf("admin write with Redis down: %d, want 503", st)
	}

	rd.Restart(t)
	testenv.WaitFor(t, 10*time.Second, func() error {
		if st := adminCall(t, d, adminToken, "POST", "/models", `{"name":"after-outage"}`, nil); st != 201 && st != 200 {
			return fmt.Errorf("admin write after Redis returned: %d", st)
		}
		return nil
	})
	checkStream(t, post(t, d.URL, "/v1/chat/completions", stream), true, 1, false)
}
