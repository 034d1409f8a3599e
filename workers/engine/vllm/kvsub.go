package vllm

import (
	"context"
	"encoding/binary"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// kvSub subscribes to vLLM's KV events publisher (a ZMQ PUB socket,
// --kv-events-config) and applies what it reads to a kvMap. It connects on
// its own and again whenever the connection ends (vLLM restarted), with a
// backoff; a reconnect, a gap in the sequence numbers or a payload it cannot
// read counts as events lost (kvMap.lost). It stops when ctx ends.
type kvSub struct {
	endpoint string
	topic    string // "": any
	m        *kvMap
	log      *slog.Logger

	lastSeq uint64
	haveSeq bool

	received, decodeErrors, unknown, connects atomic.Uint64
}

const (
	kvDialTimeout = 2 * time.Second
	kvBackoffMin  = 100 * time.Millisecond
	kvBackoffMax  = 2 * time.Second
)

func (s *kvSub) run(ctx context.Context) {
	backoff := kvBackoffMin
	var lastErr string
	for ctx.Err() == nil {
		connected, err := s.session(ctx)
		if connected {
			// Whatever vLLM did between this connection and the next is
			// unknown to us.
			s.m.lost()
			s.haveSeq = false
			backoff = kvBackoffMin
		}
		if ctx.Err() != nil {
			return
		}
		if msg := err.Error(); msg != lastErr {
			s.log.Warn("vLLM KV events: not connected; retrying", "endpoint", s.endpoint, "err", err)
			lastErr = msg
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, kvBackoffMax)
	}
}

// session makes one connection and reads from it until it fails; connected
// says whether it got as far as reading.
func (s *kvSub) session(ctx context.Context) (connected bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(kvDialTimeout))
	defer sock.Close()
	if err := sock.Dial(s.endpoint); err != nil {
		return false, err
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, s.topic); err != nil {
		return false, err
	}
	s.connects.Add(1)
	s.log.Info("vLLM KV events: subscribed", "endpoint", s.endpoint, "topic", s.topic)
	for {
		msg, err := sock.Recv()
		if err != nil {
			return true, err
		}
		s.handle(msg.Frames)
	}
}

// handle takes one message: topic, 8-byte big-endian sequence number,
// payload.
func (s *kvSub) handle(frames [][]byte) {
	if len(frames) != 3 || len(frames[1]) != 8 || s.topic != "" && string(frames[0]) != s.topic {
		s.decodeErrors.Add(1)
		return
	}
	s.received.Add(1)
	seq := binary.BigEndian.Uint64(frames[1])
	if s.haveSeq && seq != s.lastSeq+1 {
		s.m.lost()
	}
	s.lastSeq, s.haveSeq = seq, true
	b, err := decodeKVBatch(frames[2])
	if err != nil {
		s.decodeErrors.Add(1)
		s.m.lost() // its events are lost
		s.log.Debug("vLLM KV events: a payload not read", "seq", seq, "err", err)
		return
	}
	s.unknown.Add(uint64(b.unknown))
	s.m.apply(&b)
}
