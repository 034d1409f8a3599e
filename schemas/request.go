package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Request is what tokenbus reads of a request of any Kind (an OpenAI chat,
// completion or embeddings request, vLLM's tokenize or detokenize): a typed
// view of every field some part of tokenbus acts on, next to the body
// itself, which travels on byte for byte (fields tokenbus does not read reach
// the engine untouched). Each kind reads its own fields: "prompt" is not
// read in a chat request, nor "stream" in an embeddings request (it passes
// through as an unknown field).
//
// ReadRequest is the only reader of request bodies: the gateway reads a body
// once to route, authorise and account it, and the worker, the sim engine,
// the HTTP engines and the sim-server read it with the same function, so
// every process gives a body the same meaning. Keys are matched exactly, as
// OpenAI's and vLLM's parsers match them ("Stream" is not "stream"), and a
// body that repeats one of the keys below is refused, so no process can take
// {"max_tokens":5,"max_tokens":300} for 5 while another generates 300.
type Request struct {
	Kind Kind
	Body []byte // the body read; the view's raw parts alias it

	// Model is "model", or the default given to ReadRequest when the body
	// names none (then ModelDefaulted is set).
	Model          string
	ModelDefaulted bool

	Stream bool
	// StreamOptions: "stream_options" is an object. IncludeUsage: the stream
	// ends with a usage chunk; as in vLLM, stream_options turns it on unless
	// include_usage is false.
	StreamOptions bool
	IncludeUsage  bool

	// MaxTokens is the completion's length limit, 0 when none is set: for
	// chat max_completion_tokens, else the deprecated max_tokens (vLLM's
	// order); MaxTokensParam names the field it came from.
	MaxTokens      int
	MaxTokensParam string
	MinTokens      int
	N              int // choices per prompt, at least 1
	Seed           int
	HasSeed        bool
	Stop           []string
	IgnoreEOS      bool
	IncludeStopStr bool // include_stop_str_in_output
	Priority       int  // vLLM's priority: lower runs first
	User           string

	Messages []Message // chat: at least one
	Prompt   Prompt    // completion
	// ContinueFinalMessage (chat, vLLM's continue_final_message): the last
	// message is an assistant message to continue, not closed and followed
	// by no generation prompt. A migrated stream's continuation sets it.
	ContinueFinalMessage bool

	// Embeddings (KindEmbedding): Input has the shapes of a completion
	// prompt (a string, strings, token ids, lists of token ids), none empty;
	// EncodingFormat is "float" (the default) or "base64"; Dimensions is
	// "dimensions", 0 when not set.
	Input          Prompt
	EncodingFormat string
	Dimensions     int

	// Tokenize (KindTokenize, vLLM's /tokenize): Prompt (a string) or
	// Messages, not both; AddGenerationPrompt (messages only, default true)
	// and ContinueFinalMessage as in chat; ReturnTokenStrs asks for
	// token_strs.
	AddGenerationPrompt bool
	ReturnTokenStrs     bool

	// Tokens (KindDetokenize): the token ids to turn into text.
	Tokens []int

	// Structured output (chat and completions): response_format.
	ResponseFormat ResponseFormat
	// Tools (chat): tools, tool_choice and parallel_tool_calls (default
	// true). The reader checks their JSON types only: which tool types,
	// choices and schemas an engine accepts is the engine's to say.
	Tools             []Tool
	ToolChoice        ToolChoice
	ParallelToolCalls bool
	// Logprobs: chat's "logprobs": true, or a completions "logprobs" that
	// is an integer (its value in TopLogprobs); TopLogprobs is chat's
	// "top_logprobs". Ranges are the engine's to check.
	Logprobs    bool
	TopLogprobs int
	// ReasoningEffort is chat's reasoning_effort ("low", "medium"...), ""
	// when absent or null.
	ReasoningEffort string
	// KVTransfer is "kv_transfer_params" (chat and completions), the raw
	// JSON object of vLLM's KV-transfer handshake between a prefill and a
	// decode instance (disagg.go, docs/disaggregation.md); nil when absent
	// or null. Its members are the engines' to read and pass on untouched.
	KVTransfer []byte
}

// ResponseFormat is a request's response_format.
type ResponseFormat struct {
	Type string // "text", "json_object", "json_schema"...; "" when absent or null
	// The json_schema member's name, schema (a raw JSON object aliasing the
	// body; nil when absent or null) and strict.
	Name   string
	Schema []byte
	Strict bool
	// HasJSONSchema: the json_schema member is an object.
	HasJSONSchema bool
}

// Tool is one element of a chat request's tools.
type Tool struct {
	Type string // "function" for a function tool
	// The function member's name, description, parameters (a raw JSON
	// object aliasing the body; nil when absent or null) and strict.
	Name        string
	Description string
	Parameters  []byte
	Strict      bool
	HasFunction bool // the function member is an object
}

// ToolChoice is a chat request's tool_choice.
type ToolChoice struct {
	// Mode is the string form ("none", "auto", "required"), or the type of
	// the object form ("function" for {"type":"function","function":
	// {"name":...}}); "" when absent or null.
	Mode string
	Name string // the object form's function.name
}

// The values of an embeddings request's encoding_format: a list of floats
// (the default), or base64 of the float32 values' little-endian bytes.
const (
	EncodingFloat  = "float"
	EncodingBase64 = "base64"
)

// Message is one chat message: its role, and its content as it came (a
// string, null, or an array of content parts), read by Text.
type Message struct {
	Role    string
	content []byte // raw JSON value; nil when absent or null
}

// Prompt is a completion request's prompt: a string, an array of strings,
// an array of token ids or an array of arrays of token ids.
type Prompt struct {
	shape promptShape
	n     int
	raw   []byte
}

type promptShape uint8

const (
	promptNone promptShape = iota
	promptString
	promptStrings
	promptTokens
	promptTokenLists
)

// The fields ReadRequest reads, in the order of the bits of its duplicate check.
type field uint8

const (
	fModel field = iota
	fStream
	fStreamOptions
	fMaxTokens
	fMaxCompletionTokens
	fMinTokens
	fN
	fSeed
	fStop
	fIgnoreEOS
	fIncludeStopStr
	fPriority
	fUser
	fMessages
	fPrompt
	fContinueFinalMessage
	fInput
	fEncodingFormat
	fDimensions
	fAddGenerationPrompt
	fReturnTokenStrs
	fTokens
	fResponseFormat
	fTools
	fToolChoice
	fParallelToolCalls
	fLogprobs
	fTopLogprobs
	fReasoningEffort
	fKVTransferParams
	nFields // the number of fields; seen's bits and nulls' entries
)

var fieldNames = [...]string{
	fModel: "model", fStream: "stream", fStreamOptions: "stream_options", fMaxTokens: "max_tokens",
	fMaxCompletionTokens: "max_completion_tokens", fMinTokens: "min_tokens", fN: "n", fSeed: "seed",
	fStop: "stop", fIgnoreEOS: "ignore_eos", fIncludeStopStr: "include_stop_str_in_output",
	fPriority: "priority", fUser: "user", fMessages: "messages", fPrompt: "prompt",
	fContinueFinalMessage: "continue_final_message", fInput: "input", fEncodingFormat: "encoding_format",
	fDimensions: "dimensions", fAddGenerationPrompt: "add_generation_prompt", fReturnTokenStrs: "return_token_strs",
	fTokens: "tokens", fResponseFormat: "response_format", fTools: "tools", fToolChoice: "tool_choice",
	fParallelToolCalls: "parallel_tool_calls", fLogprobs: "logprobs", fTopLogprobs: "top_logprobs",
	fReasoningEffort: "reasoning_effort", fKVTransferParams: "kv_transfer_params",
}

// Bit sets of the fields each kind reads (bit f for field f).
const (
	generateFields = 1<<fModel | 1<<fStream | 1<<fStreamOptions | 1<<fMaxTokens | 1<<fMinTokens | 1<<fN |
		1<<fSeed | 1<<fStop | 1<<fIgnoreEOS | 1<<fIncludeStopStr | 1<<fPriority | 1<<fUser | 1<<fResponseFormat | 1<<fLogprobs |
		1<<fKVTransferParams
	chatFields = generateFields | 1<<fMessages | 1<<fMaxCompletionTokens | 1<<fContinueFinalMessage | 1<<fTools |
		1<<fToolChoice | 1<<fParallelToolCalls | 1<<fTopLogprobs | 1<<fReasoningEffort
	completionFields = generateFields | 1<<fPrompt
	// vLLM's chat form of embeddings: messages instead of input.
	embeddingFields = 1<<fModel | 1<<fInput | 1<<fEncodingFormat | 1<<fDimensions | 1<<fUser | 1<<fPriority |
		1<<fMessages | 1<<fAddGenerationPrompt | 1<<fContinueFinalMessage
	tokenizeFields = 1<<fModel | 1<<fPrompt | 1<<fMessages | 1<<fAddGenerationPrompt | 1<<fContinueFinalMessage |
		1<<fReturnTokenStrs
	detokenizeFields = 1<<fModel | 1<<fTokens
)

// fields is the set of fields requests of kind k read.
func (k Kind) fields() uint32 {
	switch k {
	case KindChat:
		return chatFields
	case KindCompletion:
		return completionFields
	case KindEmbedding:
		return embeddingFields
	case KindTokenize:
		return tokenizeFields
	case KindDetokenize:
		return detokenizeFields
	}
	return 0
}

// lookupField returns the field a raw key names for kind, or false: keys
// match exactly, escapes decoded, and a field of another kind (messages in
// a completion) is not one.
func lookupField(kind Kind, raw []byte) (field, bool) {
	key := raw
	if hasEscape(raw) {
		var buf [64]byte
		key = appendUnescaped(buf[:0], raw)
	}
	var f field
	switch string(key) { // no allocation
	case "model":
		f = fModel
	case "stream":
		f = fStream
	case "stream_options":
		f = fStreamOptions
	case "max_tokens":
		f = fMaxTokens
	case "max_completion_tokens":
		f = fMaxCompletionTokens
	case "min_tokens":
		f = fMinTokens
	case "n":
		f = fN
	case "seed":
		f = fSeed
	case "stop":
		f = fStop
	case "ignore_eos":
		f = fIgnoreEOS
	case "include_stop_str_in_output":
		f = fIncludeStopStr
	case "priority":
		f = fPriority
	case "user":
		f = fUser
	case "messages":
		f = fMessages
	case "prompt":
		f = fPrompt
	case "continue_final_message":
		f = fContinueFinalMessage
	case "input":
		f = fInput
	case "encoding_format":
		f = fEncodingFormat
	case "dimensions":
		f = fDimensions
	case "add_generation_prompt":
		f = fAddGenerationPrompt
	case "return_token_strs":
		f = fReturnTokenStrs
	case "tokens":
		f = fTokens
	case "response_format":
		f = fResponseFormat
	case "tools":
		f = fTools
	case "tool_choice":
		f = fToolChoice
	case "parallel_tool_calls":
		f = fParallelToolCalls
	case "logprobs":
		f = fLogprobs
	case "top_logprobs":
		f = fTopLogprobs
	case "reasoning_effort":
		f = fReasoningEffort
	case "kv_transfer_params":
		f = fKVTransferParams
	default:
		return 0, false
	}
	return f, kind.fields()&(1<<f) != 0
}

// ReadRequestFor reads body as ReadRequest does, for a request bound to
// model (by its subject, the TorchServe path or the Tb-Model header a
// dispatcher set): a body naming another model is model_mismatch, a body
// naming none gets model (ModelDefaulted).
func ReadRequestFor(kind Kind, body []byte, model string) (*Request, *Error) {
	r, err := ReadRequest(kind, body, model)
	if err != nil {
		return nil, err
	}
	if model != "" && r.Model != model {
		return nil, ErrModelMismatch.New(model, `the body's "model"`, r.Model)
	}
	return r, nil
}

// BoundBody is the body to send on: byte for byte, but with "model" inserted
// right after the opening brace when the body named none (ModelDefaulted),
// so that an engine that forwards the body as is (vLLM) runs the model the
// request was bound to, never its own default. The result may alias Body.
func (r *Request) BoundBody() []byte {
	if !r.ModelDefaulted {
		return r.Body
	}
	i := bytes.IndexByte(r.Body, '{') // ReadRequest checked it is an object
	model, _ := json.Marshal(r.Model)
	out := make([]byte, 0, len(r.Body)+len(model)+10)
	out = append(out, r.Body[:i+1]...)
	out = append(out, `"model":`...)
	out = append(out, model...)
	if rest := bytes.TrimSpace(r.Body[i+1:]); len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, r.Body[i+1:]...)
}

