package workers

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

// receiver is a LocalReplies with one client: it records the frames it is
// handed, by token, and calls onFrame (if set) with each as it is handed.
type receiver struct {
	prefix  string
	onFrame func(token string, f schemas.Frame)
	mu      sync.Mutex
	got     map[string][]schemas.Frame
}

func (r *receiver) Receiver(prefix string) Receiver {
	if prefix == r.prefix {
		return r
	}
	return nil
}

func (r *receiver) Deliver(token string, frame []byte) {
	f, err := schemas.ParseFrame(frame)
	if err != nil {
		panic(fmt.Sprintf("bad frame %q", frame))
	}
	if r.onFrame != nil {
		r.onFrame(token, f)
	}
	r.mu.Lock()
	r.got[token] = append(r.got[token], f)
	r.mu.Unlock()
}

func (r *receiver) frames(token string) []schemas.Frame {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]schemas.Frame(nil), r.got[token]...)
}

// Frames for a client in the process go to it in memory, numbered and in
// order, and none of them on the bus, also when the request asks for
// multiplexed replies; a request from any other client is answered on the
// bus as before.
func TestLocalReplies(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	local := &receiver{prefix: "_INBOX.gw.", got: map[string][]schemas.Frame{}}
	startWorker(t, nc, eng, Config{ID: "w1", Local: local})
	var mu sync.Mutex
	var onBus []string
	if _, err := nc.Subscribe("_INBOX.gw.>", func(m *nats.Msg) {
		mu.Lock()
		onBus = append(onBus, m.Subject)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, mux := range []string{"", "1"} {
		m := workMsg(fmt.Sprintf("r%d", i), fmt.Sprintf("_INBOX.gw.s%d", i), map[string]string{schemas.HdrMux: mux})
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	remote := send(t, nc, schemas.WorkSubject("w1"), "r2", nil)
	close(eng.release)
	for _, tok := range []string{"s0", "s1"} {
		testenv.WaitFor(t, 5*time.Second, func() error {
			fs := local.frames(tok)
			var got []string
			for _, f := range fs {
				got = append(got, fmt.Sprintf("%d:%v", f.Seq, f.Type))
			}
			want := fmt.Sprintf("1:%v 2:%v 3:%v", schemas.FrameAccepted, schemas.FrameChunk, schemas.FrameDone)
			if strings.Join(got, " ") != want {
				return fmt.Errorf("stream %s got %v in memory, want %s", tok, got, want)
			}
			return nil
		})
	}
	testenv.WaitFor(t, 5*time.Second, wantTypes(remote, schemas.FrameAccepted, schemas.FrameChunk, schemas.FrameDone))
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(onBus) > 0 {
		t.Fatalf("frames for the local client went on the bus too: %v", onBus)
	}
}

// A request handed over in memory (Take) is served as one from the work
// subject; a worker that is stopping declines it (the dispatcher then
// publishes it, and the bus answers for the worker).
func TestTake(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	eng := &gateEngine{release: make(chan struct{})}
	close(eng.release)
	w, stop, _ := startWorker(t, nc, eng, Config{ID: "w1"})
	f, inbox := collect(t, nc)
	req := func(id string) *nats.Msg { return workMsg(id, inbox, nil) }
	if !w.Take(req("r1")) {
		t.Fatal("a running worker declined a request")
	}
	testenv.WaitFor(t, 5*time.Second, wantTypes(f, schemas.FrameAccepted, schemas.FrameChunk, schemas.FrameDone))
	stop()
	testenv.WaitFor(t, 5*time.Second, func() error {
		if w.Take(req("r2")) {
			return errors.New("a stopping worker took a request")
		}
		return nil
	})
}
