package httpengine

import (
	"io"
	"net/http"
	"sync/atomic"
)

// outcomes is what generation requests say about the server's health, read
// and reset by the health loop each HealthInterval: a server that answers
// them or streams bytes is alive, however slow its health path is.
type outcomes struct {
	started atomic.Bool // a request was sent
	served  atomic.Bool // a response below 500 arrived (a 4xx is an answer), or bytes of one
	failed  atomic.Bool // a request got no response (refused, reset), not by its caller's doing
}

// watchTransport records the outcome of generation requests (probes and
// control calls use the bare transport): one atomic load per body read, a
// store only when the flag was reset.
type watchTransport struct {
	rt http.RoundTripper
	o  *outcomes
}

func (t *watchTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.o.started.Store(true)
	resp, err := t.rt.RoundTrip(r)
	if err != nil {
		if r.Context().Err() == nil {
			t.o.failed.Store(true)
		}
		return resp, err
	}
	if resp.StatusCode < 500 {
		t.o.served.Store(true)
	}
	resp.Body = &watchBody{ReadCloser: resp.Body, o: t.o}
	return resp, nil
}

// watchBody marks the server alive while a long stream flows.
type watchBody struct {
	io.ReadCloser
	o *outcomes
}

func (b *watchBody) endBuffered() bool {
	e, ok := b.ReadCloser.(endBuffered)
	return ok && e.endBuffered()
}

func (b *watchBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && !b.o.served.Load() {
		b.o.served.Store(true)
	}
	return n, err
}