// ReadRequest reads body, a request of kind, into its view, or says with a
// 400 what is wrong with it: malformed JSON, not an object, a repeated key,
// a field of the wrong type, a missing required field (model unless
// defaultModel is set; messages, prompt, input, tokens, or for tokenize
// prompt or messages), a value out of range (n, max_tokens, min_tokens,
// dimensions below their minimum, an empty messages, prompt or input array,
// an empty stop string or input, an encoding_format other than float and
// base64) or stream_options without stream. Limits of
// one engine (context length, vocabulary, the largest n) are the engine's to
// check. A body with several faults gets the first type or duplicate error,
// else the first missing or out-of-range one; a malformed body is always
// reported as malformed.
func ReadRequest(kind Kind, body []byte, defaultModel string) (*Request, *Error) {
	if !kind.Valid() {
		return nil, ErrUnknownKind.New(kind)
	}
	r := reader{s: scanner{b: body}}
	switch r.s.peek() {
	case 0:
		return nil, ErrBodyEmpty.New()
	case '{':
	default:
		if validJSON(body) {
			return nil, ErrBodyNotObject.New()
		}
		return nil, malformed(body)
	}
	req := &Request{Kind: kind, Body: body, N: 1, EncodingFormat: EncodingFloat, AddGenerationPrompt: kind != KindEmbedding,
		ParallelToolCalls: true}
	var seen uint32
	var maxTokens, maxCompletion int
	var hasMin bool
	ok := r.s.object(func(key []byte) bool {
		f, known := lookupField(kind, key)
		if !known {
			return r.s.skip(1)
		}
		if seen&(1<<f) != 0 {
			r.fail(ErrDuplicateKey.At(fieldNames[f], fieldNames[f], "the request body"))
			return r.s.skip(1)
		}
		seen |= 1 << f
		name := fieldNames[f]
		switch f {
		case fModel:
			return r.str(f, &req.Model)
		case fStream:
			return r.boolean(f, name, 1, &req.Stream)
		case fStreamOptions:
			return r.streamOptions(req)
		case fMaxTokens:
			return r.integer(f, &maxTokens, nil)
		case fMaxCompletionTokens:
			return r.integer(f, &maxCompletion, nil)
		case fMinTokens:
			return r.integer(f, &req.MinTokens, &hasMin)
		case fN:
			return r.integer(f, &req.N, nil)
		case fSeed:
			return r.integer(f, &req.Seed, &req.HasSeed)
		case fStop:
			return r.stop(&req.Stop)
		case fIgnoreEOS:
			return r.boolean(f, name, 1, &req.IgnoreEOS)
		case fIncludeStopStr:
			return r.boolean(f, name, 1, &req.IncludeStopStr)
		case fPriority:
			return r.integer(f, &req.Priority, nil)
		case fUser:
			return r.str(f, &req.User)
		case fMessages:
			return r.messages(&req.Messages)
		case fPrompt:
			if kind == KindTokenize { // vLLM's TokenizeCompletionRequest: a string
				return r.textPrompt(&req.Prompt)
			}
			return r.prompt(f, &req.Prompt)
		case fContinueFinalMessage:
			return r.boolean(f, name, 1, &req.ContinueFinalMessage)
		case fInput:
			return r.prompt(f, &req.Input)
		case fEncodingFormat:
			return r.str(f, &req.EncodingFormat)
		case fDimensions:
			return r.integer(f, &req.Dimensions, nil)
		case fAddGenerationPrompt:
			return r.boolean(f, name, 1, &req.AddGenerationPrompt)
		case fReturnTokenStrs:
			return r.boolean(f, name, 1, &req.ReturnTokenStrs)
		case fTokens:
			return r.tokens(&req.Tokens)
		case fResponseFormat:
			return r.responseFormat(&req.ResponseFormat)
		case fTools:
			return r.tools(&req.Tools)
		case fToolChoice:
			return r.toolChoice(&req.ToolChoice)
		case fParallelToolCalls:
			return r.boolean(f, name, 1, &req.ParallelToolCalls)
		case fLogprobs:
			if kind == KindCompletion { // completions: the number of top logprobs
				var has bool
				ok := r.integer(f, &req.TopLogprobs, &has)
				req.Logprobs = has
				return ok
			}
			return r.boolean(f, name, 1, &req.Logprobs)
		case fTopLogprobs:
			return r.integer(f, &req.TopLogprobs, nil)
		case fReasoningEffort:
			return r.str(f, &req.ReasoningEffort)
		case fKVTransferParams:
			if r.null(f) {
				return true
			}
			return r.rawObject(func() string { return name }, 1, &req.KVTransfer)
		}
		return r.s.skip(1)
	})
	if !ok || !r.s.end() {
		return nil, malformed(body)
	}
	if r.err != nil {
		return nil, r.err
	}

	// The types are right; now what is missing or out of range.
	absent := func(f field) bool { return seen&(1<<f) == 0 || r.nulls[f] }
	switch {
	case seen&(1<<fModel) != 0 && req.Model == "": // "" or null: named, but nothing
		return nil, ErrNoModel.New()
	case req.Model != "":
	case defaultModel != "":
		req.Model, req.ModelDefaulted = defaultModel, true
	default:
		return nil, ErrNoModel.New()
	}
	switch {
	case kind == KindChat && absent(fMessages):
		return nil, ErrMissingParam.At("messages", "messages")
	case kind == KindChat && len(req.Messages) == 0:
		return nil, emptyArray("messages")
	case kind == KindCompletion && absent(fPrompt):
		return nil, ErrMissingParam.At("prompt", "prompt")
	case kind == KindCompletion && req.Prompt.n == 0:
		return nil, emptyArray("prompt")
	case kind == KindEmbedding && absent(fInput) && absent(fMessages):
		return nil, ErrMissingParam.At("input", "input")
	case kind == KindEmbedding && !absent(fInput) && !absent(fMessages):
		return nil, ErrInvalidValue.At("messages", "messages", "give either input or messages, not both")
	case kind == KindEmbedding && !absent(fInput) && req.Input.n == 0:
		return nil, emptyArray("input")
	case kind == KindEmbedding && len(req.Messages) == 0 && !absent(fMessages):
		return nil, emptyArray("messages")
	case kind == KindTokenize && absent(fPrompt) && absent(fMessages):
		return nil, ErrMissingParam.At("prompt", "prompt' or 'messages")
	case kind == KindTokenize && !absent(fPrompt) && !absent(fMessages):
		return nil, ErrInvalidValue.At("messages", "messages", "give either prompt or messages, not both")
	case kind == KindTokenize && !absent(fMessages) && len(req.Messages) == 0:
		return nil, emptyArray("messages")
	case kind == KindDetokenize && absent(fTokens):
		return nil, ErrMissingParam.At("tokens", "tokens")
	case r.later != nil:
		return nil, r.later
	case req.StreamOptions && !req.Stream:
		return nil, ErrStreamOptions.New()
	case req.N < 1:
		return nil, belowMin("n", req.N, 1)
	case !absent(fMaxTokens) && maxTokens < 1:
		return nil, belowMin("max_tokens", maxTokens, 1)
	case !absent(fMaxCompletionTokens) && maxCompletion < 1:
		return nil, belowMin("max_completion_tokens", maxCompletion, 1)
	case !absent(fDimensions) && req.Dimensions < 1:
		return nil, belowMin("dimensions", req.Dimensions, 1)
	case kind == KindEmbedding && req.EncodingFormat != EncodingFloat && req.EncodingFormat != EncodingBase64:
		// absent or null leaves the default, float
		return nil, ErrInvalidValue.At("encoding_format", "encoding_format",
			fmt.Sprintf("expected 'float' or 'base64', but got '%s'", req.EncodingFormat))
	case (kind == KindTokenize || kind == KindEmbedding) && req.ContinueFinalMessage && req.AddGenerationPrompt && !absent(fMessages):
		return nil, ErrInvalidValue.At("continue_final_message", "continue_final_message",
			"cannot set both continue_final_message and add_generation_prompt to true")
	}
	if !req.Stream {
		req.IncludeUsage = false
	}
	switch {
	case !absent(fMaxCompletionTokens):
		req.MaxTokens, req.MaxTokensParam = maxCompletion, "max_completion_tokens"
	case !absent(fMaxTokens):
		req.MaxTokens, req.MaxTokensParam = maxTokens, "max_tokens"
	}
	if hasMin {
		if req.MinTokens < 0 {
			return nil, belowMin("min_tokens", req.MinTokens, 0)
		}
		if req.MaxTokens > 0 && req.MinTokens > req.MaxTokens {
			return nil, ErrInvalidValue.At("min_tokens", "min_tokens",
				fmt.Sprintf("it must be at most %s=%d, but got %d", req.MaxTokensParam, req.MaxTokens, req.MinTokens))
		}
	}
	return req, nil
}

