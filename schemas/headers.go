package schemas

import (
	"strconv"
	"strings"
	"time"
)

// Request headers on ReqPrefix and WorkPrefix messages. The body of a request
// is the client's OpenAI JSON, byte for byte. NATS header names are case-sensitive.
const (
	HdrRequestID = "Tb-Request-Id" // required; see ValidRequestID
	HdrKind      = "Tb-Kind"       // a Kind: "chat", "completion", "embedding", "tokenize" or "detokenize"; required
	HdrModel     = "Tb-Model"      // the model; must agree with the subject's (model_mismatch)
	HdrDeadline  = "Tb-Deadline"   // unix milliseconds; work past it is dropped
	HdrPriority  = "Tb-Priority"   // integer, lower is served first (vLLM's convention); default 0
	HdrTenant    = "Tb-Tenant"     // tenant name, for limits and usage; on TenantReqPrefix set by the dispatcher
	HdrBounce    = "Tb-Bounce"     // set by a dispatcher: where a full worker hands the request back
	HdrAttempt   = "Tb-Attempt"    // set by a dispatcher: how many workers have bounced it
	HdrWorker    = "Tb-Worker"     // set by a dispatcher: the worker it forwarded to
	HdrTrace     = "traceparent"   // W3C trace context

	// Set by a client that sends a request again after its worker failed
	// (client: retry and migration). HdrExclude lists the workers to avoid,
	// comma-separated (ExcludeHas): a client may only exclude, never choose.
	// HdrResume is the number of completion tokens already streamed: the
	// request is a continuation, and an engine that can resume exactly (the
	// sim) continues its output at that position.
	HdrExclude = "Tb-Exclude"
	HdrResume  = "Tb-Resume"

	// HdrTokenIDs ("1") is set by a client that takes token ids in the
	// chunks of a chat or completions stream that did not ask for them, and
	// removes them before its reader sees them (client: exact migration):
	// an engine that can return them (vLLM's return_token_ids) asks for
	// them, so that a stream whose worker fails can be continued from its
	// tokens, not from its text.
	HdrTokenIDs = "Tb-Token-Ids"

	// Set by a dispatcher on a request for a LoRA adapter (and stripped from
	// any other): the adapter's base model and where its weights are, from the
	// registry, so a worker that does not have it loaded can load it first.
	// Clients cannot set them: a dispatcher overwrites or removes both.
	HdrAdapterBase = "Tb-Adapter-Base"
	HdrAdapterPath = "Tb-Adapter-Path"

	// Set by a dispatcher on a tenant request (TenantReqPrefix) it admitted
	// for an API key, and stripped from every other: the key's id, and what
	// admission reserved against its TPM limit (tokens) in which rate-limit
	// window. A worker records the usage of a request that carries
	// HdrKeyID (schemas.UsageRecord); a gateway records its own requests.
	HdrKeyID    = "Tb-Key-Id"
	HdrReserved = "Tb-Reserved"
	HdrWindow   = "Tb-Window"

	// HdrCancelToken is set by a dispatcher on every request it takes
	// (overwriting what a client sent): the secret a cancel must carry
	// (CancelBody). queued and accepted frames hand it to the requester.
	HdrCancelToken = "Tb-Cancel-Token"

	// HdrPrefixCached is set by a dispatcher on a request it routed by
	// prefix (and removed from every other): how much of the prompt it
	// predicts the chosen worker holds in its prefix cache, as
	// "<cached>/<total>" bytes of the prompt text (FormatPrefixCached). The
	// worker sets it against the cached tokens its engine reports.
	HdrPrefixCached = "Tb-Prefix-Cached"

	// Prefill/decode disaggregation (docs/disaggregation.md).
	// HdrPrefillWorker is set by a dispatcher that disaggregates a request
	// (and removed from every other): the worker that is to run its
	// prefill. The decode worker it is forwarded to sends that worker the
	// prefill, on its PrefillSubject, and streams the request itself with
	// the KV-transfer params of the answer. Only a prefill so received may
	// carry kv_transfer_params to an engine: a worker removes them from any
	// other request, so no client can point an engine at KV blocks of its
	// choosing.
	HdrPrefillWorker = "Tb-Prefill-Worker"

	// Flow control (docs/scheduling.md). HdrBand is the request's priority
	// band (a Band's name; default interactive), HdrWeight its tenant's
	// fair-share weight in that band (1..MaxWeight; default 1), HdrMaxQueue
	// the longest it may wait in a dispatcher's queue, in milliseconds
	// (default: the dispatcher's queue timeout). A gateway sets them from
	// the caller's API key; on a tenant request (TenantReqPrefix) the
	// dispatcher sets them from the key and a client's are removed.
	HdrBand     = "Tb-Band"
	HdrWeight   = "Tb-Weight"
	HdrMaxQueue = "Tb-Max-Queue"
	// HdrMaxTokens is the request's max_tokens, for the dispatcher's cost
	// estimate when it does not read the body (a gateway's embedded
	// dispatcher); one that reads the body takes the body's. A wrong value
	// only misplaces the request once: the real cost settles it.
	HdrMaxTokens = "Tb-Max-Tokens"
)

