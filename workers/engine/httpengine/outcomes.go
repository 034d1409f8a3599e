package httpengine

import (
	"io"
	"net/http"
	"sync/atomic"
)

// outcomes is what real traffic says about the server's health, read and
// reset by the health loop each HealthInterval: a server that answers
// requests or streams bytes is alive, however slow its health path is.
type outcomes struct {
	started atomic.Bool // a request was sent
	served  atomic.Bool // a response arrived, or bytes of one (any status: a 4xx is an answer)
	failed  atomic.Bool // a request got no response (refused, reset), not by its caller's doing
}

// watchTransport records the outcome of every request but the probes (which
// use the bare transport): one atomic load per body read, a store only when
// the flag was reset.
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
	t.o.served.Store(true)
	resp.Body = &watchBody{ReadCloser: resp.Body, o: t.o}
	return resp, nil
}

// watchBody marks the server alive while a long stream flows.
type watchBody struct {
	io.ReadCloser
	o *outcomes
}

func (b *watchBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && !b.o.served.Load() {
		b.o.served.Store(true)
	}
	return n, err
}
