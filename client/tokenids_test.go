package client

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
)

// vllmChunks are a stream as vLLM writes it with return_token_ids (ids) or
// without (nulls), one frame payload per element ('\n' joins the chunks a
// frame carries): chat (a role chunk naming the prompt's ids, content
// chunks, a chunk of a token a parser held back, which vLLM sends only
// with ids, the last chunk with stop_reason, usage) or completions.
func vllmChunks(chat, ids bool) []string {
	v := func(s string) string {
		if ids {
			return s
		}
		return "null"
	}
	if chat {
		h := `{"id":"chatcmpl-r1","object":"chat.completion.chunk","created":9,"model":"m","choices":[`
		frames := []string{
			h + `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":` + v("[101,102,103]") + `}`,
			h + `{"index":0,"delta":{"content":"The"},"logprobs":null,"finish_reason":null,"token_ids":` + v("[5]") + `}]}` + "\n" +
				h + `{"index":0,"delta":{"content":" sea"},"logprobs":null,"finish_reason":null,"token_ids":` + v("[2001]") + `}]}`,
		}
		if ids {
			frames = append(frames, h+`{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[77]}]}`)
		}
		return append(frames,
			h+`{"index":0,"delta":{"content":" is"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":`+v("[3003]")+`}]}`+"\n"+
				`{"id":"chatcmpl-r1","object":"chat.completion.chunk","created":9,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`)
	}
	h := `{"id":"cmpl-r1","object":"text_completion","created":9,"model":"m","choices":[{"index":0,"text":`
	return []string{
		h + `"The","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":` + v("[101,102,103]") + `,"token_ids":` + v("[2000]") + `}]}`,
		h + `" sea","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":` + v("[2001,2002]") + `}]}`,
		h + `" is","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":` + v("[3]") + `}]}`,
	}
}

