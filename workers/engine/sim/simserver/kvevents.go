package simserver

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// KV cache events, as vLLM publishes them with --kv-events-config: a ZMQ PUB
// socket sending multipart messages (topic, 8-byte big-endian sequence
// number from 0, payload), the payload a KVEventBatch as msgspec encodes it
// with array_like=True (vLLM up to late 2025):
//
//	[ts, [event...], data_parallel_rank]
//	["BlockStored", [hash...], parent|nil, [token id...], block_size, lora_id|nil, "GPU", lora_name|nil]
//	["BlockRemoved", [hash...], "GPU"]
//
// Hashes are the sim's own token-block hashes as 8 big-endian bytes (vLLM's
// are bytes too, from sha256, or ints: opaque to a reader either way). The
// events are the sim's real stores and evictions (sim.Engine.
// DrainBlockEvents), gathered every kvPublishEvery. When the sim had to drop
// events (its buffer full), the next message skips a sequence number: a
// subscriber sees a gap, as it would for messages lost on the way.

const kvPublishEvery = 20 * time.Millisecond

// KVEventsConfig is vLLM's --kv-events-config JSON, the fields the
// sim-server uses; others (replay_endpoint, buffer_steps, hwm...) are
// accepted and ignored.
type KVEventsConfig struct {
	Enable    bool   `json:"enable_kv_cache_events"`
	Publisher string `json:"publisher"` // "zmq"; "null" or "": none unless Enable ("": zmq)
	Endpoint  string `json:"endpoint"`  // default tcp://*:5557; bound if it has "*" or "::" (or is ipc://), else dialled, as vLLM
	Topic     string `json:"topic"`
}

// ParseKVEventsConfig reads --kv-events-config; ok is false when it turns
// events off (not enabled, or the null publisher).
func ParseKVEventsConfig(s string) (kc KVEventsConfig, ok bool, err error) {
	if err := json.Unmarshal([]byte(s), &kc); err != nil {
		return kc, false, fmt.Errorf("--kv-events-config: %v", err)
	}
	if !kc.Enable || kc.Publisher == "null" {
		return kc, false, nil
	}
	if kc.Publisher != "" && kc.Publisher != "zmq" {
		return kc, false, fmt.Errorf("--kv-events-config: publisher %q: the sim-server has zmq only", kc.Publisher)
	}
	if kc.Endpoint == "" {
		kc.Endpoint = "tcp://*:5557"
	}
	return kc, true, nil
}

// KVPublisher publishes a sim engine's KV cache events (whose Config has
// BlockEvents) in vLLM's format.
type KVPublisher struct {
	kc        KVEventsConfig
	eng       *sim.Engine
	log       *slog.Logger
	pub       zmq4.Socket
	cancel    context.CancelFunc
	blockSize int
	seq       uint64
}

// NewKVPublisher binds (or dials) the PUB socket of kc.
func NewKVPublisher(kc KVEventsConfig, eng *sim.Engine, log *slog.Logger) (*KVPublisher, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &KVPublisher{kc: kc, eng: eng, log: log, cancel: cancel, blockSize: eng.Config().BlockSize,
		pub: zmq4.NewPub(ctx, zmq4.WithTimeout(time.Second), zmq4.WithDialerTimeout(2*time.Second))}
	ep := kc.Endpoint
	var err error
	if strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://") {
		err = p.pub.Listen(strings.Replace(ep, "tcp://*:", "tcp://0.0.0.0:", 1))
	} else {
		err = p.pub.Dial(ep)
	}
	if err != nil {
		p.pub.Close()
		cancel()
		return nil, fmt.Errorf("kv events endpoint %s: %w", ep, err)
	}
	return p, nil
}

// Addr is the bound address, nil when dialled.
func (p *KVPublisher) Addr() string {
	if a := p.pub.Addr(); a != nil {
		return a.String()
	}
	return ""
}

// Run publishes until ctx ends, then closes the socket.
func (p *KVPublisher) Run(ctx context.Context) error {
	// A subscriber that stops reading can block a send for good (zmq4's
	// send timeout does not cover the write itself): closing the socket
	// when ctx ends unblocks it.
	closePub := sync.OnceFunc(func() { p.pub.Close() }) // a second caller waits for the first: closed on return
	context.AfterFunc(ctx, closePub)
	defer func() {
		closePub()
		p.cancel()
	}()
	t := time.NewTicker(kvPublishEvery)
	defer t.Stop()
	var buf []byte
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		evs, dropped := p.eng.DrainBlockEvents()
		if dropped > 0 {
			p.seq++ // a gap: the subscriber learns it missed something
		}
		if len(evs) == 0 {
			continue
		}
		buf = appendKVBatch(buf[:0], time.Now(), evs, p.blockSize)
		seq := binary.BigEndian.AppendUint64(nil, p.seq)
		p.seq++
		if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.kc.Topic), seq, buf)); err != nil {
			p.log.Debug("kv events not sent", "err", err)
		}
	}
}

// appendKVBatch encodes a KVEventBatch in msgspec's array_like msgpack.
func appendKVBatch(b []byte, ts time.Time, evs []sim.BlockEvent, blockSize int) []byte {
	b = append(b, 0x93) // [ts, events, data_parallel_rank]
	b = append(b, 0xcb)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(float64(ts.Unix())+float64(ts.Nanosecond())/1e9))
	b = mpArray(b, len(evs))
	for _, ev := range evs {
		if ev.Cleared {
			b = append(b, 0x91)
			b = mpStr(b, "AllBlocksCleared")
			continue
		}
		if ev.Removed {
			b = append(b, 0x93)
			b = mpStr(b, "BlockRemoved")
			b = mpHashes(b, ev.Hashes)
			b = mpStr(b, "GPU")
			continue
		}
		b = append(b, 0x98)
		b = mpStr(b, "BlockStored")
		b = mpHashes(b, ev.Hashes)
		if ev.Parent == 0 {
			b = append(b, 0xc0)
		} else {
			b = mpHash(b, ev.Parent)
		}
		b = mpArray(b, len(ev.Tokens))
		for _, t := range ev.Tokens {
			b = mpUint(b, uint64(t))
		}
		b = mpUint(b, uint64(blockSize))
		if ev.Lora == "" {
			b = append(b, 0xc0)
		} else { // vLLM's lora_int_id is its own numbering: any stable positive int does
			h := fnv.New32a()
			h.Write([]byte(ev.Lora))
			b = mpUint(b, uint64(h.Sum32()>>1|1))
		}
		b = mpStr(b, "GPU")
		if ev.Lora == "" {
			b = append(b, 0xc0)
		} else {
			b = mpStr(b, ev.Lora)
		}
	}
	return append(b, 0x00) // data_parallel_rank 0
}

func mpArray(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

func mpStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 256:
		b = append(b, 0xd9, byte(n))
	case n < 1<<16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func mpUint(b []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(b, byte(v))
	case v < 1<<8:
		return append(b, 0xcc, byte(v))
	case v < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v < 1<<32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

// mpHash is a block hash as 8 bytes (bin 8).
func mpHash(b []byte, h uint64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xc4, 8), h)
}

func mpHashes(b []byte, hs []uint64) []byte {
	b = mpArray(b, len(hs))
	for _, h := range hs {
		b = mpHash(b, h)
	}
	return b
}