// ReadMessages reads a chat messages array on its own, with ReadRequest's
// rules: bodies that are not completion requests (vLLM's /tokenize) carry
// one too.
func ReadMessages(raw []byte) ([]Message, *Error) {
	r := reader{s: scanner{b: raw}}
	var msgs []Message
	if !r.messages(&msgs) || !r.s.end() {
		return nil, malformed(raw)
	}
	switch {
	case r.err != nil:
		return nil, r.err
	case r.nulls[fMessages]:
		return nil, ErrMissingParam.At("messages", "messages")
	case len(msgs) == 0:
		return nil, emptyArray("messages")
	case r.later != nil:
		return nil, r.later
	}
	return msgs, nil
}

// reader is ReadRequest's state: the scanner and the first error found on
// the way, reported once the whole body is known to be well formed: err for
// a wrong type or a repeated key, later for a missing or empty value inside
// messages or stop (reported after the top-level checks).
type reader struct {
	s     scanner
	err   *Error
	later *Error
	nulls [nFields]bool // the field was null
}

// notTop stands for "not a top-level field" where a helper takes a field.
const notTop field = 255

func (r *reader) fail(e *Error) {
	if r.err == nil {
		r.err = e
	}
}

func (r *reader) failLater(e *Error) {
	if r.later == nil {
		r.later = e
	}
}

