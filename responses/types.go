package responses

import "encoding/json"

// CreateRequest is the body of POST /v1/responses: the fields tokenbus
// reads. Others (text, truncation, reasoning, include...) are accepted and
// not acted on.
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
}

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
	Model              string            `json:"model"`
	Output             []Item            `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Store              bool              `json:"store"`
	Temperature        *float64          `json:"temperature"`
	Text               json.RawMessage   `json:"text"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              []json.RawMessage `json:"tools"`
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
	InputTokens         int             `json:"input_tokens"`
	InputTokensDetails  json.RawMessage `json:"input_tokens_details"`
	OutputTokens        int             `json:"output_tokens"`
	OutputTokensDetails json.RawMessage `json:"output_tokens_details"`
	TotalTokens         int             `json:"total_tokens"`
}

func newUsage(in, out int) *Usage {
	return &Usage{InputTokens: in, OutputTokens: out, TotalTokens: in + out,
		InputTokensDetails:  json.RawMessage(`{"cached_tokens":0}`),
		OutputTokensDetails: json.RawMessage(`{"reasoning_tokens":0}`)}
}

// Item is an input or output item: a message, a function call or a
// function call's output (the fields of the other types are empty).
type Item struct {
	Type      string    `json:"type"`
	ID        string    `json:"id,omitempty"`
	Status    string    `json:"status,omitempty"`
	Role      string    `json:"role,omitempty"`
	Content   []Content `json:"content,omitempty"`
	CallID    string    `json:"call_id,omitempty"`
	Name      string    `json:"name,omitempty"`
	Arguments string    `json:"arguments,omitempty"`
	Output    string    `json:"output,omitempty"`
}

// Content is a text part of a message: input_text or output_text.
type Content struct {
	Type        string          `json:"type"`
	Text        string          `json:"text"`
	Annotations json.RawMessage `json:"annotations,omitempty"` // [] on output_text
	Logprobs    json.RawMessage `json:"logprobs,omitempty"`
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
// stream helpers append to it), and other items without one.
func (it Item) MarshalJSON() ([]byte, error) {
	type plain Item
	switch it.Type {
	case "function_call":
		return json.Marshal(struct {
			plain
			Arguments string `json:"arguments"`
		}{plain(it), it.Arguments})
	case "message":
	default:
		return json.Marshal(plain(it))
	}
	c := it.Content
	if c == nil {
		c = []Content{}
	}
	return json.Marshal(struct {
		plain
		Content []Content `json:"content"`
	}{plain(it), c})
}
