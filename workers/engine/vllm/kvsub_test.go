package vllm

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

func kvFrames(t testing.TB, topic string, seq uint64, fixture string) [][]byte {
	t.Helper()
	payload, err := os.ReadFile(filepath.Join("testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	return [][]byte{[]byte(topic), binary.BigEndian.AppendUint64(nil, seq), payload}
}

// garbageRun is n messages in sequence whose payloads are not msgpack.
func garbageRun(n int) [][][]byte {
	msgs := make([][][]byte, n)
	for i := range msgs {
		msgs[i] = [][]byte{[]byte("kv"), binary.BigEndian.AppendUint64(nil, uint64(i)), []byte("\xc1")}
	}
	return msgs
}

func TestKVSubHandle(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		msgs                     [][][]byte
		received, errors, unkown uint64
		dropped                  int
	}{
		{"in order", [][][]byte{kvFrames(t, "kv", 0, "kv_array_stored_int.msgpack"), kvFrames(t, "kv", 1, "kv_array_removed_cleared.msgpack")},
			2, 0, 1, 1}, // AllBlocksCleared is a loss
		{"a gap", [][][]byte{kvFrames(t, "kv", 4, "kv_array_stored_int.msgpack"), kvFrames(t, "kv", 6, "kv_array_stored_int.msgpack")},
			2, 0, 0, 1},
		// The latest vLLM's fields, and the placeholders of its offloading
		// connector (block_size 0): read, nothing lost.
		{"the latest vLLM", [][][]byte{kvFrames(t, "kv", 0, "kv_map_latest.msgpack"), kvFrames(t, "kv", 1, "kv_mixed.msgpack")},
			2, 0, 1, 0},
		{"first seq not 0: nothing lost", [][][]byte{kvFrames(t, "kv", 9, "kv_array_stored_int.msgpack")}, 1, 0, 0, 0},
		{"garbage payload", [][][]byte{{[]byte("kv"), make([]byte, 8), []byte("\xc1")}}, 1, 1, 0, 1},
		{"bad frames", [][][]byte{{[]byte("kv"), []byte("seq")}, {[]byte("kv"), []byte("1234567"), nil}}, 0, 2, 0, 0},
		{"payloads never understood stop counting as losses", garbageRun(25), 25, 25, 0, kvMaxBadRun - 1},
		{"another topic", [][][]byte{kvFrames(t, "kv-x", 0, "kv_array_stored_int.msgpack")}, 0, 1, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &kvSub{topic: "kv", m: newKVMap(kvBlockBytes), log: slog.New(slog.DiscardHandler)}
			for _, m := range tc.msgs {
				s.handle(m)
			}
			ev, _ := s.m.drain()
			if s.received.Load() != tc.received || s.decodeErrors.Load() != tc.errors || s.unknown.Load() != tc.unkown || ev.Dropped != tc.dropped {
				t.Errorf("received %d, errors %d, unknown %d, dropped %d; want %d %d %d %d", s.received.Load(),
					s.decodeErrors.Load(), s.unknown.Load(), ev.Dropped, tc.received, tc.errors, tc.unkown, tc.dropped)
			}
		})
	}
}

// A real ZMQ publisher: the subscriber reads its messages, notices it go
// (a loss), connects again when it comes back, and stops on cancel.
func TestKVSubReconnects(t *testing.T) {
	port := testenv.FreePort(t)
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	startPub := func() zmq4.Socket {
		pub := zmq4.NewPub(context.Background(), zmq4.WithTimeout(time.Second))
		if err := pub.Listen(ep); err != nil {
			t.Fatal(err)
		}
		return pub
	}
	pub := startPub()
	s := &kvSub{endpoint: ep, topic: "kv-events", m: newKVMap(kvBlockBytes), log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.run(ctx) }()

	var seq uint64
	publishUntilRead := func(pub zmq4.Socket) {
		t.Helper()
		want := s.received.Load() + 1
		testenv.WaitFor(t, 10*time.Second, func() error {
			// PUB drops messages until the subscription reaches it: send
			// until one is read.
			if err := pub.SendMulti(zmq4.NewMsgFrom(kvFrames(t, "kv-events", seq, "kv_array_stored_int.msgpack")...)); err != nil {
				return err
			}
			seq++
			if s.received.Load() < want {
				return fmt.Errorf("nothing read")
			}
			return nil
		})
	}
	publishUntilRead(pub)
	s.m.drain()
	lost := s.m.statsNow().Lost

	pub.Close() // vLLM gone
	testenv.WaitFor(t, 10*time.Second, func() error {
		if s.m.statsNow().Lost == lost {
			return fmt.Errorf("no loss noticed")
		}
		return nil
	})
	pub = startPub() // and back
	defer pub.Close()
	seq = 0
	publishUntilRead(pub)
	if ev, _ := s.m.drain(); ev.Dropped == 0 {
		t.Error("a reconnect reported no drop")
	}
	if c := s.connects.Load(); c < 2 {
		t.Errorf("connects = %d, want 2", c)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the subscriber did not stop")
	}
}

// A peer that accepts the TCP connection and never speaks ZMTP holds zmq4's
// Dial: the subscriber still stops at once when cancelled.
func TestKVSubSilentPeerStops(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	defer func() {
		ln.Close()
		for {
			select {
			case c := <-accepted:
				c.Close()
			default:
				return
			}
		}
	}()
	s := &kvSub{endpoint: "tcp://" + ln.Addr().String(), m: newKVMap(kvBlockBytes), log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.run(ctx) }()
	var c net.Conn
	select {
	case c = <-accepted: // the dial is now in the handshake
		accepted <- c
	case <-time.After(5 * time.Second):
		t.Fatal("no connection")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("the subscriber did not stop while its dial hung")
	}
}
