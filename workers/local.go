package workers

import "github.com/tokenbus/tokenbus/schemas"

// LocalReplies finds, by reply prefix, a client in this process: in `dev`
// the gateway runs beside the workers, and its streams' frames are handed
// over in memory instead of going through the bus (publish, the server's
// read and write, the client's read and dispatch: five goroutine hand-offs
// and four copies per token). Frames keep their numbering and order; the
// client bounds what it holds per stream as it does for the bus.
type LocalReplies interface {
	// Receiver returns the client whose reply subjects start with prefix
	// (it ends in '.'), or nil when no client in this process has it.
	Receiver(prefix string) Receiver
}

// Receiver takes reply frames in memory (see LocalReplies).
type Receiver interface {
	// Deliver takes one frame for the stream whose reply subject ends in
	// token, as the client would get it from the bus, and keeps it: the
	// caller gives frame up (a frame is built for it, so nobody copies it
	// again). It never blocks.
	Deliver(token string, frame []byte)
}

// localReceiver is the receiver of reply, or nil for the bus.
func (w *Worker) localReceiver(reply string) (Receiver, string) {
	if w.cfg.Local == nil {
		return nil, ""
	}
	prefix, token, ok := schemas.SplitReply(reply)
	if !ok {
		return nil, ""
	}
	if r := w.cfg.Local.Receiver(prefix); r != nil {
		return r, token
	}
	return nil, ""
}