// mismatch records that the value at param (depth containers deep) is not
// of the type want and consumes it; false only if it is malformed.
func (r *reader) mismatch(param, want string, depth int) bool {
	v, ok := r.s.value(depth)
	if !ok {
		return false
	}
	r.fail(ErrInvalidType.At(param, param, want, kindOf(v[0])))
	return true
}

// null consumes a null if one is next and records it for field f.
func (r *reader) null(f field) bool {
	if !r.s.null() {
		return false
	}
	if f != notTop {
		r.nulls[f] = true
	}
	return true
}

// str reads a top-level string field.
func (r *reader) str(f field, dst *string) bool {
	if r.null(f) {
		return true
	}
	if r.s.peek() != '"' {
		return r.mismatch(fieldNames[f], "a string", 1)
	}
	raw, ok := r.s.rawString()
	if ok {
		*dst = jsonString(raw)
	}
	return ok
}

// boolean reads a boolean; param names it, f is its field (or notTop).
func (r *reader) boolean(f field, param string, depth int, dst *bool) bool {
	switch r.s.peek() {
	case 't':
		*dst = true
		return r.s.lit("true")
	case 'f':
		*dst = false
		return r.s.lit("false")
	case 'n':
		if r.null(f) {
			return true
		}
	}
	return r.mismatch(param, "a boolean", depth)
}