// A client that may migrate a stream asks for token ids (Tb-Token-Ids) on
// chat and completions requests whose body does not name return_token_ids,
// and its reader gets the stream byte for byte as vLLM writes it unasked:
// the ids null, the chunk that carried only ids gone; a reader that asked
// gets the ids as they came.
func TestTokenIDsStripped(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kind  schemas.Kind
		body  string
		asked bool
	}{
		{"chat", schemas.KindChat, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, false},
		{"completions", schemas.KindCompletion, `{"model":"m","stream":true,"prompt":"hi"}`, false},
		{"chat, asked", schemas.KindChat, `{"model":"m","stream":true,"return_token_ids":true,"messages":[{"role":"user","content":"hi"}]}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb, nc := newFakeBus(t)
			c, err := New(nc, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			st, err := c.Start(&Request{ID: "r1", Kind: tc.kind, Model: "m", Body: []byte(tc.body)})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			m := fb.next(t)
			if got, want := m.Header.Get(schemas.HdrTokenIDs), map[bool]string{false: "1", true: ""}[tc.asked]; got != want {
				t.Fatalf("%s: %q, want %q", schemas.HdrTokenIDs, got, want)
			}
			w := &fakeWorker{t: t, wc: fb.wc, reply: m.Reply, id: "w1"}
			w.accept("r1")
			chat := tc.kind == schemas.KindChat
			for _, p := range vllmChunks(chat, true) {
				w.send(schemas.FrameChunk, p)
			}
			w.send(schemas.FrameDone, `{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var got []string
			for {
				f, err := st.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if f.Type == schemas.FrameDone {
					break
				}
				got = append(got, string(f.Payload))
			}
			want := vllmChunks(chat, tc.asked)
			if strings.Join(got, "|") != strings.Join(want, "|") {
				t.Fatalf("the reader got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
	// Nothing asked: a body that names return_token_ids (the client's own
	// choice), a client that never migrates, a request that does not
	// generate.
	for _, tc := range []struct {
		r Request
		o Options
	}{
		{Request{Kind: schemas.KindChat, Body: []byte(`{"return_token_ids":false}`)}, Options{MigrationLimit: 3}},
		{Request{Kind: schemas.KindCompletion, Body: []byte(`{}`)}, Options{MigrationLimit: -1}},
		{Request{Kind: schemas.KindEmbedding, Body: []byte(`{}`)}, Options{MigrationLimit: 3}},
	} {
		if wantsTokenIDs(&tc.r, &tc.o) {
			t.Errorf("token ids asked for %s %s with %+v", tc.r.Kind, tc.r.Body, tc.o)
		}
	}
}

// A chat stream with token ids that loses its worker is continued from the
// ids: a completions request (Tb-Kind completion) whose prompt is the
// prompt's ids and the streamed tokens', max_tokens less those, the
// sampling parameters as they were; the continuation's completions chunks
// reach the reader as chat chunks in the shape of the stream's own (its
// keys in their order), stop_reason after finish_reason as vLLM's chat
// stream has it, the usage of the whole completion; the chunks of a
// stream whose content chunks had no text yet take vLLM's chat chunk shape.
func TestExactContinuation(t *testing.T) {
	const body = `{"model":"m","stream":true,"max_tokens":5,"temperature":0.5,"seed":3,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}],"x_extra":{"a":1}}`
	h := `{"id":"chatcmpl-r1","object":"chat.completion.chunk","created":9,"model":"m"`
	content := func(text, finish, ids string) string {
		stop := ""
		if finish != "null" {
			stop = `,"stop_reason":null`
		}
		return h + fmt.Sprintf(`,"x":1,"choices":[{"index":0,"delta":{"content":%q},"logprobs":null,"finish_reason":%s%s,"token_ids":%s}]}`, text, finish, stop, ids)
	}
	for _, tc := range []struct {
		name     string
		streamed []string // after the role chunk
		gen      string   // their ids
		shape    func(text, finish string) string
	}{
		{"after two tokens", []string{"The", " sea"}, "2000,2001", func(text, finish string) string { return content(text, finish, "null") }},
		{"after a token without text", []string{""}, "2000", func(text, finish string) string {
			stop := ""
			if finish != "null" {
				stop = `,"stop_reason":null`
			}
			return h + fmt.Sprintf(`,"choices":[{"index":0,"delta":{"content":%q},"logprobs":null,"finish_reason":%s%s,"token_ids":null}]}`, text, finish, stop)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb, nc := newFakeBus(t)
			c, err := New(nc, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			st, err := c.Start(&Request{ID: "r1", Kind: schemas.KindChat, Model: "m", Body: []byte(body)})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The reader runs as a gateway's does: failover happens in Next.
			type result struct {
				f   schemas.Frame
				err error
			}
			frames := make(chan result, 16)
			go func() {
				for {
					f, err := st.Next(ctx)
					frames <- result{f, err}
					if err != nil || f.Type == schemas.FrameDone {
						return
					}
				}
			}()
			var got []string
			next := func() schemas.Frame {
				t.Helper()
				r := <-frames
				if r.err != nil {
					t.Fatal(r.err)
				}
				if r.f.Type == schemas.FrameChunk {
					got = append(got, string(r.f.Payload))
				}
				return r.f
			}
			m1 := fb.next(t)
			w1 := &fakeWorker{t: t, wc: fb.wc, reply: m1.Reply, id: "w1"}
			w1.accept("r1")
			role := h + `,"x":1,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[101,102]}`
			w1.send(schemas.FrameChunk, role)
			next()
			for i, text := range tc.streamed {
				w1.send(schemas.FrameChunk, content(text, "null", fmt.Sprintf("[%d]", 2000+i)))
				next()
			}
			c.WorkerLost("w1", "gone")

			m2 := fb.next(t)
			n := len(tc.streamed)
			if m2.Header.Get(schemas.HdrKind) != string(schemas.KindCompletion) || m2.Header.Get(schemas.HdrResume) != fmt.Sprint(n) ||
				m2.Header.Get(schemas.HdrTokenIDs) != "1" {
				t.Fatalf("continuation headers %v", m2.Header)
			}
			wantBody := fmt.Sprintf(`{"max_tokens":%d,"model":"m","prompt":[101,102%s],"return_token_ids":true,"seed":3,"stream":true,"stream_options":{"include_usage":true},"temperature":0.5,"x_extra":{"a":1}}`,
				5-n, map[bool]string{true: "," + tc.gen, false: ""}[tc.gen != ""])
			if !sameJSON(string(m2.Data), wantBody) {
				t.Fatalf("continuation body %s\nwant %s", m2.Data, wantBody)
			}
			w2 := &fakeWorker{t: t, wc: fb.wc, reply: m2.Reply, id: "w2"}
			w2.accept("r1")
			ch := `{"id":"cmpl-r1","object":"text_completion","created":77,"model":"m","choices":[{"index":0,"text":%q,"logprobs":null,"finish_reason":%s,"stop_reason":null,"prompt_token_ids":%s,"token_ids":[%d]}]}`
			var want []string
			want = append(want, role[:strings.Index(role, `,"prompt_token_ids"`)]+`,"prompt_token_ids":null}`)
			for _, text := range tc.streamed {
				want = append(want, content(text, "null", "null"))
			}
			texts := []string{" red", " sky", " now", " then", " gone"}[:5-n]
			for i, text := range texts {
				finish, prompt := "null", "null"
				if i == len(texts)-1 {
					finish = `"length"`
				}
				if i == 0 {
					prompt = "[101,102]"
				}
				w2.send(schemas.FrameChunk, fmt.Sprintf(ch, text, finish, prompt, 3000+i))
				want = append(want, tc.shape(text, finish))
				next()
			}
			w2.send(schemas.FrameChunk, fmt.Sprintf(`{"id":"cmpl-r1","object":"text_completion","created":77,"model":"m","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":7}}`, 2+n, 5-n))
			want = append(want, `{"id":"chatcmpl-r1","object":"chat.completion.chunk","created":9,"model":"m","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":5,"total_tokens":7}}`)
			next()
			w2.send(schemas.FrameDone, fmt.Sprintf(`{"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":7}}`, 2+n, 5-n))
			if f := next(); f.Type != schemas.FrameDone || string(f.Payload) != `{"usage":{"prompt_tokens":2,"completion_tokens":5,"total_tokens":7}}` {
				t.Fatalf("done %s %s", f.Type, f.Payload)
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("the reader got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			// A second migration goes on from every id so far.
			var ids []int32
			ids = append(ids, st.fo.prompt...)
			ids = append(ids, st.fo.gen...)
			b, _ := json.Marshal(ids)
			if want := fmt.Sprintf("[101,102%s,3000", map[bool]string{true: "," + tc.gen, false: ""}[tc.gen != ""]); !strings.HasPrefix(string(b), want) {
				t.Fatalf("ids kept %s, want %s...", b, want)
			}
		})
	}
}

// A chat stream that had only its role chunk when its worker failed is
// sent again as it was (nothing was generated to continue from), and the
// new attempt's role chunk is left out: the reader sees one stream.
func TestRoleChunkOnlySentAgain(t *testing.T) {
	const body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	fb, nc := newFakeBus(t)
	c, err := New(nc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Start(&Request{ID: "r1", Kind: schemas.KindChat, Model: "m", Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m1 := fb.next(t)
	w1 := &fakeWorker{t: t, wc: fb.wc, reply: m1.Reply, id: "w1", chat: "chatcmpl-1"}
	w1.accept("r1")
	w1.chunk(`{"role":"assistant","content":""}`)
	if f, err := st.Next(ctx); err != nil || f.Type != schemas.FrameChunk {
		t.Fatal(f, err)
	}
	frames := make(chan string, 4)
	go func() {
		for {
			f, err := st.Next(ctx)
			if err != nil || f.Type == schemas.FrameDone {
				close(frames)
				return
			}
			frames <- string(f.Payload)
		}
	}()
	c.WorkerLost("w1", "gone")
	m2 := fb.next(t)
	if string(m2.Data) != body || m2.Header.Get(schemas.HdrKind) != "chat" || m2.Header.Get(schemas.HdrResume) != "" {
		t.Fatalf("sent again: %v %s", m2.Header, m2.Data)
	}
	w2 := &fakeWorker{t: t, wc: fb.wc, reply: m2.Reply, id: "w2", chat: "chatcmpl-2"}
	w2.accept("r1")
	w2.chunk(`{"role":"assistant","content":""}`)
	w2.token("Hi")
	w2.finish(3, 1)
	var got []string
	for p := range frames {
		got = append(got, p)
	}
	want := []string{
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the reader got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The stripping on its own, frame by frame: in place when null is no
// longer than the array, a chunk that carried only ids left out with its
// line break, a payload of such chunks alone empty.
func TestTokensInPlace(t *testing.T) {
	const (
		h       = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,`
		role    = h + `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[11,12]}`
		tok     = h + `"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"token_ids":%s}]}`
		idsOnly = h + `"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[99]}]}`
	)
	fo := &failover{strip: true}
	nulled := strings.Replace(role, "[11,12]", "null", 1)
	p := []byte(role + "\n" + fmt.Sprintf(tok, "[2000]") + "\n" + idsOnly)
	out := fo.tokens(p, true)
	if want := nulled + "\n" + fmt.Sprintf(tok, "null"); string(out) != want || &out[0] != &p[0] {
		t.Fatalf("got %s\nwant %s (in place: %v)", out, want, &out[0] == &p[0])
	}
	p = []byte(fmt.Sprintf(tok, "[7]"))
	if out := fo.tokens(p, true); string(out) != fmt.Sprintf(tok, "null") {
		t.Fatalf("a one-digit id: %s", out)
	}
	if out := fo.tokens([]byte(idsOnly), true); len(out) != 0 {
		t.Fatalf("a payload of a chunk of ids alone: %q", out)
	}
	if fmt.Sprint(fo.prompt, fo.gen) != "[11 12] [2000 99 7 99]" {
		t.Fatalf("recorded %v %v", fo.prompt, fo.gen)
	}
}
