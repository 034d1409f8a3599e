package enginetest

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

var kinds = []schemas.Kind{schemas.KindChat, schemas.KindCompletion}

var lastID atomic.Uint64

// body is a valid request body of kind for model with members (JSON object
// members, "" for none) added.
func body(kind schemas.Kind, model, members string) string {
	b := fmt.Sprintf(`{"model":%q,`, model)
	if kind == schemas.KindChat {
		b += `"messages":[{"role":"user","content":"Say something."}]`
	} else {
		b += `"prompt":"Say something."`
	}
	if members != "" {
		b += "," + members
	}
	return b + "}"
}

// request is a request as the worker hands it to an engine: a fresh id, the
// model named in the body and in Model, the body read into View.
func request(t *testing.T, kind schemas.Kind, model, members string) *engine.Request {
	t.Helper()
	req := rawRequest(kind, model, body(kind, model, members))
	view, err := schemas.ReadRequest(kind, req.Body, model)
	if err != nil {
		t.Fatalf("enginetest: a request the suite makes is refused: %v\n%s", err, req.Body)
	}
	req.View = view
	return req
}

// rawRequest is a request with no View, as from a caller that did not read
// the body: the engine reads it itself.
func rawRequest(kind schemas.Kind, model, body string) *engine.Request {
	return &engine.Request{ID: fmt.Sprintf("enginetest-%d", lastID.Add(1)), Kind: kind, Model: model, Body: []byte(body)}
}