// integer reads a top-level integer field; has, if set, reports that one
// was there (not null).
func (r *reader) integer(f field, dst *int, has *bool) bool {
	param := fieldNames[f]
	c := r.s.peek()
	if c == 'n' && r.null(f) {
		return true
	}
	if c != '-' && (c < '0' || c > '9') {
		return r.mismatch(param, "an integer", 1)
	}
	text, ok := r.s.number()
	if !ok {
		return false
	}
	n, isInt := parseInt(text)
	switch {
	case isInt:
		*dst = n
		if has != nil {
			*has = true
		}
	case isDecimal(text):
		r.fail(ErrInvalidType.At(param, param, "an integer", "a decimal number"))
	default:
		r.fail(ErrIntRange.At(param, param))
	}
	return true
}

func isDecimal(text []byte) bool {
	for _, c := range text {
		if c == '.' || c == 'e' || c == 'E' {
			return true
		}
	}
	return false
}

func (r *reader) streamOptions(req *Request) bool {
	if r.null(fStreamOptions) {
		return true
	}
	if r.s.peek() != '{' {
		return r.mismatch("stream_options", "an object", 1)
	}
	req.StreamOptions, req.IncludeUsage = true, true
	seen := false
	return r.s.object(func(key []byte) bool {
		if !keyIs(key, "include_usage") {
			return r.s.skip(2)
		}
		const param = "stream_options.include_usage"
		if seen {
			r.fail(ErrDuplicateKey.At(param, "include_usage", "'stream_options'"))
			return r.s.skip(2)
		}
		seen = true
		inc := true // null: vLLM's default, usage on
		if !r.boolean(notTop, param, 2, &inc) {
			return false
		}
		req.IncludeUsage = inc
		return true
	})
}