// DispatcherOnly reports whether a request header is one only dispatchers
// may set: a dispatcher removes each such header a client sent before it
// sets its own. Tb-Tenant, Tb-Band, Tb-Weight and Tb-Max-Queue are among
// them on tenant requests only (the caller passes tenant), where the key
// decides them. Header names are
// compared case-insensitively, so that no spelling slips past a reader that
// canonicalises.
func DispatcherOnly(name string, tenant bool) bool {
	switch name { // the headers clients send, spelled as they are: no folding
	case HdrRequestID, HdrKind, HdrModel, HdrDeadline, HdrPriority, HdrMux, HdrTrace, HdrExclude, HdrResume, HdrTokenIDs, HdrMaxTokens:
		return false
	}
	if len(name) < 3 || !strings.EqualFold(name[:3], "tb-") {
		return false
	}
	for _, h := range dispatcherOnly {
		if strings.EqualFold(name, h) {
			return true
		}
	}
	if !tenant {
		return false
	}
	for _, h := range tenantSet {
		if strings.EqualFold(name, h) {
			return true
		}
	}
	return false
}

// tenantSet: what a dispatcher sets on a tenant request from its key.
var tenantSet = [...]string{HdrTenant, HdrBand, HdrWeight, HdrMaxQueue}

var dispatcherOnly = [...]string{HdrBounce, HdrAttempt, HdrWorker, HdrAdapterBase, HdrAdapterPath,
	HdrKeyID, HdrReserved, HdrWindow, HdrCancelToken, HdrPrefixCached, HdrPrefillWorker}

// FormatPrefixCached writes the HdrPrefixCached value: cached of total bytes.
// One allocation (the string): a dispatcher writes it on every request it
// routes by prefix.
func FormatPrefixCached(cached, total int) string {
	var buf [41]byte
	b := strconv.AppendInt(buf[:0], int64(cached), 10)
	b = append(b, '/')
	return string(strconv.AppendInt(b, int64(total), 10))
}

// ParsePrefixCached reads a HdrPrefixCached value; ok is false unless it is
// "<cached>/<total>" with 0 <= cached <= total and total > 0.
func ParsePrefixCached(v string) (cached, total int, ok bool) {
	c, t, found := strings.Cut(v, "/")
	if !found {
		return 0, 0, false
	}
	cached, err1 := strconv.Atoi(c)
	total, err2 := strconv.Atoi(t)
	if err1 != nil || err2 != nil || cached < 0 || total <= 0 || cached > total {
		return 0, 0, false
	}
	return cached, total, true
}

// Kind is the OpenAI (or vLLM) endpoint a request is for.
type Kind string

const (
	KindChat       Kind = "chat"       // POST /v1/chat/completions
	KindCompletion Kind = "completion" // POST /v1/completions
	KindEmbedding  Kind = "embedding"  // POST /v1/embeddings
	KindTokenize   Kind = "tokenize"   // POST /tokenize (vLLM's)
	KindDetokenize Kind = "detokenize" // POST /detokenize (vLLM's)
)

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool {
	switch k {
	case KindChat, KindCompletion, KindEmbedding, KindTokenize, KindDetokenize:
		return true
	}
	return false
}

// Generates reports whether requests of kind k generate tokens (chat and
// completion): only they stream, take max_tokens and n, and can be
// continued on another worker. The other kinds answer with one JSON object.
func (k Kind) Generates() bool { return k == KindChat || k == KindCompletion }

// MaxRequestIDLen caps request ids accepted from clients.
const MaxRequestIDLen = 128

// ValidRequestID reports whether id is acceptable as a request id: 1 to
// MaxRequestIDLen bytes of letters, digits and "-_.:".
func ValidRequestID(id string) bool {
	if id == "" || len(id) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(tokenSafe(c) || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// FormatDeadline writes t as the HdrDeadline value.
func FormatDeadline(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// ParseDeadline reads a HdrDeadline value; the zero time means none.
func ParseDeadline(v string) time.Time {
	if v == "" {
		return time.Time{}
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// ParsePriority reads a HdrPriority value; anything unparsable is 0.
func ParsePriority(v string) int {
	if v == "" { // the usual case; Atoi would allocate its error
		return 0
	}
	p, err := strconv.Atoi(v)
	if err != nil {
		return 0
	}
	return p
}

// MaxExclude bounds a HdrExclude value a dispatcher reads (bytes): a longer
// one is ignored, so no client makes routing scan a long list.
const MaxExclude = 1024

// ExcludeHas reports whether the comma-separated worker list names id. It
// does not allocate: dispatchers call it for every candidate worker.
func ExcludeHas(list, id string) bool {
	for list != "" {
		item := list
		if i := strings.IndexByte(list, ','); i >= 0 {
			item, list = list[:i], list[i+1:]
		} else {
			list = ""
		}
		if item == id && id != "" {
			return true
		}
	}
	return false
}
