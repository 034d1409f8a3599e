package responses

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(context.Background(), testenv.Connect(t, testenv.NATS(t)), Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTenancy: a response is its tenant's: another tenant gets 404 for
// reading, deleting and cancelling it.
func TestTenancy(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	rec := &Record{Response: *New("resp_abc", &CreateRequest{Model: "m", Background: true}, time.Now()), Tenant: "t1"}
	if err := s.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "t1", "resp_abc"); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"get":    func() error { _, _, err := s.Get(ctx, "t2", "resp_abc"); return err }(),
		"delete": s.Delete(ctx, "t2", "resp_abc"),
		"cancel": func() error { _, err := s.Cancel(ctx, "t2", "resp_abc"); return err }(),
		"bad id": func() error { _, _, err := s.Get(ctx, "t1", "resp_a.b"); return err }(),
	} {
		if !schemas.ErrResponseNotFound.Is(schemas.AsError(err)) {
			t.Errorf("%s by another tenant: %v, want response not found", name, err)
		}
	}
	if _, _, err := s.Get(ctx, "t1", "resp_abc"); err != nil {
		t.Fatalf("the owner lost it: %v", err)
	}
}

// TestAppendOneWriter: events are appended after the last one a writer
// knows; a second writer that did not see it fails, so no sequence is
// written twice.
func TestAppendOneWriter(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	last, err := s.append(ctx, "resp_x", &Event{Type: "response.created", SequenceNumber: 0}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.append(ctx, "resp_x", &Event{Type: "response.in_progress", SequenceNumber: 1}, 0); !errors.Is(err, errConflict) {
		t.Fatalf("a stale writer: %v, want errConflict", err)
	}
	if _, err := s.append(ctx, "resp_x", &Event{Type: "response.in_progress", SequenceNumber: 1}, last); err != nil {
		t.Fatal(err)
	}
	var got []int
	done := make(chan error, 1)
	f, err := s.OpenFollow(ctx, "t1", "resp_x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx)
	go func() {
		done <- f.Events(ctx, 0, func(ev *Event, _ []byte) error { got = append(got, ev.SequenceNumber); return nil })
	}()
	// A live event ends the follow: terminal.
	testenv.WaitFor(t, 5*time.Second, func() error {
		g := NewGen(&Response{}, nil)
		l, err := s.replay(ctx, "resp_x", g)
		if err != nil || g.Seq() != 2 {
			return errors.New("not replayed yet")
		}
		_, err = s.append(ctx, "resp_x", &Event{Type: "response.completed", SequenceNumber: 2}, l)
		return err
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("followed after 0: %v, want [1 2]", got)
	}
}

// TestGetAfterTerminalEvent: the runner appends a background response's
// terminal event before it sets the record; a read in between returns the
// event's end state, not the record's earlier one.
func TestGetAfterTerminalEvent(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	rec := &Record{Response: *New("resp_end", &CreateRequest{Model: "m", Background: true}, time.Now()), Tenant: "t1"}
	if err := s.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	running := rec.Response
	running.Status = StatusInProgress
	last, err := s.append(ctx, "resp_end", &Event{Type: "response.in_progress", SequenceNumber: 0, Response: &running}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.Get(ctx, "t1", "resp_end"); err != nil || got.Response.Status != rec.Response.Status {
		t.Fatalf("before the end: %v, status %q, want the record's %q", err, got.Response.Status, rec.Response.Status)
	}
	done := rec.Response
	done.Status, done.Usage = StatusCompleted, &Usage{OutputTokens: 7}
	if _, err := s.append(ctx, "resp_end", &Event{Type: "response.completed", SequenceNumber: 1, Response: &done}, last); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Get(ctx, "t1", "resp_end")
	if err != nil || got.Response.Status != StatusCompleted || got.Response.Usage == nil || got.Response.Usage.OutputTokens != 7 {
		t.Fatalf("after the terminal event: %v, %+v", err, got.Response)
	}
}

// TestCancelWhileTheRunnerAppends: a cancel lands however often the runner
// appends in between (an event a token; here one every 200 µs, while the
// cancel replays hundreds): the runner's next append fails, it stops, and
// the last event is response.cancelled. Before, a cancel retried once: a
// second conflict left the runner generating to the end while the record
// said cancelled (seen in integration's TestDeployConfigEveryFeature under
// load: 2,000 deltas, then response.incomplete).
func TestCancelWhileTheRunnerAppends(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	const id, events = "resp_busy", 5_000
	rec := &Record{Response: *New(id, &CreateRequest{Model: "m", Background: true}, time.Now()), Tenant: "t1"}
	if err := s.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// The runner: an event after the last it wrote, until one fails.
	stopped := make(chan int, 1)
	started := make(chan struct{})
	go func() {
		delta := "x"
		last, err := s.append(ctx, id, &Event{Type: "response.in_progress", SequenceNumber: 0}, 0)
		for n := 1; err == nil && n < events; n++ {
			if n == 300 {
				close(started)
			}
			time.Sleep(200 * time.Microsecond)
			last, err = s.append(ctx, id, &Event{Type: "response.output_text.delta", SequenceNumber: n, Delta: &delta}, last)
			if err != nil {
				stopped <- n
				return
			}
		}
		stopped <- events
	}()
	<-started
	if r, err := s.Cancel(ctx, "t1", id); err != nil || r.Status != StatusCancelled {
		t.Fatalf("cancel: %v %+v", err, r)
	}
	select {
	case n := <-stopped:
		if n == events {
			t.Fatalf("the runner appended all %d events: the cancel never landed", events)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the runner still appends 30 s after the cancel")
	}
	_, latest, err := s.latest(ctx, id)
	if err != nil || latest == nil || latest.Type != "response.cancelled" {
		t.Fatalf("the last event: %+v, %v; want response.cancelled", latest, err)
	}
}