// stop reads a string or an array of strings; none may be empty.
func (r *reader) stop(dst *[]string) bool {
	const param = "stop"
	const want = "a string or an array of strings"
	switch r.s.peek() {
	case 'n':
		if r.null(fStop) {
			return true
		}
	case '"':
		raw, ok := r.s.rawString()
		if !ok {
			return false
		}
		*dst = []string{jsonString(raw)}
	case '[':
		var out []string
		bad := false
		ok := r.s.array(func() bool {
			if r.s.peek() != '"' {
				bad = true
				return r.s.skip(2)
			}
			raw, ok := r.s.rawString()
			out = append(out, jsonString(raw))
			return ok
		})
		if !ok {
			return false
		}
		if bad {
			r.fail(ErrInvalidType.At(param, param, want, "an array with other values"))
			return true
		}
		*dst = out
	default:
		return r.mismatch(param, want, 1)
	}
	for _, s := range *dst {
		if s == "" {
			r.failLater(ErrInvalidValue.At(param, param, "stop strings cannot be empty"))
		}
	}
	return true
}

// messages reads the chat messages: objects with a role (a non-empty
// string) and a content (a string, null, or an array of content parts, each
// an object whose type and text are strings when present).
func (r *reader) messages(dst *[]Message) bool {
	if r.null(fMessages) {
		return true
	}
	if r.s.peek() != '[' {
		return r.mismatch("messages", "an array of objects", 1)
	}
	out := make([]Message, 0, 8)
	i := 0
	ok := r.s.array(func() bool {
		defer func() { i++ }()
		if r.s.peek() != '{' {
			return r.mismatch(indexed("messages", i, ""), "an object", 2)
		}
		var m Message
		var hasRole, hasContent bool
		ok := r.s.object(func(key []byte) bool {
			switch {
			case keyIs(key, "role"):
				if hasRole {
					r.fail(ErrDuplicateKey.At(indexed("messages", i, "role"), "role", "'"+indexed("messages", i, "")+"'"))
					return r.s.skip(3)
				}
				hasRole = true
				if r.s.peek() != '"' {
					return r.mismatch(indexed("messages", i, "role"), "a string", 3)
				}
				raw, ok := r.s.rawString()
				m.Role = role(raw)
				return ok
			case keyIs(key, "content"):
				if hasContent {
					r.fail(ErrDuplicateKey.At(indexed("messages", i, "content"), "content", "'"+indexed("messages", i, "")+"'"))
					return r.s.skip(3)
				}
				hasContent = true
				return r.content(i, &m)
			}
			return r.s.skip(3)
		})
		if ok && m.Role == "" {
			param := indexed("messages", i, "role")
			if hasRole {
				r.failLater(ErrInvalidValue.At(param, param, "empty string"))
			} else {
				r.failLater(ErrMissingParam.At(param, param))
			}
		}
		out = append(out, m)
		return ok
	})
	if !ok {
		return false
	}
	*dst = out
	return true
}

