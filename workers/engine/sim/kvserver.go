package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// The KV-transfer endpoint: where a decode engine takes the blocks a
// prefill engine holds for it, standing for NIXL's read and notification
// (one round trip: the answer is the blocks, read). It is HTTP on a TCP
// listener of Config.KVTransferAddr, opened at the engine's first prefill
// for a remote decode and closed with the engine, so a decode engine in
// another process really reaches the prefill engine, and finds it gone when
// it is:
//
//	POST /v1/kv/pull {"engine_id", "request_id", "block_ids": [...], "prompt_tokens", "prompt_hash"}
//	200 {"tokens": N, "blocks": M}    the blocks are the decode's: freed here
//	404 {"error": "..."}             no such hold: never held, taken already, expired
//	409 {"error": "..."}             another engine id (this engine restarted), other blocks, another prompt
//
// A refusal leaves the hold as it was (the right decode may still come).

const kvPullPath = "/v1/kv/pull"

type pullRequest struct {
	EngineID     string  `json:"engine_id"`
	RequestID    string  `json:"request_id,omitempty"`
	BlockIDs     []int64 `json:"block_ids"`
	PromptTokens int     `json:"prompt_tokens"`
	PromptHash   string  `json:"prompt_hash"`
}

type pullAnswer struct {
	Tokens int    `json:"tokens,omitempty"`
	Blocks int    `json:"blocks,omitempty"`
	Error  string `json:"error,omitempty"`
}

func newPullClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil, // engines talk directly
		DialContext:         (&net.Dialer{Timeout: kvPullTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}}
}

// endpoint is the address decode engines pull from, listened on at the
// first call.
func (x *kvTransfer) endpoint(addr string, h http.HandlerFunc) (string, int, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case x.closed:
		return "", 0, errClosedEngine()
	case x.ln != nil:
		return x.host, x.port, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", 0, errKVEndpoint(addr, err)
	}
	a := ln.Addr().(*net.TCPAddr)
	host := a.IP.String()
	if a.IP.IsUnspecified() {
		// Bound to every interface: decode engines elsewhere reach it by
		// the host's name.
		if host, err = os.Hostname(); err != nil || host == "" {
			host = "127.0.0.1"
		}
	}
	x.ln, x.host, x.port = ln, host, a.Port
	x.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	go func() { _ = x.srv.Serve(ln) }()
	return x.host, x.port, nil
}

// servePull is the endpoint's handler.
func (e *Engine) servePull(w http.ResponseWriter, r *http.Request) {
	answer := func(status int, a pullAnswer) {
		b, _ := json.Marshal(a)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(b)
	}
	if r.URL.Path != kvPullPath || r.Method != http.MethodPost {
		answer(http.StatusNotFound, pullAnswer{Error: "no such route"})
		return
	}
	var q pullRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&q); err != nil {
		e.kvx.mRefused.Add(1)
		answer(http.StatusBadRequest, pullAnswer{Error: "bad pull request: " + err.Error()})
		return
	}
	tokens, blocks, status, reason := e.kvx.take(&q)
	if status != http.StatusOK {
		e.kvx.mRefused.Add(1)
		answer(status, pullAnswer{Error: reason})
		return
	}
	e.signal() // the scheduler frees the blocks
	answer(http.StatusOK, pullAnswer{Tokens: tokens, Blocks: blocks})
}

// take hands the hold q names to a decode engine, or says why not.
func (x *kvTransfer) take(q *pullRequest) (tokens, blocks, status int, reason string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if q.EngineID != x.id {
		return 0, 0, http.StatusConflict, fmt.Sprintf("engine id %q is not this engine's (%s): the engine that prefilled it restarted", q.EngineID, x.id)
	}
	h := x.held[q.RequestID]
	if h == nil && q.RequestID == "" { // params without remote_request_id (vLLM before it): find the blocks
		for _, c := range x.held {
			if sameBlocks(c.blocks, q.BlockIDs) {
				h = c
				break
			}
		}
	}
	switch {
	case h == nil && q.RequestID != "" && x.expired.has(q.RequestID):
		return 0, 0, http.StatusNotFound, fmt.Sprintf("the KV blocks of %s expired or were dropped before the pull", q.RequestID)
	case h == nil:
		return 0, 0, http.StatusNotFound, fmt.Sprintf("no KV blocks held for %q (%d blocks): taken already, expired or never held",
			schemas.Clip(q.RequestID, schemas.MaxQuoted), len(q.BlockIDs))
	case !sameBlocks(h.blocks, q.BlockIDs):
		return 0, 0, http.StatusConflict, fmt.Sprintf("the %d blocks asked for are not those held for %s (%d blocks)", len(q.BlockIDs), h.id, len(h.blocks))
	case q.PromptTokens != h.prompt || q.PromptHash != promptHashText(h.hash):
		return 0, 0, http.StatusConflict, fmt.Sprintf("the prompt (%d tokens) is not the one prefilled for %s (%d tokens, or another model)",
			q.PromptTokens, h.id, h.prompt)
	}
	x.release(h)
	x.mPulls.Add(1)
	return h.tokens, len(h.blocks), http.StatusOK, ""
}

func errClosedEngine() error { return schemas.ErrShuttingDown.New("sim engine") }

func errKVEndpoint(addr string, err error) error {
	return schemas.ErrEngineUnhealthy.New("sim", "this worker", fmt.Sprintf("no KV-transfer endpoint on %s: %v", addr, err))
}

func sameBlocks(held []int32, ids []int64) bool {
	return slices.EqualFunc(held, ids, func(a int32, b int64) bool { return int64(a) == b })
}

func promptHashText(h uint64) string { return fmt.Sprintf("%016x", h) }

// pull asks the prefill engine p names for its blocks: the tokens they hold.
func (x *kvTransfer) pull(ctx context.Context, p *transferParams, promptTokens int, hash uint64) (int, error) {
	body, _ := json.Marshal(pullRequest{EngineID: p.engineID, RequestID: p.requestID, BlockIDs: p.blocks,
		PromptTokens: promptTokens, PromptHash: promptHashText(hash)})
	addr := net.JoinHostPort(p.host, strconv.Itoa(p.port))
	tctx, cancel := context.WithTimeout(ctx, kvPullTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(tctx, http.MethodPost, "http://"+addr+kvPullPath, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("no pull to %s: %v", addr, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := x.client.Do(req)
	if err != nil {
		if ctx.Err() == nil && tctx.Err() != nil {
			return 0, fmt.Errorf("no answer from %s within %s", addr, kvPullTimeout)
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return 0, fmt.Errorf("cannot reach it at %s: %v", addr, err)
	}
	defer resp.Body.Close()
	var a pullAnswer
	derr := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&a)
	switch {
	case resp.StatusCode != http.StatusOK && a.Error != "":
		return 0, errors.New(schemas.Clip(a.Error, 2*schemas.MaxQuoted)) // a peer's words: bounded
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Errorf("%s answered %s", addr, resp.Status)
	case derr != nil:
		return 0, fmt.Errorf("unreadable answer from %s: %v", addr, derr)
	}
	return a.Tokens, nil
}
