package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// Prefill/decode disaggregation: the sim speaks vLLM's KV-transfer
// handshake, as vLLM with the NixlConnector and its disaggregated-serving
// proxy (engine.KVTransferer, docs/disaggregation.md).
//
// A prefill: a request whose "kv_transfer_params" has "do_remote_decode":
// true (and "stream": false; the proxy also sets "max_tokens": 1) runs as
// any other, and when its first sequence ends by its length (vLLM:
// FINISHED_LENGTH_CAPPED) the KV blocks of that sequence are not freed but
// held for a decode engine, and the answer says where, at the top level:
//
//	"kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
//	    "remote_block_ids": [0, 1, 2], "remote_engine_id": "<this engine's id>",
//	    "remote_request_id": "<the hold's id>", "remote_host": "127.0.0.1",
//	    "remote_port": 40123, "tp_size": 1}
//
// (vLLM's members and order; remote_request_id is the newer vLLM's, the
// key of the hold). A prefill that ends otherwise (a stop on its first
// token, an abort) holds nothing and answers "kv_transfer_params": null.
// Held blocks count in the KV cache's use and cannot be evicted, until a
// decode engine takes them or Config.KVHoldTime passes (then they are freed
// and counted as expired, vllm:nixl_num_kv_expired_reqs).
//
// A decode: a request whose params have "do_remote_prefill": true with
// remote_engine_id, remote_block_ids, remote_host and remote_port asks the
// prefill engine for its blocks (kvserver.go: one HTTP request to
// remote_host:remote_port naming the engine id, the hold, the blocks and
// the prompt). The prefill engine answers and frees them, or refuses: blocks
// it does not hold (never, pulled already, expired), another engine id (it
// restarted: ids are new at every start), another prompt. A refusal, an
// engine that cannot be reached, or no answer within kvPullTimeout fails
// the request with schemas.ErrKVTransferFailed before anything is streamed
// (vLLM's default would prefill locally instead: the worker does that,
// knowing why). Taken, the request waits KVTransferBase +
// KVTransferPerToken × tokens outside the scheduler loop (vLLM's
// WAITING_FOR_REMOTE_KVS: the running batch is not stalled), counted as
// waiting, then is queued with its prompt already computed: its
// admission allocates the prompt's blocks here (and registers them in the
// prefix cache, as vLLM caches received blocks) but prefills nothing, so
// its first step is a decode step for the cost model (DecodeBase, not
// PrefillBase). Its usage counts the prompt as usual, with the
// transferred tokens as prompt_tokens_details.cached_tokens (vLLM reports
// remotely computed tokens as cached). Params without those members are
// ignored, as vLLM ignores them: the request prefills here.
//
// Simplifications: the decode side allocates its blocks when admitted,
// after the transfer (vLLM allocates them before and writes into them); the
// transfer time counts the whole prompt even when part of it is in the
// decode engine's own prefix cache (vLLM reads only the blocks it lacks);
// the prefill frees its blocks when it answers the pull, not when the read
// ends. Only the first prompt of a request and the first sequence of a
// prefill are transferred (vLLM's proxy sends one prompt, n = 1).

const (
	// DefaultKVHoldTime is Config.KVHoldTime's default.
	DefaultKVHoldTime = 30 * time.Second
	// DefaultKVTransferAddr is Config.KVTransferAddr's default: loopback, any port.
	DefaultKVTransferAddr = "127.0.0.1:0"
)

// kvPullTimeout bounds a decode's request for the blocks (a variable for tests).
var kvPullTimeout = 5 * time.Second

// checkKVTransfer fills the KV-transfer defaults and checks the address.
func checkKVTransfer(cfg *Config) error {
	if cfg.KVHoldTime == 0 {
		cfg.KVHoldTime = DefaultKVHoldTime
	}
	if cfg.KVTransferAddr == "" {
		cfg.KVTransferAddr = DefaultKVTransferAddr
	}
	if _, _, err := net.SplitHostPort(cfg.KVTransferAddr); err != nil {
		return fmt.Errorf("sim: KVTransferAddr %q: %v", cfg.KVTransferAddr, err)
	}
	return nil
}

