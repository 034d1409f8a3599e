package responses

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/client"
	"github.com/tokenbus/tokenbus/schemas"
)

// Resumable chat streams: a /v1/chat/completions stream the client opted
// into (the gateway's Tokenbus-Resumable header) runs like a background
// response. A runner generates it and appends each chunk line to
// EventPrefix+<id> under the same one-writer rule; any gateway follows
// it. Event n (from 1) is SSE id "<id>:<n>", so that a client
// reconnecting with Last-Event-ID, to any gateway, gets what follows. The
// last event is [DONE] or an error object.

// Resumable chat stream ids are ChatStreamPrefix and letters or digits.
const ChatStreamPrefix = "cs_"

// KindChat is a Record's Kind for a resumable chat stream.
const KindChat = "chat"

const chatDone = "[DONE]"

// SubmitChat stores and queues a resumable chat stream of tenant; body is
// the client's chat request (stream: true).
func (s *Store) SubmitChat(ctx context.Context, tenant, keyID string, reserved int, window int64, model string, body []byte) (string, error) {
	id := ChatStreamPrefix + nuid.Next()
	rec := &Record{Kind: KindChat, Tenant: tenant, KeyID: keyID, Reserved: reserved, Window: window, Body: body, Input: []Item{},
		Response: Response{ID: id, Object: "chat.completion.stream", CreatedAt: time.Now().Unix(), Status: StatusQueued, Model: model}}
	return id, s.Submit(ctx, rec)
}

// ChatStream checks that id is a resumable chat stream of tenant.
func (s *Store) ChatStream(ctx context.Context, tenant, id string) error {
	rec, _, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	if rec.Tenant != tenant || rec.Kind != KindChat {
		return schemas.ErrResponseNotFound.New(id)
	}
	return nil
}

// FollowChat calls fn with each line of chat stream id after the after-th
// (n counts from 1), stored ones then live ones, until [DONE] or an error
// line (both given to fn), fn's error or ctx's end.
func (s *Store) FollowChat(ctx context.Context, id string, after int, fn func(n int, line []byte) error) error {
	n := 0
	return s.follow(ctx, id, func(_ uint64, data []byte) (bool, error) {
		n++
		if n > after {
			if err := fn(n, data); err != nil {
				return true, err
			}
		}
		return chatEnd(data), nil
	})
}

// ChatDone is the line that ends a chat stream.
func ChatDone(line []byte) bool { return string(line) == chatDone }

func chatEnd(data []byte) bool {
	return string(data) == chatDone || bytes.HasPrefix(data, []byte(`{"error"`))
}

// chatState is what the stored lines of a chat stream say.
type chatState struct {
	n      int // lines
	last   uint64
	text   strings.Builder
	tokens int
	ended  bool
}

func (s *Store) replayChat(ctx context.Context, id string) (*chatState, error) {
	st := &chatState{}
	lastMsg, err := s.lastEvent(ctx, id)
	if err != nil || lastMsg == 0 {
		return st, err
	}
	err = s.follow(ctx, id, func(seq uint64, data []byte) (bool, error) {
		st.n++
		st.last = seq
		st.ended = chatEnd(data)
		if t, ok := chunkText(data); ok {
			st.text.WriteString(t)
			st.tokens++
		}
		return seq >= lastMsg, nil
	})
	return st, err
}

// chunkText is the text of a chat chunk line; ok when it has some.
func chunkText(line []byte) (string, bool) {
	var ch chatChunk
	if json.Unmarshal(line, &ch) != nil || len(ch.Choices) == 0 || ch.Choices[0].Delta.Content == nil || *ch.Choices[0].Delta.Content == "" {
		return "", false
	}
	return *ch.Choices[0].Delta.Content, true
}

// roleOnly: a chunk with no text, tool call, finish reason or usage (a
// continuation's first chunk, which the client already had).
func roleOnly(line []byte) bool {
	var ch chatChunk
	if json.Unmarshal(line, &ch) != nil || ch.Usage != nil || len(ch.Choices) != 1 {
		return false
	}
	c := ch.Choices[0]
	return (c.Delta.Content == nil || *c.Delta.Content == "") && len(c.Delta.ToolCalls) == 0 && (c.FinishReason == nil || *c.FinishReason == "")
}

// runChat generates (the rest of) a resumable chat stream.
func (r *Runner) runChat(ctx context.Context, rec *Record) error {
	id := rec.Response.ID
	st, err := r.s.replayChat(ctx, id)
	if err != nil || st.ended {
		return err
	}
	add := func(line []byte) error {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		seq, err := r.s.appendRaw(actx, id, line, st.n+1, st.last)
		if err != nil {
			return err
		}
		st.n, st.last = st.n+1, seq
		return nil
	}
	body, resumed := rec.Body, st.tokens > 0
	if resumed {
		var done bool
		if body, done, err = continued(rec.Body, st.text.String(), st.tokens); err != nil || done {
			if err != nil {
				return add(schemas.ErrInternal.New("the stream could not be continued").JSON())
			}
			return add([]byte(chatDone))
		}
	}
	deadline, _ := ctx.Deadline()
	cs, err := r.cl.Start(&client.Request{ID: id + "_" + strconv.Itoa(st.n), Kind: schemas.KindChat, Model: rec.Response.Model,
		Body: body, Deadline: deadline, Tenant: rec.Tenant})
	if err != nil {
		return add(schemas.AsError(err).JSON())
	}
	defer cs.Close()
	for {
		f, err := cs.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return add(schemas.AsError(err).JSON())
		}
		switch f.Type {
		case schemas.FrameChunk:
			err := schemas.ForEachLine(f.Payload, func(line []byte) error {
				if resumed && roleOnly(line) {
					return nil
				}
				return add(bytes.Clone(line))
			})
			if err != nil {
				return err
			}
		case schemas.FrameDone:
			if u := schemas.UsageOf(f.Payload); u != nil && r.cfg.OnUsage != nil {
				r.cfg.OnUsage(schemas.UsageRecord{RequestID: id, KeyID: rec.KeyID, Tenant: rec.Tenant, Model: rec.Response.Model, Usage: *u,
					Reserved: rec.Reserved, Window: rec.Window})
			}
			return add([]byte(chatDone))
		}
	}
}
