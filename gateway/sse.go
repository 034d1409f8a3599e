package gateway

import (
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
// events and the first write error (the writer's errors are sticky).
func writeChunkFrame(w *streamWriter, payload []byte) (int, error) {
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

// writeDone ends a stream: [DONE] and the end of the body, sent.
func writeDone(w *streamWriter) error {
	_, _ = w.Write(sseDone)
	return w.End()
}

// writeErrorEvent ends a stream that failed after its first byte: the error
// in-band as OpenAI clients expect it, then [DONE].
func writeErrorEvent(w *streamWriter, e *schemas.Error) error {
	_, _ = w.Write(sseData)
	_, _ = w.Write(e.JSON())
	_, _ = w.Write(sseEnd)
	return writeDone(w)
}