// KVTransfer is engine.KVTransferer: the sim always speaks the handshake.
func (e *Engine) KVTransfer() bool { return true }

// EngineID is the engine's remote_engine_id, new at every New.
func (e *Engine) EngineID() string { return e.kvx.id }

// KVTransferStats is the engine's part in the KV-transfer handshake:
// cumulative counts and what it holds now.
type KVTransferStats struct {
	EngineID string // remote_engine_id in its prefills' answers
	Addr     string // where it serves held blocks (host:port); "" until its first prefill

	// Prefill side.
	Prefills     uint64 // prefills answered with kv_transfer_params (blocks held)
	Pulls        uint64 // holds taken by a decode engine
	PullsRefused uint64 // pulls refused: no such hold (expired, taken, never), another engine id, another prompt
	Expired      uint64 // holds freed after KVHoldTime with no pull (vllm:nixl_num_kv_expired_reqs)
	HeldRequests int    // holds now
	HeldBlocks   int    // KV blocks held now for decode engines

	// Decode side.
	RemotePrefills uint64 // requests that took a remote prefill's blocks
	Failed         uint64 // requests that could not (schemas.ErrKVTransferFailed; vllm:nixl_num_failed_transfers)
	// TransferredTokens are prompt tokens taken from remote prefills and
	// not found in the local prefix cache (vLLM's
	// prompt_tokens_by_source{source="external_kv_transfer"}).
	TransferredTokens uint64
}

// KVTransferStats returns the counts of the KV-transfer handshake.
func (e *Engine) KVTransferStats() KVTransferStats {
	x := &e.kvx
	x.mu.Lock()
	addr := ""
	if x.ln != nil {
		addr = net.JoinHostPort(x.host, strconv.Itoa(x.port))
	}
	x.mu.Unlock()
	return KVTransferStats{
		EngineID:          x.id,
		Addr:              addr,
		Prefills:          x.mPrefills.Load(),
		Pulls:             x.mPulls.Load(),
		PullsRefused:      x.mRefused.Load(),
		Expired:           x.mExpired.Load(),
		HeldRequests:      int(x.nHeld.Load()),
		HeldBlocks:        int(x.nHeldBlocks.Load()),
		RemotePrefills:    x.mRemote.Load(),
		Failed:            x.mFailed.Load(),
		TransferredTokens: x.mXferTokens.Load(),
	}
}

// kvTransfer is an engine's state of the handshake.
type kvTransfer struct {
	id     string
	client *http.Client // a decode's pulls

	mu      sync.Mutex
	ln      net.Listener // the endpoint of held blocks (kvserver.go), from the first prefill
	srv     *http.Server
	host    string
	port    int
	closed  bool
	held    map[string]*heldKV // by remote_request_id
	expired recentIDs          // holds expired lately, for a better refusal
	// free are the block tables of holds taken or expired: the scheduler
	// releases them (hasFree says there are some).
	free    [][]int32
	hasFree atomic.Bool

	nHeld, nHeldBlocks                    atomic.Int64
	seq                                   atomic.Uint64 // hold ids
	mPrefills, mPulls, mRefused, mExpired atomic.Uint64
	mRemote, mFailed, mXferTokens         atomic.Uint64
}

// heldKV is one prefill's blocks, held for a decode engine.
type heldKV struct {
	id     string
	blocks []int32
	tokens int    // tokens the blocks hold: the prompt (and tokens generated but the last)
	prompt int    // prompt tokens
	hash   uint64 // the prompt's (model included): a decode must name the same
	timer  *time.Timer
}

func (x *kvTransfer) init() {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	x.id = h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:] // a UUID's form, as vLLM's engine ids
	x.held = map[string]*heldKV{}
	x.client = newPullClient()
}

