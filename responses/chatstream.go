package responses

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

// SubmitChat stores and queues a resumable chat stream of tenant, to end
// by deadline; body is the client's chat request (stream: true). id is
// the stream's (NewChatID), so that its follow can be opened first.
func (s *Store) SubmitChat(ctx context.Context, id, tenant, keyID string, reserved int, window int64, model string, body []byte, deadline time.Time) error {
	rec := &Record{Kind: KindChat, Tenant: tenant, KeyID: keyID, Reserved: reserved, Window: window, Body: body, Input: []Item{},
		Deadline: deadline.UnixMilli(),
		Response: Response{ID: id, Object: "chat.completion.stream", CreatedAt: time.Now().Unix(), Status: StatusQueued, Model: model}}
	return s.Submit(ctx, rec)
}

// NewChatID is a new resumable chat stream's id.
func NewChatID() string { return ChatStreamPrefix + nuid.Next() }

// ChatStream checks that id is a resumable chat stream of tenant.
func (s *Store) ChatStream(ctx context.Context, tenant, id string) (*Record, uint64, error) {
	rec, rev, err := s.get(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	if rec.Tenant != tenant || rec.Kind != KindChat {
		return nil, 0, schemas.ErrResponseNotFound.New(id)
	}
	return rec, rev, nil
}

// ChatState is what POST /v1/chat/completions/{id}/cancel answers.
type ChatState struct {
	ID        string `json:"id"`
	Object    string `json:"object"` // "chat.completion.stream"
	CreatedAt int64  `json:"created_at"`
	Model     string `json:"model"`
	Status    string `json:"status"`
}

// CancelChat ends a resumable chat stream of tenant: its record cancelled,
// then an error line (stream_cancelled) appended after its last one, so
// that the runner generating it fails its next append and stops (closing
// its request, which cancels it at the worker), and every follower ends.
func (s *Store) CancelChat(ctx context.Context, tenant, id string) (*ChatState, error) {
	for range 10 {
		rec, rev, err := s.ChatStream(ctx, tenant, id)
		if err != nil {
			return nil, err
		}
		state := func() *ChatState {
			r := rec.Response
			return &ChatState{ID: r.ID, Object: r.Object, CreatedAt: r.CreatedAt, Model: r.Model, Status: r.Status}
		}
		if Ended(rec.Response.Status) {
			if rec.Response.Status == StatusCancelled {
				return state(), nil
			}
			return nil, schemas.ErrResponseState.New("Cannot cancel a stream with status '" + rec.Response.Status + "'.")
		}
		last, err := s.lastEvent(ctx, id)
		if err != nil {
			return nil, unavailable(err)
		}
		if last > 0 {
			m, err := s.events.GetMsg(ctx, last)
			if err != nil {
				return nil, unavailable(err)
			}
			if chatEnd(m.Data) {
				// Ended (the runner sets the record right after).
				return nil, schemas.ErrResponseState.New("Cannot cancel a stream that has ended.")
			}
		}
		rec.Response.Status = StatusCancelled
		if _, err := s.update(ctx, rec, rev); err != nil {
			continue // changed meanwhile: read again
		}
		line := schemas.ErrStreamCancelled.New(id).JSON()
		for range 10 {
			// The runner appends meanwhile: after its line, then.
			if _, err = s.appendRaw(ctx, id, line, 0, last); !errors.Is(err, errConflict) { // lines count from 1: 0 is the cancel's
				break
			}
			if last, err = s.lastEvent(ctx, id); err != nil {
				break
			}
		}
		if err != nil {
			return nil, unavailable(err)
		}
		return state(), nil
	}
	return nil, schemas.ErrResponsesOff.New("the stream kept changing")
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
	err = s.stored(ctx, id, lastMsg, func(seq uint64, data []byte) {
		st.n++
		st.last = seq
		st.ended = chatEnd(data)
		if t, ok := chunkText(data); ok {
			st.text.WriteString(t)
			st.tokens++
		}
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

// roleOnly: a chunk with no text, reasoning, tool call, finish reason or usage (a
// continuation's first chunk, which the client already had).
func roleOnly(line []byte) bool {
	var ch chatChunk
	if json.Unmarshal(line, &ch) != nil || ch.Usage != nil || len(ch.Choices) != 1 {
		return false
	}
	c := ch.Choices[0]
	return (c.Delta.Content == nil || *c.Delta.Content == "") && reasoningText(c.Delta.ReasoningContent, c.Delta.Reasoning) == "" &&
		len(c.Delta.ToolCalls) == 0 && (c.FinishReason == nil || *c.FinishReason == "")
}

// endChat appends line e after the stored lines of chat stream id, unless
// they have ended; ended says whether they had.
func (r *Runner) endChat(ctx context.Context, id string, e *schemas.Error) (ended bool, err error) {
	st, err := r.s.replayChat(ctx, id)
	if err != nil || st.ended {
		return st != nil && st.ended, err
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err = r.s.appendRaw(actx, id, e.JSON(), st.n+1, st.last)
	return false, err
}

// runChat generates (the rest of) a resumable chat stream; status is how
// it ended: completed, or failed with an error line (its deadline, its key
// revoked, an engine's error).
func (r *Runner) runChat(ctx context.Context, rec *Record) (status string, err error) {
	id := rec.Response.ID
	st, err := r.s.replayChat(ctx, id)
	if err != nil {
		return "", err
	}
	if st.ended {
		return StatusCompleted, nil
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
	fail := func(e *schemas.Error) (string, error) { return StatusFailed, add(e.JSON()) }
	if e := endCause(ctx); e != nil {
		return fail(e) // its key was deleted, or its time was up, before it started
	}
	body, resumed := rec.Body, st.tokens > 0
	if resumed {
		var done bool
		if body, done, err = continued(rec.Body, st.text.String(), st.tokens); err != nil || done {
			if err != nil {
				return fail(schemas.ErrInternal.New("the stream could not be continued"))
			}
			return StatusCompleted, add([]byte(chatDone))
		}
	}
	deadline, _ := ctx.Deadline()
	cs, err := r.cl.Start(&client.Request{ID: id + "_" + strconv.Itoa(st.n), Kind: schemas.KindChat, Model: rec.Response.Model,
		Body: body, Deadline: deadline, Tenant: rec.Tenant})
	if err != nil {
		return fail(schemas.AsError(err))
	}
	defer cs.Close()
	for {
		f, err := cs.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				if e := endCause(ctx); e != nil {
					return fail(e)
				}
				return "", context.Cause(ctx) // the runner stops: another continues it
			}
			return fail(schemas.AsError(err))
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
				return "", err
			}
		case schemas.FrameDone:
			if u := schemas.UsageOf(f.Payload); u != nil && r.cfg.OnUsage != nil {
				r.cfg.OnUsage(schemas.UsageRecord{RequestID: id, KeyID: rec.KeyID, Tenant: rec.Tenant, Model: rec.Response.Model, Usage: *u,
					Reserved: rec.Reserved, Window: rec.Window})
			}
			return StatusCompleted, add([]byte(chatDone))
		}
	}
}
