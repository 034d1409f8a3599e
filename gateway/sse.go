package gateway

import (
	"bufio"

	"github.com/tokenbus/tokenbus/schemas"
)

// The bytes of an SSE stream on /v1: data lines only, no comments, ids or
// event names (some OpenAI SDKs break on those).
var (
	sseData = []byte("data: ")
	sseEnd  = []byte("\n\n")
	sseDone = []byte("data: [DONE]\n\n")
)

// writeChunkFrame writes every line of a chunk payload as one SSE event,
// "data: <line>\n\n", exactly as the worker sent it. It returns the number of
// events and the first write error (bufio's errors are sticky).
func writeChunkFrame(w *bufio.Writer, payload []byte) (int, error) {
	n := 0
	err := schemas.ForEachLine(payload, func(line []byte) error {
		n++
		_, _ = w.Write(sseData)
		_, _ = w.Write(line)
		_, err := w.Write(sseEnd)
		return err
	})
	return n, err
}

// writeDone ends a stream.
func writeDone(w *bufio.Writer) error {
	_, err := w.Write(sseDone)
	return err
}

// writeErrorEvent ends a stream that failed after its first byte: the error
// in-band as OpenAI clients expect it, then [DONE].
func writeErrorEvent(w *bufio.Writer, e *schemas.Error) error {
	_, _ = w.Write(sseData)
	_, _ = w.Write(e.JSON())
	_, _ = w.Write(sseEnd)
	return writeDone(w)
}
