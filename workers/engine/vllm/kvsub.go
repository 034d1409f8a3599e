package vllm

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
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
	badRun  int           // payloads not read in a row
	dialing chan struct{} // closed when the last dial returned; nil before the first

	received, decodeErrors, unknown, connects atomic.Uint64
}

const (
	kvDialTimeout      = 2 * time.Second
	kvHandshakeTimeout = 5 * time.Second
	kvBackoffMin       = 100 * time.Millisecond
	kvBackoffMax       = 2 * time.Second
	kvMaxBadRun        = 10 // payloads not read in a row after which they stop counting as losses
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
			backoff, lastErr = kvBackoffMin, "" // each disconnection is logged
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
	sock, err := s.dial(ctx)
	if err != nil {
		return false, err
	}
	defer sock.Close()
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

// dial connects a SUB socket to the endpoint. zmq4 bounds the TCP connect
// (kvDialTimeout) but not the ZMTP handshake after it, so a peer that
// accepts and says nothing would hold Dial forever: the dial runs in a
// goroutine of its own, waited for at most kvHandshakeTimeout (or until
// ctx ends), and no new dial starts while an abandoned one is still
// running, so at most one is ever left behind.
func (s *kvSub) dial(ctx context.Context) (zmq4.Socket, error) {
	if s.dialing != nil {
		select {
		case <-s.dialing:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	done := make(chan struct{})
	s.dialing = done
	sock := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(kvDialTimeout))
	closeSock := sync.OnceFunc(func() { sock.Close() })
	var dialErr error // the goroutine's; read after done
	abandoned := make(chan struct{})
	go func() {
		defer close(done)
		dialErr = sock.Dial(s.endpoint)
		select {
		case <-abandoned:
			closeSock()
		default:
		}
	}()
	t := time.NewTimer(kvHandshakeTimeout)
	defer t.Stop()
	var err error
	select {
	case <-done:
		if dialErr != nil {
			closeSock()
			return nil, dialErr
		}
		return sock, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = fmt.Errorf("no ZMTP handshake within %v", kvHandshakeTimeout)
	}
	close(abandoned)
	select { // it may have returned in between
	case <-done:
		closeSock()
	default:
	}
	return nil, err
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
		s.badRun++
		switch {
		case s.badRun < kvMaxBadRun:
			s.m.lost() // its events are lost
			s.log.Debug("vLLM KV events: a payload not read", "seq", seq, "err", err)
		case s.badRun == kvMaxBadRun:
			// A format this reader does not know (a newer vLLM): reporting
			// a loss per message would have dispatchers clear their record
			// of this worker every 50 ms, worse than no events at all.
			s.log.Error("vLLM KV events: payloads not understood, ignored until one is", "err", err)
		}
		return
	}
	s.badRun = 0
	s.unknown.Add(uint64(b.unknown))
	s.m.apply(&b)
}
