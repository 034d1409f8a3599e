package schemas

import "encoding/json"

// Heartbeat is published by every worker on HeartbeatSubject every second and
// whenever its state changes. A worker whose heartbeats stop for three
// intervals is gone.
type Heartbeat struct {
	Worker         string   `json:"worker"`
	Models         []string `json:"models"`             // models served, base models and loaded adapters
	Adapters       []string `json:"adapters,omitempty"` // the LoRA adapters among Models
	MaxLoras       int      `json:"max_loras,omitempty"`
	MaxConcurrency int      `json:"max_concurrency"` // the worker's admission cap
	Running        int      `json:"running"`         // requests admitted and not finished
	Waiting        int      `json:"waiting"`         // requests the engine has queued (part of Running)
	KVCacheUsage   float64  `json:"kv_cache_usage"`  // 0..1
	// KVCacheTokens is the engine's KV cache size in tokens (blocks × block
	// size), 0 when unknown: dispatchers size their record of what each
	// worker's prefix cache holds by it.
	KVCacheTokens int    `json:"kv_cache_tokens,omitempty"`
	Draining      bool   `json:"draining,omitempty"`
	Healthy       bool   `json:"healthy"`
	Engine        string `json:"engine"`
	Version       string `json:"version"`
	IntervalMS    int    `json:"interval_ms"`
	Seq           uint64 `json:"seq"`

	// Loading lists the LoRA adapters the worker is loading now (not yet in
	// Adapters), so that every dispatcher sends the next requests for one to
	// the worker already loading it rather than start a load elsewhere.
	Loading []string `json:"loading,omitempty"`
	// InUse lists the LoRA adapters a request runs on or waits for: the
	// worker evicts none of them, so a dispatcher sends no load there that
	// would need one evicted (besides those it routed a request for there
	// lately: fleet.Fleet's AdapterBusyFor). Absent from workers older than
	// the field.
	InUse []string `json:"in_use,omitempty"`

	// MaxModelLen is the context length (prompt + completion, in tokens) of
	// each base model, as the engine reports it (vLLM's max_model_len, the
	// sim's configured context); a model the engine says nothing of is left
	// out. Gateways show it in /v1/models.
	MaxModelLen map[string]int `json:"max_model_len,omitempty"`

	// Capacity on demand (docs/capacity.md).
	//
	// Sleeping: the engine is asleep (vLLM sleep mode level 1: weights in
	// CPU memory, KV cache freed) after --sleep-after of idleness; the next
	// request wakes it first. Dispatchers prefer awake workers and count a
	// sleeping one as capacity a wake-up away. WakeMS is the last wake-up's
	// duration (0: none measured yet).
	Sleeping bool `json:"sleeping,omitempty"`
	WakeMS   int  `json:"wake_ms,omitempty"`
	// CanServe lists every model this worker can switch to, loaded or not
	// (a worker started with several models, one loaded at a time); empty
	// for a worker of fixed models. Switching names the model it is
	// switching to: it takes no new requests for its old models meanwhile
	// (they wait in the dispatchers' queues) and serves the new one once
	// its next heartbeat lists it in Models. LoadedAt (Unix ms) is when the
	// models it serves now were loaded: dispatchers read the worker's
	// hysteresis from it (HoldMS: how long a model stays loaded at least
	// before the worker accepts a switch away from it).
	CanServe  []string `json:"can_serve,omitempty"`
	Switching string   `json:"switching,omitempty"`
	LoadedAt  int64    `json:"loaded_at,omitempty"`
	HoldMS    int      `json:"hold_ms,omitempty"`

	// Role is the worker's part in prefill/decode disaggregation
	// (docs/disaggregation.md): RolePrefill workers run only the prefills
	// of disaggregated requests, RoleDecode workers take requests as every
	// worker does, prefilled elsewhere when a dispatcher so decides; ""
	// (RoleBoth) is a worker of neither pool, which takes every request
	// whole.
	Role string `json:"role,omitempty"`
}

