package simserver

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestOpenAIGoClient: the official Go SDK reads the server as it reads
// vLLM: responses, streams (with usage), the model list, errors.
func TestOpenAIGoClient(t *testing.T) {
	ts := start(t, Config{APIKeys: []string{"sk-test"}, AllowRuntimeLoRA: true}, fastSim())
	if err := ts.eng.LoadAdapter(t.Context(), "sql", "/adapters/sql"); err != nil {
		t.Fatal(err)
	}
	c := openai.NewClient(option.WithBaseURL(ts.url+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0),
		option.WithRequestTimeout(30*time.Second))
	ctx := t.Context()

	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     "base",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		MaxTokens: openai.Int(12),
		Seed:      openai.Int(3),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" || resp.Usage.CompletionTokens == 0 {
		t.Fatalf("chat completion: %+v", resp)
	}

	st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "base",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		MaxTokens:     openai.Int(12),
		Seed:          openai.Int(3),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	acc := openai.ChatCompletionAccumulator{}
	for st.Next() {
		acc.AddChunk(st.Current())
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].Message.Content != resp.Choices[0].Message.Content || acc.Usage.CompletionTokens != resp.Usage.CompletionTokens {
		t.Errorf("stream %q %+v, whole %q %+v", acc.Choices[0].Message.Content, acc.Usage, resp.Choices[0].Message.Content, resp.Usage)
	}

	cs := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel("sql"),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("SELECT")},
		MaxTokens: openai.Int(8),
	})
	var text strings.Builder
	for cs.Next() {
		for _, ch := range cs.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := cs.Err(); err != nil || text.Len() == 0 {
		t.Fatalf("completion stream on the adapter: %q %v", text.String(), err)
	}

	models, err := c.Models.List(ctx)
	if err != nil || len(models.Data) != 2 || models.Data[0].ID != "base" || models.Data[1].ID != "sql" || models.Data[0].OwnedBy != "vllm" {
		t.Fatalf("models: %+v %v", models, err)
	}

	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "nope",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Message != "The model `nope` does not exist." {
		t.Errorf("unknown model: %v", err)
	}

	// vLLM's 401 body, {"error":"Unauthorized"}, is not an OpenAI error
	// object: the SDK fails to decode it, against vLLM as here.
	bad := openai.NewClient(option.WithBaseURL(ts.url+"/v1"), option.WithAPIKey("wrong"), option.WithMaxRetries(0))
	if _, err := bad.Models.List(ctx); err == nil {
		t.Error("wrong key: no error")
	}
}
