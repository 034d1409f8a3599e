package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/gateway/httpstream"
	"github.com/tokenbus/tokenbus/schemas"
)

// A stream whose request waits for capacity that is not up (no live worker
// serves its model: a cold start, a wake-up, a model switch; the
// dispatcher's queued frames say cold, docs/capacity.md) may wait minutes
// for its first token. Proxies and clients with read timeouts would cut it,
// so after HoldKeepalive of such a wait the stream commits its 200 and
// sends an SSE comment line every HoldKeepalive until the first token:
// comments are skipped by every SSE parser (the official SDKs among them),
// so the client parses nothing before its first chunk. The price: an error
// after that (the cold-start timeout) comes in-band, as any error after the
// first byte of a stream does. A request queued behind busy workers (not
// cold) keeps waiting in silence, its errors with their real status.

// errHeld: the first frame has not come, and the request is held for
// capacity: begin the stream with comments.
var errHeld = errors.New("held for capacity")

// holdComment is the keep-alive's text.
const holdComment = "waiting for a worker"

// first waits for the first frame of a stream: errHeld once it has waited
// HoldKeepalive held for capacity.
func (x *exchange) first() (schemas.Frame, error) {
	return x.g.firstFrame(x.ctx, x.st)
}

// firstFrame waits for st's first frame; errHeld once it has waited
// HoldKeepalive held for capacity (a chat stream, a Responses stream).
func (g *Gateway) firstFrame(ctx context.Context, st *client.Stream) (schemas.Frame, error) {
	ka := g.cfg.HoldKeepalive
	if ka < 0 {
		return st.Next(ctx)
	}
	for {
		wctx, stop := context.WithTimeout(ctx, ka)
		f, err := st.Next(wctx)
		stop()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return f, err
		}
		if st.HeldForCapacity() {
			return f, errHeld
		}
	}
}

// nextHeld waits for st's next frame, adding an SSE comment to s (flushed)
// every HoldKeepalive meanwhile: a stream begun while held for capacity,
// before its first token.
func (g *Gateway) nextHeld(ctx context.Context, st *client.Stream, s *httpstream.Stream) (schemas.Frame, error) {
	for {
		wctx, stop := context.WithTimeout(ctx, g.cfg.HoldKeepalive)
		f, err := st.Next(wctx)
		stop()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			_ = s.Comment(holdComment) // a client gone is the watcher's to notice
			_ = s.Flush()
			continue
		}
		return f, err
	}
}

// next is the stream writer's wait for a frame: while the stream is held
// (begun before its first token), an SSE comment every HoldKeepalive.
func (x *exchange) next(s *httpstream.Stream, d *direct) (schemas.Frame, error) {
	if !x.holding {
		return x.st.Next(x.ctx)
	}
	for {
		f, err := x.g.nextHeld(x.ctx, x.st, s)
		if err != nil || f.Type == schemas.FrameChunk || f.Type == schemas.FrameDone {
			x.holding = false
		}
		if err == nil && f.Type == schemas.FrameChunk {
			now := time.Now()
			x.g.m.ttft.WithLabelValues(x.label).Observe(now.Sub(x.start).Seconds())
			d.last = now // the first token: no inter-token latency yet
			x.st.Direct(d)
		}
		return f, err
	}
}
