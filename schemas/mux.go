package schemas

import (
	"bytes"
	"errors"
	"strconv"
)

// Multiplexed replies. A worker streams to many requests of the same client
// (a gateway), all with reply subjects under one inbox prefix. When the
// client says it can (request header HdrMux), the worker may put frames of
// several of those streams in one message, sent to the prefix's MuxToken:
//
//	<prefix>.<MuxToken>   body: entries, each  <token> SP <length> LF <frame>
//
// where <token> is the last token of the stream's reply subject and <frame>
// is exactly what would have been published to it alone. Frames of one
// stream keep their order. This turns a token's fixed costs (a message
// through the worker, the NATS server and the client's reader) into a cost
// per batch: with many streams, tokens of one engine step share a message.
const (
	HdrMux   = "Tb-Mux" // "1": the client accepts multiplexed replies on its inbox prefix
	MuxToken = "_mux"
)

// SplitReply splits a reply subject into its prefix (up to and including the
// last '.') and last token; ok is false when it has no '.'.
func SplitReply(reply string) (prefix, token string, ok bool) {
	i := len(reply) - 1
	for ; i >= 0 && reply[i] != '.'; i-- {
	}
	if i <= 0 || i == len(reply)-1 {
		return "", "", false
	}
	return reply[:i+1], reply[i+1:], true
}

// AppendMuxEntry appends one entry (a frame for the stream named by token) to
// a multiplexed message body.
func AppendMuxEntry(dst []byte, token string, frame []byte) []byte {
	dst = append(dst, token...)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, int64(len(frame)), 10)
	dst = append(dst, '\n')
	return append(dst, frame...)
}

// ErrBadMux is returned for a malformed multiplexed body.
var ErrBadMux = errors.New("malformed multiplexed reply")

// ForEachMuxEntry calls fn for every entry of a multiplexed body, in order.
// token and frame alias body.
func ForEachMuxEntry(body []byte, fn func(token, frame []byte)) error {
	for len(body) > 0 {
		nl := bytes.IndexByte(body, '\n')
		if nl < 0 {
			return ErrBadMux
		}
		head := body[:nl]
		sp := bytes.IndexByte(head, ' ')
		if sp <= 0 {
			return ErrBadMux
		}
		n, ok := parseUint(head[sp+1:])
		rest := body[nl+1:]
		if !ok || n > uint64(len(rest)) {
			return ErrBadMux
		}
		fn(head[:sp], rest[:n])
		body = rest[n:]
	}
	return nil
}
