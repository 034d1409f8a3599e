package responses

import (
	"encoding/json"
	"slices"
)

// CreateRequest is the body of POST /v1/responses. Parse reads it:
// every field is one of OpenAI's ResponseCreateParams or one of vLLM's
// Responses extras, and is honoured, passed to the engine or refused
// (docs/responses.md has the table).
type CreateRequest struct {
	Model              string            `json:"model"`
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Temperature        *float64          `json:"temperature"`
	TopP               *float64          `json:"top_p"`
	Stream             bool              `json:"stream"`
	Store              *bool             `json:"store"`
	Background         bool              `json:"background"`
	Metadata           map[string]string `json:"metadata"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Tools              []json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	User               string            `json:"user"`

	Include     []string    `json:"include"`
	Text        *TextConfig `json:"text"`
	Reasoning   *Reasoning  `json:"reasoning"`
	Truncation  *string     `json:"truncation"`
	TopLogprobs *int        `json:"top_logprobs"`
	// Accepted and echoed: see docs/responses.md for what each does here.
	MaxToolCalls         *int    `json:"max_tool_calls"`
	ServiceTier          *string `json:"service_tier"`
	SafetyIdentifier     *string `json:"safety_identifier"`
	PromptCacheKey       *string `json:"prompt_cache_key"`
	PromptCacheRetention *string `json:"prompt_cache_retention"`
	StreamOptions        *struct {
		IncludeObfuscation *bool `json:"include_obfuscation"`
	} `json:"stream_options"`

	// vLLM's Responses extras, passed to the engine's chat request.
	TopK              *int            `json:"top_k"`
	LogitBias         json.RawMessage `json:"logit_bias"`
	SkipSpecialTokens *bool           `json:"skip_special_tokens"`
	Priority          *int            `json:"priority"`
	CacheSalt         *string         `json:"cache_salt"`
}

// TextConfig is the request's and the response's text: the output format
// (kept as sent: the response echoes it) and verbosity.
type TextConfig struct {
	Format    json.RawMessage `json:"format,omitempty"`
	Verbosity *string         `json:"verbosity,omitempty"`
}

// Reasoning is the request's and the response's reasoning options.
type Reasoning struct {
	Effort          *string `json:"effort"`
	Summary         *string `json:"summary"`
	GenerateSummary *string `json:"generate_summary,omitempty"`
	Context         *string `json:"context,omitempty"`
	Mode            *string `json:"mode,omitempty"`
}

// IncludeLogprobs is the include value whose logprobs tokenbus serves.
const IncludeLogprobs = "message.output_text.logprobs"

// Logprobs says whether the output text's logprobs are asked for.
func (r *CreateRequest) Logprobs() bool {
	return slices.Contains(r.Include, IncludeLogprobs) || r.TopLogprobs != nil && *r.TopLogprobs > 0
}

// Truncates says whether truncation is "auto".
func (r *CreateRequest) Truncates() bool {
	return r.Truncation != nil && *r.Truncation == TruncationAuto
}

// Truncation strategies.
const (
	TruncationAuto     = "auto"
	TruncationDisabled = "disabled"
)

// Stored says whether the response is kept (store defaults to true).
func (r *CreateRequest) Stored() bool { return r.Store == nil || *r.Store }

// Response is OpenAI's Response object.
type Response struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"` // "response"
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	Background         bool              `json:"background"`
	Error              *Error            `json:"error"`
	IncompleteDetails  *Incomplete       `json:"incomplete_details"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	MaxToolCalls       *int              `json:"max_tool_calls"`
	Model              string            `json:"model"`
	Output             []Item            `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	PromptCacheKey     *string           `json:"prompt_cache_key"`
	Reasoning          *Reasoning        `json:"reasoning"`
	SafetyIdentifier   *string           `json:"safety_identifier"`
	ServiceTier        string            `json:"service_tier,omitempty"`
	Store              bool              `json:"store"`
	Temperature        *float64          `json:"temperature"`
	Text               json.RawMessage   `json:"text"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              []json.RawMessage `json:"tools"`
	TopLogprobs        *int              `json:"top_logprobs"`
	TopP               *float64          `json:"top_p"`
	Truncation         string            `json:"truncation"`
	Usage              *Usage            `json:"usage"`
	User               *string           `json:"user"`
	Metadata           map[string]string `json:"metadata"`
}

// Statuses of a response.
const (
	StatusQueued     = "queued"
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"
	StatusFailed     = "failed"
	StatusCancelled  = "cancelled"
	StatusIncomplete = "incomplete"
)

// Ended reports whether status is final.
func Ended(status string) bool {
	switch status {
	case StatusCompleted, StatusFailed, StatusCancelled, StatusIncomplete:
		return true
	}
	return false
}

// Error is a failed response's error.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Incomplete says why a response is incomplete.
type Incomplete struct {
	Reason string `json:"reason"` // max_output_tokens | content_filter
}

// Usage is a response's token counts.
type Usage struct {
	InputTokens         int          `json:"input_tokens"`
	InputTokensDetails  InputDetails `json:"input_tokens_details"`
	OutputTokens        int          `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// InputDetails is usage's input_tokens_details.
type InputDetails struct {
	CachedTokens     int `json:"cached_tokens"`
	CacheWriteTokens int `json:"cache_write_tokens"`
}

func newUsage(in, out, cached, reasoning int) *Usage {
	u := &Usage{InputTokens: in, OutputTokens: out, TotalTokens: in + out, InputTokensDetails: InputDetails{CachedTokens: cached}}
	u.OutputTokensDetails.ReasoningTokens = reasoning
	return u
}

// Item is an input or output item: a message, a reasoning item, a
// function call or a function call's output (the fields of the other
// types are empty).
type Item struct {
	Type      string    `json:"type"`
	ID        string    `json:"id,omitempty"`
	Status    string    `json:"status,omitempty"`
	Role      string    `json:"role,omitempty"`
	Content   []Content `json:"content,omitempty"`
	Summary   []Content `json:"summary,omitempty"` // reasoning: summary_text parts (tokenbus makes none)
	CallID    string    `json:"call_id,omitempty"`
	Name      string    `json:"name,omitempty"`
	Arguments string    `json:"arguments,omitempty"`
	Output    string    `json:"output,omitempty"`
}

// Content is a text part: input_text, output_text, reasoning_text or
// summary_text.
type Content struct {
	Type        string          `json:"type"`
	Text        string          `json:"text"`
	Annotations json.RawMessage `json:"annotations,omitempty"` // [] on output_text
	Logprobs    json.RawMessage `json:"logprobs,omitempty"`    // on output_text: [] unless asked for
}

// Event is one streaming event. Only the fields of its type are set.
type Event struct {
	Type           string          `json:"type"`
	SequenceNumber int             `json:"sequence_number"`
	Response       *Response       `json:"response,omitempty"`
	OutputIndex    *int            `json:"output_index,omitempty"`
	ContentIndex   *int            `json:"content_index,omitempty"`
	ItemID         string          `json:"item_id,omitempty"`
	Item           *Item           `json:"item,omitempty"`
	Part           *Content        `json:"part,omitempty"`
	Delta          *string         `json:"delta,omitempty"`
	Text           *string         `json:"text,omitempty"`
	Arguments      *string         `json:"arguments,omitempty"`
	Name           string          `json:"name,omitempty"`
	Logprobs       json.RawMessage `json:"logprobs,omitempty"`
	// The "error" event's fields.
	Code    *string `json:"code,omitempty"`
	Message string  `json:"message,omitempty"`

	// lps: a live text delta's logprobs as the engine gave them (bytes
	// included), so that Gen applies them without reading Logprobs back.
	lps []tokenLogprob
}

// Terminal reports whether ev ends a response's stream.
func (ev *Event) Terminal() bool {
	switch ev.Type {
	case "response.completed", "response.failed", "response.incomplete", "response.cancelled", "error":
		return true
	}
	return false
}

// Deleted is DELETE /v1/responses/{id}'s answer.
type Deleted struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "response.deleted"
	Deleted bool   `json:"deleted"`
}

// ItemList is GET /v1/responses/{id}/input_items' answer.
type ItemList struct {
	Object  string `json:"object"` // "list"
	Data    []Item `json:"data"`
	FirstID string `json:"first_id"`
	LastID  string `json:"last_id"`
	HasMore bool   `json:"has_more"`
}

// MarshalJSON writes a message's content even when empty (the SDKs'
// stream helpers append to it), a reasoning item's summary and content
// (summary is required), a function call's arguments, and other items
// without them.
func (it Item) MarshalJSON() ([]byte, error) {
	type plain Item
	switch it.Type {
	case "function_call":
		return json.Marshal(struct {
			plain
			Arguments string `json:"arguments"`
		}{plain(it), it.Arguments})
	case "reasoning":
		return json.Marshal(struct {
			plain
			Summary []Content `json:"summary"`
			Content []Content `json:"content"`
		}{plain(it), orEmpty(it.Summary), orEmpty(it.Content)})
	case "message":
		return json.Marshal(struct {
			plain
			Content []Content `json:"content"`
		}{plain(it), orEmpty(it.Content)})
	}
	return json.Marshal(plain(it))
}

func orEmpty(c []Content) []Content {
	if c == nil {
		return []Content{}
	}
	return c
}