// close refuses pulls from now on: the endpoint goes (a decode engine
// finds its port closed, as a vLLM that is gone).
func (x *kvTransfer) close() {
	x.mu.Lock()
	x.closed = true
	srv, ln := x.srv, x.ln
	x.mu.Unlock()
	if ln != nil {
		_ = ln.Close() // now, not when the server's goroutine gets to it
	}
	x.dropHolds() // the scheduler frees nothing more
	if srv != nil {
		_ = srv.Close()
	}
	x.client.CloseIdleConnections()
}

// transferParams is what the sim reads of a request's kv_transfer_params.
type transferParams struct {
	remoteDecode, remotePrefill bool
	engineID, requestID, host   string
	port                        int
	blocks                      []int64
}

// pullable: the params name blocks to take and where (vLLM ignores params
// without these members, with a warning, and prefills).
func (p *transferParams) pullable() bool {
	return p.remotePrefill && p.engineID != "" && len(p.blocks) > 0 && p.host != "" && p.port > 0
}

// parseTransferParams reads the members the sim uses; any other is
// tolerated. A member of the wrong type is a 400 naming it.
func parseTransferParams(raw []byte) (*transferParams, *schemas.Error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, schemas.ErrInvalidValue.At("kv_transfer_params", "kv_transfer_params", err.Error())
	}
	p := &transferParams{}
	bad := func(member, want string) *schemas.Error {
		name := "kv_transfer_params." + member
		return schemas.ErrInvalidType.At(name, name, want, jsonKind(m[member]))
	}
	var ok bool
	if p.remoteDecode, ok = rawBool(m["do_remote_decode"]); !ok {
		return nil, bad("do_remote_decode", "a boolean")
	}
	if p.remotePrefill, ok = rawBool(m["do_remote_prefill"]); !ok {
		return nil, bad("do_remote_prefill", "a boolean")
	}
	for _, f := range []struct {
		member string
		v      *string
	}{{"remote_engine_id", &p.engineID}, {"remote_request_id", &p.requestID}, {"remote_host", &p.host}} {
		if *f.v, ok = rawText(m[f.member]); !ok {
			return nil, bad(f.member, "a string")
		}
	}
	port, ok := rawText(m["remote_port"])
	if ok && port != "" {
		n, err := strconv.Atoi(port)
		p.port, ok = n, err == nil && n > 0 && n < 1<<16
	}
	if !ok {
		return nil, bad("remote_port", "a port number")
	}
	if p.blocks, ok = rawBlockIDs(m["remote_block_ids"]); !ok {
		return nil, bad("remote_block_ids", "a list of block ids")
	}
	return p, nil
}

func isNull(r json.RawMessage) bool { return len(r) == 0 || string(r) == "null" }

// rawBool reads a boolean member; absent or null is false.
func rawBool(r json.RawMessage) (bool, bool) {
	switch {
	case isNull(r):
		return false, true
	case string(r) == "true":
		return true, true
	case string(r) == "false":
		return false, true
	}
	return false, false
}

// rawText reads a string or a number as text; absent or null is "".
func rawText(r json.RawMessage) (string, bool) {
	if isNull(r) {
		return "", true
	}
	if r[0] == '"' {
		var s string
		err := json.Unmarshal(r, &s)
		return s, err == nil
	}
	var n json.Number
	if json.Unmarshal(r, &n) == nil {
		return n.String(), true
	}
	return "", false
}

// rawBlockIDs reads remote_block_ids: a list of ids (vLLM up to 0.11), or a
// list of lists, one per KV cache group (later vLLM), flattened.
func rawBlockIDs(r json.RawMessage) ([]int64, bool) {
	if isNull(r) {
		return nil, true
	}
	var flat []int64
	if json.Unmarshal(r, &flat) == nil {
		return flat, true
	}
	var groups [][]int64
	if json.Unmarshal(r, &groups) != nil {
		return nil, false
	}
	flat = nil
	for _, g := range groups {
		flat = append(flat, g...)
	}
	return flat, true
}

