package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

func (h *harness) openai(path string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(h.base+path),
		option.WithAPIKey("test"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(h.http),
	)
}

// The official client, streaming and not, against /v1 and TorchServe's form.
func TestOpenAIChat(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, tc := range []struct {
		name, base, model string
		wantModel         string // what the worker must see in Tb-Model and in the body
	}{
		{"v1", "/v1/", testModel, testModel},
		{"torchserve path and body agree", "/predictions/llama-8b/1.0/v1/", testModel, testModel},
		{"torchserve path model", "/predictions/llama-8b/1.0/v1/", "", testModel},
		{"slashed model", "/v1/", testSlashedModel, testSlashedModel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cl := h.openai(tc.base)
			params := openai.ChatCompletionNewParams{
				Model:    tc.model,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
				StreamOptions: openai.ChatCompletionStreamOptionsParam{
					IncludeUsage: openai.Bool(true),
				},
			}

			stream := cl.Chat.Completions.NewStreaming(ctx, params)
			var text strings.Builder
			var usage int64
			for stream.Next() {
				ch := stream.Current()
				for _, c := range ch.Choices {
					text.WriteString(c.Delta.Content)
				}
				if ch.Usage.TotalTokens > 0 {
					usage = ch.Usage.TotalTokens
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if text.String() != "Hello world" || usage != 11 {
				t.Fatalf("stream gave %q, usage %d", text.String(), usage)
			}
			m := h.nextRequest(t)
			if got := m.Header.Get(schemas.HdrModel); got != tc.wantModel {
				t.Fatalf("Tb-Model %q, want %q", got, tc.wantModel)
			}
			var body struct {
				Model  string `json:"model"`
				Stream bool   `json:"stream"`
			}
			if err := json.Unmarshal(m.Data, &body); err != nil || body.Model != tc.wantModel || !body.Stream {
				t.Fatalf("body at the worker: %s", m.Data)
			}
			if got := m.Header.Get(schemas.HdrKind); got != "chat" {
				t.Fatalf("Tb-Kind %q", got)
			}

			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
			resp, err := cl.Chat.Completions.New(ctx, params)
			if err != nil {
				t.Fatalf("non-stream: %v", err)
			}
			if resp.Choices[0].Message.Content != "Hello world" || resp.Usage.TotalTokens != 11 {
				t.Fatalf("non-stream gave %+v", resp)
			}
			if m := h.nextRequest(t); isStream(m) {
				t.Fatal("non-stream request went out with stream:true")
			}
		})
	}
	// One OnUsage call per finished request, stream and not.
	testenv.WaitFor(t, 2*time.Second, h.usageIs(8))
	for _, u := range h.usageCalls() {
		if !strings.HasSuffix(u, " 11") {
			t.Fatalf("OnUsage calls: %q", h.usageCalls())
		}
	}
}

func TestOpenAICompletions(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, base := range []string{"/v1/", "/predictions/llama-8b/1.0/v1/"} {
		t.Run(base, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cl := h.openai(base)
			params := openai.CompletionNewParams{
				Model:  testModel,
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")},
			}
			stream := cl.Completions.NewStreaming(ctx, params)
			var text strings.Builder
			for stream.Next() {
				for _, c := range stream.Current().Choices {
					text.WriteString(c.Text)
				}
			}
			if err := stream.Err(); err != nil || text.String() != "Hello world" {
				t.Fatalf("stream: %q, %v", text.String(), err)
			}
			if got := h.nextRequest(t).Header.Get(schemas.HdrKind); got != "completion" {
				t.Fatalf("Tb-Kind %q", got)
			}

			resp, err := cl.Completions.New(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Choices[0].Text != "Hello world" || resp.Usage.TotalTokens != 3 {
				t.Fatalf("non-stream gave %+v", resp)
			}
			h.nextRequest(t)
		})
	}
}

func TestOpenAIModels(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, base := range []string{"/v1/", "/predictions/llama-8b/1.0/v1/"} {
		cl := h.openai(base)
		page, err := cl.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) != 2 || page.Data[0].ID != testModel || page.Data[0].Object != "model" {
			t.Fatalf("models: %+v", page.Data)
		}
		m, err := cl.Models.Get(ctx, testSlashedModel)
		if err != nil {
			t.Fatal(err)
		}
		if m.ID != testSlashedModel {
			t.Fatalf("model: %+v", m)
		}
		_, err = cl.Models.Get(ctx, "nope")
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
			t.Fatalf("unknown model: %v", err)
		}
	}
	// A slashed id sent unescaped reaches the wildcard too.
	resp, body := h.get(t, "/v1/models/"+testSlashedModel)
	if resp.StatusCode != 200 || !strings.Contains(body, `"id":"meta-llama/Llama-3.1-8B"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// Errors reach the official client with their status, and mid-stream ones
// as a stream error.
func TestOpenAIErrors(t *testing.T) {
	h := newHarness(t, harnessOptions{worker: func(h *harness, m *nats.Msg) {
		switch {
		case strings.Contains(string(m.Data), "fail-before"):
			h.reply(m, schemas.FrameError, 0, string(schemas.FromUpstream(503, schemas.TypeOverloaded, schemas.CodeQueueFull, "", "queue full").WithRetryAfter(3).Payload()))
		default:
			h.accept(m)
			h.reply(m, schemas.FrameChunk, 2, chatHello)
			h.reply(m, schemas.FrameError, 3, string(schemas.ErrInternal.New("the engine died").Payload()))
		}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := h.openai("/v1/")
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("fail-before")}
	_, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || apiErr.Code != schemas.CodeQueueFull {
		t.Fatalf("before first token: %v", err)
	}
	if ra := apiErr.Response.Header.Get("Retry-After"); ra != "3" {
		t.Fatalf("Retry-After %q", ra)
	}

	msgs = []openai.ChatCompletionMessageParamUnion{openai.UserMessage("fail-after")}
	stream := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs})
	n := 0
	for stream.Next() {
		n++
	}
	if n != 1 || stream.Err() == nil || !strings.Contains(stream.Err().Error(), "the engine died") {
		t.Fatalf("mid-stream: %d chunks, err %v", n, stream.Err())
	}
}
