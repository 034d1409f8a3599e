package schemas

import (
	"bytes"
	"errors"
	"math"
	"strconv"
)

// A reply stream is the sequence of messages published to a request's reply
// subject. Each message body is one frame:
//
//	<type> SP <seq> LF <payload>
//
// The type and sequence travel in the body, not in NATS headers, because
// nats.go decodes headers eagerly into a map on every message: a few
// allocations and about a microsecond per streamed token, for nothing.
//
// Messages from the worker are numbered 1, 2, 3... (accepted is 1); a gap means
// NATS dropped a message and the stream must end in an error, never with text
// silently missing. Dispatcher messages (queued, error before a worker took
// the request) carry sequence 0 and are not part of the numbering.
type FrameType string

const (
	FrameQueued    FrameType = "queued"    // payload Queued
	FrameAccepted  FrameType = "accepted"  // payload Accepted
	FrameChunk     FrameType = "chunk"     // payload: one or more OpenAI chunk objects, one per line
	FrameKeepalive FrameType = "keepalive" // empty payload; the worker is alive but has nothing to say
	FrameDone      FrameType = "done"      // payload: stream {"usage":...}; non-stream the whole response object
	FrameError     FrameType = "error"     // payload Error
	// FramePart carries a piece of the payload of the next frame that is not
	// a part: a frame too large for the connection's max_payload goes as
	// parts and then its own type with the last piece. Each part has its
	// own sequence number; the client concatenates the pieces.
	FramePart FrameType = "part"
)

// Terminal reports whether t ends a stream.
func (t FrameType) Terminal() bool { return t == FrameDone || t == FrameError }

// Frame is one decoded reply-stream message. Payload aliases the message data.
type Frame struct {
	Type    FrameType
	Seq     uint64
	Payload []byte
}

// AppendFrame appends the encoding of a frame to dst.
func AppendFrame(dst []byte, t FrameType, seq uint64, payload []byte) []byte {
	dst = append(dst, t...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, '\n')
	return append(dst, payload...)
}

// ErrBadFrame is returned for a message that is not a frame.
var ErrBadFrame = errors.New("malformed reply frame")

// ParseFrame decodes a frame without copying.
func ParseFrame(data []byte) (Frame, error) {
	nl := bytes.IndexByte(data, '\n')
	if nl < 0 {
		return Frame{}, ErrBadFrame
	}
	head := data[:nl]
	sp := bytes.IndexByte(head, ' ')
	if sp <= 0 {
		return Frame{}, ErrBadFrame
	}
	t := frameType(head[:sp])
	if t == "" {
		return Frame{}, ErrBadFrame
	}
	seq, ok := parseUint(head[sp+1:])
	if !ok {
		return Frame{}, ErrBadFrame
	}
	return Frame{Type: t, Seq: seq, Payload: data[nl+1:]}, nil
}

// frameType maps the type bytes to a constant without allocating a string.
func frameType(b []byte) FrameType {
	switch string(b) {
	case string(FrameChunk):
		return FrameChunk
	case string(FrameKeepalive):
		return FrameKeepalive
	case string(FrameAccepted):
		return FrameAccepted
	case string(FrameQueued):
		return FrameQueued
	case string(FrameDone):
		return FrameDone
	case string(FrameError):
		return FrameError
	case string(FramePart):
		return FramePart
	}
	return ""
}

func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false // overflow
		}
		n = n*10 + d
	}
	return n, true
}

// ForEachLine calls fn for every non-empty line of a chunk payload: each is one
// OpenAI chunk object, exactly the JSON that follows "data: " in SSE.
func ForEachLine(payload []byte, fn func(line []byte) error) error {
	for len(payload) > 0 {
		line := payload
		if i := bytes.IndexByte(payload, '\n'); i >= 0 {
			line, payload = payload[:i], payload[i+1:]
		} else {
			payload = nil
		}
		if len(line) == 0 {
			continue
		}
		if err := fn(line); err != nil {
			return err
		}
	}
	return nil
}

// Queued is the payload of a queued frame.
type Queued struct {
	Position   int    `json:"position"`             // 1 = next to run: estimated, in flow control's order (docs/scheduling.md)
	WaitMS     int64  `json:"wait_ms,omitempty"`    // estimated wait from the measured service rate; 0: not yet known or none
	Band       string `json:"band,omitempty"`       // the request's band
	Dispatcher string `json:"dispatcher,omitempty"` // id of the queueing dispatcher
	TimeoutMS  int64  `json:"timeout_ms"`           // how long it may stay queued; the client's stall timer uses it
	// RequestID and CancelToken: send CancelBody(RequestID, CancelToken) to
	// QueueCancel to take the request out of the queue.
	RequestID   string `json:"request_id,omitempty"`
	CancelToken string `json:"cancel_token,omitempty"`
	// Cold: the request waits for capacity that is not up (no live worker
	// serves its model, or it waits for one to wake or switch): TimeoutMS is
	// then the cold-start limit. BeatMS: the dispatcher sends the queued
	// frame again at least this often while the request waits, so that a
	// client notices a dispatcher that died within a few beats (0: it does
	// not, and the client waits out TimeoutMS).
	Cold   bool  `json:"cold,omitempty"`
	BeatMS int64 `json:"beat_ms,omitempty"`
}

// Accepted is the payload of an accepted frame.
type Accepted struct {
	RequestID string `json:"request_id"`
	Worker    string `json:"worker"`
	Cancel    string `json:"cancel"` // publish CancelBody(RequestID, CancelToken) here to abort
	// CancelToken proves a cancel comes from the requester (HdrCancelToken).
	CancelToken string `json:"cancel_token,omitempty"`
}

// DoneInfo is what every done payload has at its top level.
type DoneInfo struct {
	Usage *Usage `json:"usage,omitempty"`
}

// Usage is OpenAI's usage object.
type Usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails *TokenDetails `json:"prompt_tokens_details,omitempty"`
}

// TokenDetails is OpenAI's prompt_tokens_details.
type TokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}
