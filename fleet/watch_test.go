package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

func TestWatch(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	fl := New()
	subs := ns.NumSubscriptions()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := Watch(ctx, nc, fl); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // the subscriptions are in place
		t.Fatal(err)
	}
	publish := func(subject string, v any) {
		b, _ := json.Marshal(v)
		if err := nc.Publish(subject, b); err != nil {
			t.Fatal(err)
		}
	}
	load := func(want int) func() error {
		return func() error {
			w := fl.Workers()
			if len(w) != 1 || w[0].Load != want {
				return fmt.Errorf("workers %+v, want one with load %d", w, want)
			}
			return nil
		}
	}

	// A short interval, so that expiry comes quickly once beats stop.
	beat := hb("w1", 3, 4, "m")
	beat.IntervalMS = 100
	publish(schemas.HeartbeatSubject("w1"), beat)
	testenv.WaitFor(t, 2*time.Second, load(3))
	publish(schemas.DoneSubject("w1"), schemas.DoneNotice{Worker: "w1", RequestID: "r", Running: 2})
	testenv.WaitFor(t, 2*time.Second, load(2))
	// No more beats: gone after MissedBeats intervals.
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := fl.Len(); n != 0 {
			return fmt.Errorf("%d workers, want the silent one expired", n)
		}
		return nil
	})

	// Once ctx ends, Watch stops listening.
	if n := ns.NumSubscriptions(); n != subs+2 {
		t.Fatalf("%d subscriptions while watching, want %d", n, subs+2)
	}
	cancel()
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := ns.NumSubscriptions(); n != subs {
			return fmt.Errorf("%d subscriptions, want %d: Watch's are still there", n, subs)
		}
		return nil
	})
}