func jsonKind(r json.RawMessage) string {
	if isNull(r) {
		return "null"
	}
	switch r[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

// requestKV is a request's part in the handshake.
type requestKV struct {
	held       *heldKV // the hold, once made
	host       string  // where it is served
	port       int
	pull       *transferParams // a remote prefill's blocks to take
	promptHash uint64          // the first prompt's, with the model's root
}

// readTransfer sets what r does of the handshake: hold its blocks at the
// end (a prefill for a remote decode; not for a stream, whose answer could
// not say where), take a remote prefill's (r.kv.pull), both or neither.
// root is the prompt's block hash root (the model's).
func (r *request) readTransfer(raw []byte, root uint64) *schemas.Error {
	p, err := parseTransferParams(raw)
	if err != nil {
		return err
	}
	r.hold = p.remoteDecode && !r.stream
	if !r.hold && !p.pullable() {
		return nil
	}
	r.kv = &requestKV{promptHash: schemas.TokenBlockHash(root, r.prompts[0].ids)}
	if p.pullable() {
		r.kv.pull = p
	}
	return nil
}

// beginTransfer does, before r is queued, what it needs of the handshake:
// the endpoint that will serve its blocks, the blocks of its remote prefill.
func (e *Engine) beginTransfer(ctx context.Context, r *request) error {
	if r.hold {
		host, port, err := e.kvx.endpoint(e.cfg.KVTransferAddr, e.servePull)
		if err != nil {
			return err
		}
		r.kv.host, r.kv.port = host, port
	}
	if r.kv.pull != nil {
		return e.pullKV(ctx, r)
	}
	return nil
}

// pullKV takes the blocks of r's remote prefill, then waits for their
// transfer; meanwhile r counts as waiting (vLLM's WAITING_FOR_REMOTE_KVS).
func (e *Engine) pullKV(ctx context.Context, r *request) error {
	p := r.kv.pull
	if !e.kvPeer(p.host) {
		e.kvx.mFailed.Add(1)
		return schemas.ErrKVTransferFailed.New("sim", schemas.Clip(p.engineID, schemas.MaxQuoted),
			fmt.Sprintf("remote_host %q is not a KV-transfer peer of this engine (loopback, or --sim-kv-transfer-peers)",
				schemas.Clip(p.host, schemas.MaxQuoted)))
	}
	n := int64(len(r.seqs))
	e.nWaiting.Add(n)
	defer e.nWaiting.Add(-n) // Generate counts them again when it queues them
	prompt := len(r.prompts[0].ids)
	tokens, err := e.kvx.pull(ctx, p, prompt, r.kv.promptHash)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		e.kvx.mFailed.Add(1)
		return schemas.ErrKVTransferFailed.New("sim", schemas.Clip(p.engineID, schemas.MaxQuoted), err)
	}
	tokens = min(tokens, prompt)
	if err := e.pause(ctx, e.cfg.KVTransferBase+time.Duration(tokens)*e.cfg.KVTransferPerToken); err != nil {
		return err
	}
	for i := 0; i < r.n; i++ { // the first prompt's sequences
		r.seqs[i].xfer = int32(tokens)
	}
	e.kvx.mRemote.Add(1)
	return nil
}

// holdKV ends a prefill for a remote decode, from finishRequest: its first
// sequence's blocks (kept by drop) are held, or freed when it did not end
// by its length or failed.
func (e *Engine) holdKV(r *request) {
	s := &r.seqs[0]
	if r.err != nil || s.finish != "length" || len(s.blocks) == 0 {
		s.blocks = e.kv.releaseAll(s.blocks)
		return
	}
	h := &heldKV{
		id:     r.id + "-" + strconv.FormatUint(e.kvx.seq.Add(1), 16),
		blocks: s.blocks,
		tokens: s.computed,
		prompt: len(s.prompt.ids),
		hash:   r.kv.promptHash,
	}
	if !e.kvx.add(h, e.cfg.KVHoldTime, e.signal) {
		s.blocks = e.kv.releaseAll(s.blocks) // closing
		return
	}
	s.blocks = nil
	r.kv.held = h
}

// add holds h for d; false once closed.
func (x *kvTransfer) add(h *heldKV, d time.Duration, wake func()) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return false
	}
	x.held[h.id] = h
	x.nHeld.Add(1)
	x.nHeldBlocks.Add(int64(len(h.blocks)))
	x.mPrefills.Add(1)
	h.timer = time.AfterFunc(d, func() { x.expire(h, wake) })
	return true
}