// Worker roles (Heartbeat.Role).
const (
	RoleBoth    = ""
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// ParseRole reads a role as flags spell it: prefill, decode or both.
func ParseRole(s string) (string, bool) {
	switch s {
	case "both", "":
		return RoleBoth, true
	case RolePrefill, RoleDecode:
		return s, true
	}
	return "", false
}

// DoneNotice is published on DoneSubject when a worker finishes a request, so
// dispatchers free its capacity at once instead of at the next heartbeat.
type DoneNotice struct {
	Worker    string `json:"worker"`
	RequestID string `json:"request_id"`
	Running   int    `json:"running"` // the worker's running count after this request left
	// Failed: the request ended without its done frame (an error, a
	// cancel, a broken engine stream). A dispatcher lets a tenant's request
	// sent again after it in on its first admission (counted once).
	Failed bool `json:"failed,omitempty"`
	// PromptTokens and CompletionTokens: the usage of a request that
	// completed (0 when unknown): the dispatcher that sent it settles its
	// tenant's fair-share charge with the real cost (docs/scheduling.md).
	PromptTokens     int `json:"prompt_tokens,omitempty"`
	CompletionTokens int `json:"completion_tokens,omitempty"`
	// PrefillMS: admission to the first chunk of a stream (0: none sent);
	// HeldMS: admission to the end. The engine time the request held its
	// slot, split in prefill and decode: the real cost in flow control.
	PrefillMS float64 `json:"prefill_ms,omitempty"`
	HeldMS    float64 `json:"held_ms,omitempty"`
}

// FlowDemand is what a dispatcher announces on FlowsSubject while it has
// requests queued (and once more when it has none): by model, by band name,
// the tenants it holds queued requests of, with their weights. Tenants are
// "" for requests with none.
type FlowDemand struct {
	Dispatcher string                                   `json:"dispatcher"`
	Models     map[string]map[string]map[string]float64 `json:"models"`
}

// Control operations on CtlSubject; request and reply bodies are JSON.
const (
	CtlPing          = "ping"           // {} -> CtlReply: the worker id is taken
	CtlDrain         = "drain"          // {} -> CtlReply
	CtlLoadAdapter   = "load_adapter"   // AdapterRequest -> CtlReply
	CtlUnloadAdapter = "unload_adapter" // AdapterRequest -> CtlReply
	CtlSwitch        = "switch"         // SwitchRequest -> CtlReply (docs/capacity.md)
)

// SwitchRequest asks a worker that can serve several models (Heartbeat
// CanServe) to load Model in place of what it serves now: it stops taking
// requests for the old model, lets those running finish, then switches. A
// worker refuses (CtlReply with an error) a model it cannot serve, or a
// switch away from a model loaded less than its hold time ago; it accepts a
// switch to the model it serves or is switching to already, doing nothing.
type SwitchRequest struct {
	Model      string `json:"model"`
	Dispatcher string `json:"dispatcher,omitempty"` // who asked, for logs
}

// Demand is what a dispatcher publishes on DemandSubject(model) while it
// holds requests for a model that no live worker serves (a cold start: an
// autoscaler or an operator's script starts a worker on it): at once when
// the first such request arrives, then every second while any waits, and
// once more with Waiting 0 when none does.
type Demand struct {
	Model      string `json:"model"`
	Dispatcher string `json:"dispatcher"`
	Waiting    int    `json:"waiting"`              // requests held here for the model
	OldestMS   int64  `json:"oldest_ms"`            // how long the oldest of them has waited
	Switchable int    `json:"switchable,omitempty"` // live workers that could switch to the model
	Sleeping   int    `json:"sleeping,omitempty"`   // live workers of the model asleep
}

// AdapterRequest asks a worker to load or unload a LoRA adapter.
type AdapterRequest struct {
	Name string `json:"name"`
	Base string `json:"base,omitempty"`
	Path string `json:"path,omitempty"`
}

// CtlReply answers a control request; Error is nil on success.
type CtlReply struct {
	OK    bool   `json:"ok"`
	Error *Error `json:"error,omitempty"`
}

// ReadCtlReply reads worker's answer to the control request op: nil when
// it was done, else the worker's error (bad_worker_reply for an answer that
// is no CtlReply).
func ReadCtlReply(data []byte, worker, op string) *Error {
	var r CtlReply
	if err := json.Unmarshal(data, &r); err != nil {
		return ErrBadWorkerReply.New(worker, op)
	}
	if r.OK {
		return nil
	}
	if r.Error == nil {
		return ErrInternal.New("the worker " + worker + " refused " + op)
	}
	return r.Error
}

// Model is an entry of OpenAI's (and vLLM's) model list.
type Model struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"` // "model"
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root,omitempty"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len,omitempty"`
}
