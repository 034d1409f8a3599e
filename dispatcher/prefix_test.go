package dispatcher

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

func chatBody(model, system, question string) string {
	return fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
		model, system, question)
}

var longSystem = strings.Repeat("You are a careful assistant who answers in plain words. ", 20) // ~1100 bytes

func TestPromptHashes(t *testing.T) {
	h := func(model, body string) []uint64 { return promptHashes(nil, model, []byte(body), 64) }
	a := h("m", chatBody("m", longSystem, "What is a cat?"))
	b := h("m", chatBody("m", longSystem, "Why is the sky blue, and why are sunsets red?"))
	if len(a) < 15 {
		t.Fatalf("%d blocks for ~1100 bytes of prompt", len(a))
	}
	common := 0
	for common < min(len(a), len(b)) && a[common] == b[common] {
		common++
	}
	if want := (len(`[{"role":"system","content":"`) + len(longSystem)) / 64; common < want {
		t.Fatalf("shared blocks %d, want at least %d (the system prompt)", common, want)
	}
	if common == len(a) && len(a) == len(b) {
		t.Fatal("different questions hash alike")
	}
	// Other fields and their order do not matter: only the prompt does.
	other := h("m", fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":5,"model":"m"}`,
		longSystem, "What is a cat?"))
	if !slices.Equal(a, other) {
		t.Fatal("the same messages with other fields hash differently")
	}
	// An adapter's prompt is apart from its base model's.
	ad := h("m-lora", chatBody("m-lora", longSystem, "What is a cat?"))
	for _, x := range ad {
		if slices.Contains(a, x) {
			t.Fatal("an adapter's blocks collide with its base model's")
		}
	}
	// Completions hash their prompt; a prompt under a block has none.
	if p := h("m", `{"model":"m","prompt":`+fmt.Sprintf("%q", longSystem)+`}`); len(p) != len(longSystem)/64 {
		t.Fatalf("%d blocks for a completion prompt of %d bytes", len(p), len(longSystem))
	}
	if p := h("m", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`); len(p) != 0 {
		t.Fatalf("%d blocks for a tiny prompt", len(p))
	}
	if p := h("m", `not json`); len(p) != 0 {
		t.Fatalf("%d blocks for a broken body", len(p))
	}
	if p := promptHashes(nil, "m", []byte(chatBody("m", longSystem, "q")), 0); len(p) != 0 {
		t.Fatal("a block size of 0 hashed something")
	}
	body := []byte(chatBody("m", longSystem, "What is a cat?"))
	buf := make([]uint64, 0, 64)
	if n := testing.AllocsPerRun(100, func() { promptHashes(buf[:0], "m", body, 64) }); n != 0 {
		t.Fatalf("%v allocations with room in dst", n)
	}
}

// End to end through NATS: the questions on one system prompt follow the
// first to its worker even when that worker is busier; a prompt never seen
// goes to the least loaded; with prefix routing off, load alone decides.
func TestPrefixAffinity(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("off=%v", off), func(t *testing.T) {
			ns := testenv.NATS(t)
			nc := testenv.Connect(t, ns)
			d := startDispatcher(t, nc, Config{NoPrefixRouting: off})
			a := newFakeWorker(t, nc, "a", 100)
			c := newFakeWorker(t, nc, "c", 100)
			testenv.WaitFor(t, 2*time.Second, func() error {
				if n := d.Fleet().Serving("m"); n != 2 {
					return fmt.Errorf("%d workers", n)
				}
				return nil
			})
			sendBody(t, nc, "m", "r0", chatBody("m", longSystem, "question 0"))
			testenv.WaitFor(t, 2*time.Second, func() error {
				if a.count()+c.count() != 1 {
					return fmt.Errorf("not routed yet")
				}
				return nil
			})
			holder, other := a, c
			if c.count() == 1 {
				holder, other = c, a
			}
			// The other worker becomes the idle one; the holder has 1 in flight.
			for i := 1; i <= 3; i++ {
				sendBody(t, nc, "m", fmt.Sprintf("r%d", i), chatBody("m", longSystem, fmt.Sprintf("question %d", i)))
				if off {
					break
				}
				testenv.WaitFor(t, 2*time.Second, wantCount(holder, 1+i))
			}
			if off {
				testenv.WaitFor(t, 2*time.Second, wantCount(other, 1)) // by load: the idle one
				return
			}
			sendBody(t, nc, "m", "cold", chatBody("m", strings.ToUpper(longSystem), "question"))
			testenv.WaitFor(t, 2*time.Second, wantCount(other, 1))
		})
	}
}

// BenchmarkPromptHashes is the prompt keying of one request with a system
// prompt of about 5 KB (about 1200 tokens): finding the messages in the body
// and hashing its 64-byte blocks.
func BenchmarkPromptHashes(b *testing.B) {
	body := []byte(chatBody("m", strings.Repeat(longSystem, 5), "What is a cat?"))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if len(promptHashes(nil, "m", body, 64)) == 0 {
			b.Fatal("no hashes")
		}
	}
}

// A dispatcher follows the workers' KV events: a prompt it never routed goes
// to the worker whose events say it stored it, though that worker is busier.
func TestPrefixFromKVEvents(t *testing.T) {
	ns := testenv.NATS(t)
	nc := testenv.Connect(t, ns)
	d := startDispatcher(t, nc, Config{})
	a := newFakeWorker(t, nc, "a", 100)
	c := newFakeWorker(t, nc, "c", 100)
	a.beat(t, 3, 100)
	testenv.WaitFor(t, 2*time.Second, func() error {
		for _, w := range d.Fleet().Workers() {
			if w.Worker == "a" && w.Running == 3 {
				return nil
			}
		}
		return fmt.Errorf("a's beat not seen")
	})
	body := chatBody("m", longSystem, "question")
	ev, _ := json.Marshal(schemas.KVEvents{Worker: "a", BlockBytes: 64, Seq: 1,
		Stored: [][]uint64{promptHashes(nil, "m", []byte(body), 64)}})
	if err := nc.Publish(schemas.KVEventsSubject("a"), ev); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Second, func() error {
		if n := counterValue(d.m.kvEvents); n != 1 {
			return fmt.Errorf("%v events applied", n)
		}
		return nil
	})
	sendBody(t, nc, "m", "r1", body)
	testenv.WaitFor(t, 2*time.Second, wantCount(a, 1))
	if c.count() != 0 {
		t.Fatal("c got it")
	}
}

// The prediction a dispatcher sends with a request routed by prefix: none
// cached on its first sight, all of its full blocks on a repeat to the same
// worker; a client's forged header is overwritten, or removed where the
// request is routed by load alone (a short prompt, prefix routing off).
func TestPrefixPredictionHeader(t *testing.T) {
	body := chatBody("m", longSystem, "What is a cat?")
	span := len(schemas.PromptSpan([]byte(body)))
	full := span / 64 * 64
	tests := []struct {
		name string
		off  bool
		body string
		want []string // the header on each of two identical requests
	}{
		{"routed by prefix", false, body, []string{fmt.Sprintf("0/%d", span), fmt.Sprintf("%d/%d", full, span)}},
		{"prompt under a block", false, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, []string{"", ""}},
		{"prefix routing off", true, body, []string{"", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := testenv.NATS(t)
			nc := testenv.Connect(t, ns)
			d := startDispatcher(t, nc, Config{NoPrefixRouting: tt.off})
			w := newFakeWorker(t, nc, "a", 100)
			testenv.WaitFor(t, 2*time.Second, func() error {
				if n := d.Fleet().Serving("m"); n != 1 {
					return fmt.Errorf("%d workers", n)
				}
				return nil
			})
			for i := range tt.want {
				h := nats.Header{}
				h.Set(schemas.HdrRequestID, fmt.Sprintf("r%d", i))
				h.Set(schemas.HdrKind, "chat")
				h.Set(schemas.HdrPrefixCached, "999/1000") // forged
				if err := nc.PublishMsg(&nats.Msg{Subject: schemas.ReqSubject("m"), Reply: nats.NewInbox(), Header: h, Data: []byte(tt.body)}); err != nil {
					t.Fatal(err)
				}
				testenv.WaitFor(t, 2*time.Second, wantCount(w, i+1))
				w.mu.Lock()
				got := w.got[i].Header.Values(schemas.HdrPrefixCached)
				w.mu.Unlock()
				if tt.want[i] == "" && len(got) != 0 || tt.want[i] != "" && !slices.Equal(got, []string{tt.want[i]}) {
					t.Errorf("request %d: %s %q, want %q", i, schemas.HdrPrefixCached, got, tt.want[i])
				}
			}
		})
	}
}
