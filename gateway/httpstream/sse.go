package httpstream

import (
	"errors"

	"github.com/tokenbus/tokenbus/schemas"
)

// The bytes of an SSE stream on /v1: data lines only, no comments, ids or
// event names (some OpenAI SDKs break on those).
var (
	sseData = []byte("data: ")
	sseEnd  = []byte("\n\n")
	sseDone = []byte("data: [DONE]\n\n")
)

var errNotRunning = errors.New("httpstream: Done or Fail outside the function given to Run")

// WriteEvents adds every line of payload (a chunk frame's payload: one JSON
// object per line) as one event, "data: <line>\n\n", byte for byte. It
// returns the number of events and the first write error. Flush sends them.
func (st *Stream) WriteEvents(payload []byte) (int, error) {
	n := 0
	err := schemas.ForEachLine(payload, func(line []byte) error {
		n++
		_ = st.add(sseData)
		_ = st.add(line)
		return st.add(sseEnd)
	})
	return n, err
}

// Done ends the stream: [DONE] and the end of the body, sent.
func (st *Stream) Done() error {
	if !st.running {
		return errNotRunning
	}
	if err := st.add(sseDone); err != nil {
		return err
	}
	return st.end()
}

// Fail ends a stream that failed after its first byte: the error in-band as
// OpenAI clients expect it, data: {"error":{...}}, then [DONE].
func (st *Stream) Fail(e *schemas.Error) error {
	if !st.running {
		return errNotRunning
	}
	_ = st.add(sseData)
	_ = st.add(e.JSON())
	_ = st.add(sseEnd)
	return st.Done()
}