// expire frees h if no decode took it.
func (x *kvTransfer) expire(h *heldKV, wake func()) {
	x.mu.Lock()
	if x.held[h.id] != h {
		x.mu.Unlock()
		return
	}
	x.release(h)
	x.expired.add(h.id)
	x.mExpired.Add(1)
	x.mu.Unlock()
	wake()
}

// release hands h's blocks to the scheduler; x.mu held.
func (x *kvTransfer) release(h *heldKV) {
	delete(x.held, h.id)
	h.timer.Stop()
	x.nHeld.Add(-1)
	x.nHeldBlocks.Add(-int64(len(h.blocks)))
	x.free = append(x.free, h.blocks)
	x.hasFree.Store(true)
}

// freeHeld releases the blocks of holds taken or expired; scheduler only.
func (e *Engine) freeHeld() {
	x := &e.kvx
	x.mu.Lock()
	free := x.free
	x.free = nil
	x.hasFree.Store(false)
	x.mu.Unlock()
	for _, b := range free {
		e.kv.releaseAll(b)
	}
	e.publishKV()
}

// dropHolds forgets every hold: the KV cache is emptied (a sleep: from
// the scheduler) or the engine closes. A pull then finds nothing.
func (x *kvTransfer) dropHolds() {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, h := range x.held {
		h.timer.Stop()
		x.expired.add(h.id)
	}
	clear(x.held)
	x.free = nil
	x.hasFree.Store(false)
	x.nHeld.Store(0)
	x.nHeldBlocks.Store(0)
}

// appendTransferParams writes a prefill's answer's kv_transfer_params.
func (r *request) appendTransferParams(b []byte) []byte {
	b = append(b, `,"kv_transfer_params":`...)
	h := r.kv.held // kv is set: the request holds
	if h == nil {
		return append(b, "null"...)
	}
	b = append(b, `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[`...)
	for i, id := range h.blocks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	b = append(b, `],"remote_engine_id":`...)
	b = appendString(b, r.e.kvx.id)
	b = append(b, `,"remote_request_id":`...)
	b = appendString(b, h.id)
	b = append(b, `,"remote_host":`...)
	b = appendString(b, r.kv.host)
	b = append(b, `,"remote_port":`...)
	b = strconv.AppendInt(b, int64(r.kv.port), 10)
	return append(b, `,"tp_size":1}`...)
}

// recentIDs remembers the last ids added (a bounded ring).
type recentIDs struct {
	set  map[string]struct{}
	ring []string
	next int
}

const recentExpired = 1024

func (s *recentIDs) add(id string) {
	if s.set == nil {
		s.set = make(map[string]struct{}, recentExpired)
		s.ring = make([]string, recentExpired)
	}
	if old := s.ring[s.next]; old != "" {
		delete(s.set, old)
	}
	s.ring[s.next] = id
	s.set[id] = struct{}{}
	s.next = (s.next + 1) % recentExpired
}

func (s *recentIDs) has(id string) bool {
	_, ok := s.set[id]
	return ok
}

// kvPeer reports whether a decode may pull KV blocks from host: a loopback
// address, "localhost" or this host's name (what a prefill listening on
// 0.0.0.0 advertises), or one of Config.KVPeers.
func (e *Engine) kvPeer(host string) bool {
	if host == "localhost" || slices.Contains(e.cfg.KVPeers, host) {
		return true
	}
	if name, err := os.Hostname(); err == nil && host == name {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