// content reads the content of message i. Parameter names are made only
// for errors: most bodies have none, and many messages.
func (r *reader) content(i int, m *Message) bool {
	switch r.s.peek() {
	case 'n':
		return r.s.lit("null")
	case '"':
		start := r.s.i
		_, ok := r.s.rawString()
		m.content = r.s.b[start:r.s.i]
		return ok
	case '[':
	default:
		return r.mismatch(indexed("messages", i, "content"), "a string or an array of content parts", 3)
	}
	start := r.s.i
	j := 0
	ok := r.s.array(func() bool {
		defer func() { j++ }()
		part := func(member string) string { return indexed(indexed("messages", i, "content"), j, member) }
		if r.s.peek() != '{' {
			return r.mismatch(part(""), "an object", 4)
		}
		var seenType, seenText bool
		return r.s.object(func(key []byte) bool {
			var seen *bool
			var name string
			switch {
			case keyIs(key, "type"):
				seen, name = &seenType, "type"
			case keyIs(key, "text"):
				seen, name = &seenText, "text"
			default:
				return r.s.skip(5)
			}
			if *seen {
				r.fail(ErrDuplicateKey.At(part(name), name, "'"+part("")+"'"))
				return r.s.skip(5)
			}
			*seen = true
			if r.s.peek() != '"' {
				return r.mismatch(part(name), "a string", 5)
			}
			_, ok := r.s.rawString()
			return ok
		})
	})
	m.content = r.s.b[start:r.s.i]
	return ok
}

// prompt reads a completion prompt or an embeddings input (field f) and
// checks its shape; token ids must be integers (which ones exist is the
// engine's to say). An input may hold no empty string or empty list of
// token ids (OpenAI refuses them; a prompt's are the engine's to judge).
func (r *reader) prompt(f field, p *Prompt) bool {
	const want = "a string, an array of strings, an array of token ids or an array of arrays of token ids"
	param := fieldNames[f]
	if r.null(f) {
		return true
	}
	start := r.s.i
	switch r.s.peek() {
	case '"':
		start = r.s.i
		raw, ok := r.s.rawString()
		*p = Prompt{shape: promptString, n: 1, raw: r.s.b[start:r.s.i]}
		if ok && f == fInput && len(raw) == 0 {
			r.failLater(ErrInvalidValue.At(param, param, "it cannot be an empty string"))
		}
		return ok
	case '[':
	default:
		return r.mismatch(param, want, 1)
	}
	start = r.s.i
	shape, n, bad := promptNone, 0, false
	ok := r.s.array(func() bool {
		var s promptShape
		var ok bool
		switch r.s.peek() {
		case '"':
			s = promptStrings
			var raw []byte
			raw, ok = r.s.rawString()
			if ok && f == fInput && len(raw) == 0 {
				r.failLater(ErrInvalidValue.At(indexed(param, n, ""), indexed(param, n, ""), "it cannot be an empty string"))
			}
		case '[':
			s = promptTokenLists
			ids := 0
			ok = r.s.array(func() bool {
				ids++
				if !r.tokenID() {
					bad = true
					return r.s.skip(3)
				}
				return true
			})
			if ok && f == fInput && ids == 0 {
				r.failLater(emptyArray(indexed(param, n, "")))
			}
		default:
			s = promptTokens
			if !r.tokenID() {
				bad = true
				ok = r.s.skip(2)
			} else {
				ok = true
			}
		}
		if shape == promptNone {
			shape = s
		} else if s != shape {
			bad = true
		}
		n++
		return ok
	})
	if !ok {
		return false
	}
	if bad {
		r.fail(ErrInvalidType.At(param, param, want, "an array with other values"))
		return true
	}
	*p = Prompt{shape: shape, n: n, raw: r.s.b[start:r.s.i]}
	return true
}

// textPrompt reads a prompt that must be a string (vLLM's /tokenize).
func (r *reader) textPrompt(p *Prompt) bool {
	if r.null(fPrompt) {
		return true
	}
	if r.s.peek() != '"' {
		return r.mismatch("prompt", "a string", 1)
	}
	start := r.s.i
	_, ok := r.s.rawString()
	*p = Prompt{shape: promptString, n: 1, raw: r.s.b[start:r.s.i]}
	return ok
}

// tokens reads an array of token ids (detokenize).
func (r *reader) tokens(dst *[]int) bool {
	const want = "an array of token ids"
	if r.null(fTokens) {
		return true
	}
	if r.s.peek() != '[' {
		return r.mismatch("tokens", want, 1)
	}
	out := []int{}
	bad := false
	ok := r.s.array(func() bool {
		c := r.s.peek()
		if c != '-' && (c < '0' || c > '9') {
			bad = true
			return r.s.skip(2)
		}
		text, ok := r.s.number()
		if !ok {
			return false
		}
		n, isInt := parseInt(text)
		if !isInt {
			bad = true
		}
		out = append(out, n)
		return true
	})
	if !ok {
		return false
	}
	if bad {
		r.fail(ErrInvalidType.At("tokens", "tokens", want, "an array with other values"))
		return true
	}
	*dst = out
	return true
}

// tokenID consumes an integer; false (nothing consumed) if the next value
// is not one.
func (r *reader) tokenID() bool {
	c := r.s.peek()
	if c != '-' && (c < '0' || c > '9') {
		return false
	}
	save := r.s.i
	text, ok := r.s.number()
	if ok {
		if _, isInt := parseInt(text); isInt {
			return true
		}
	}
	r.s.i = save
	return false
}

// role is a role's value without allocating for the usual ones.
func role(raw []byte) string {
	switch string(raw) {
	case "system":
		return "system"
	case "user":
		return "user"
	case "assistant":
		return "assistant"
	case "developer":
		return "developer"
	case "tool":
		return "tool"
	}
	return jsonString(raw)
}

func indexed(param string, i int, member string) string {
	s := param + "[" + itoa(i) + "]"
	if member != "" {
		s += "." + member
	}
	return s
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(b[n:])
		}
	}
}

// Text is a message's text: its content if a string, the text of its text
// parts joined with newlines (as vLLM does for text-only models), or "".
func (m Message) Text() string {
	if len(m.content) == 0 {
		return ""
	}
	s := scanner{b: m.content}
	if s.peek() == '"' {
		raw, _ := s.rawString()
		return jsonString(raw)
	}
	var out []byte
	first := true
	s.array(func() bool {
		var typ, text []byte
		var hasText bool
		s.object(func(key []byte) bool {
			switch {
			case keyIs(key, "type"):
				typ, _ = s.rawString()
				return true
			case keyIs(key, "text"):
				text, _ = s.rawString()
				hasText = true
				return true
			}
			return s.skip(1)
		})
		if hasText && (typ == nil || keyIs(typ, "text")) {
			if !first {
				out = append(out, '\n')
			}
			first = false
			out = appendUnescaped(out, text)
		}
		return true
	})
	return string(out)
}

// Len is the number of prompts (1 for a string or a list of token ids).
func (p Prompt) Len() int {
	switch p.shape {
	case promptString, promptTokens:
		return 1
	}
	return p.n
}

// IsText reports whether the prompt is text (a string or strings), not token ids.
func (p Prompt) IsText() bool { return p.shape == promptString || p.shape == promptStrings }

// Texts returns the prompts of a text prompt, nil for token ids.
func (p Prompt) Texts() []string {
	s := scanner{b: p.raw}
	switch p.shape {
	case promptString:
		raw, _ := s.rawString()
		return []string{jsonString(raw)}
	case promptStrings:
		out := make([]string, 0, p.n)
		s.array(func() bool {
			s.ws()
			raw, _ := s.rawString()
			out = append(out, jsonString(raw))
			return true
		})
		return out
	}
	return nil
}

// TokenIDs returns the prompts of a token-id prompt, nil for text.
func (p Prompt) TokenIDs() [][]int {
	s := scanner{b: p.raw}
	list := func() []int {
		var ids []int
		s.array(func() bool {
			text, _ := s.number()
			n, _ := parseInt(text)
			ids = append(ids, n)
			return true
		})
		return ids
	}
	switch p.shape {
	case promptTokens:
		return [][]int{list()}
	case promptTokenLists:
		out := make([][]int, 0, p.n)
		s.array(func() bool {
			out = append(out, list())
			return true
		})
		return out
	}
	return nil
}

func belowMin(param string, got, min int) *Error { return ErrBelowMin.At(param, param, min, got) }

func emptyArray(param string) *Error { return ErrEmptyArray.At(param, param) }

// malformed is the 400 for a body that is not JSON, with encoding/json's
// description of where it breaks.
func malformed(body []byte) *Error {
	var v struct{}
	err := json.Unmarshal(body, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return ErrBodyNotJSON.New(fmt.Sprintf("%v at byte %d", se, se.Offset))
	}
	return ErrBodyNotJSON.New("it is not one JSON value")
}
