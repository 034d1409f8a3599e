package batch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/schemas"
)

func openStore(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(context.Background(), testenv.Connect(t, testenv.NATS(t)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const okLine = `{"custom_id":"%s","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]}}`

func line(id string) string { return fmt.Sprintf(okLine, id) }

// Validation answers a bad input file as OpenAI does: failed, with one
// entry per bad line in errors.data (code, param, 1-based line).
func TestValidation(t *testing.T) {
	s := openStore(t, Config{MaxLines: 3, MaxLineBytes: 200})
	ctx := context.Background()
	for _, tc := range []struct {
		name, file string
		allowed    func(string) (bool, error)
		want       []string // code@line (param)
		total      int
	}{
		{"good", line("a") + "\n" + line("b") + "\n\n", nil, nil, 2},
		{"no trailing newline", line("a") + "\n" + line("b"), nil, nil, 2},
		{"bad JSON", line("a") + "\n{nope\n", nil, []string{"invalid_json_line@2"}, 2},
		{"no custom_id", `{"method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}`, nil,
			[]string{"missing_required_parameter@1(custom_id)"}, 1},
		{"custom_id not a string", `{"custom_id":7,"method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}`, nil,
			[]string{"invalid_type@1(custom_id)"}, 1},
		{"duplicate custom_id", line("a") + "\n" + line("a") + "\n", nil, []string{"duplicate_custom_id@2(custom_id)"}, 2},
		{"wrong url", strings.Replace(line("a"), "/v1/chat/completions", "/v1/completions", 1), nil,
			[]string{"invalid_url@1(url)"}, 1},
		{"method", strings.Replace(line("a"), "POST", "GET", 1), nil, []string{"invalid_method@1(method)"}, 1},
		{"no model", `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}`, nil,
			[]string{"missing_required_parameter@1(body.model)"}, 1},
		{"two models", line("a") + "\n" + strings.Replace(line("b"), `"m"`, `"other"`, 1), nil,
			[]string{"mismatched_model@2(body.model)"}, 2},
		{"stream", strings.Replace(line("a"), `"model":"m"`, `"model":"m","stream":true`, 1), nil,
			[]string{"invalid_value@1(body.stream)"}, 1},
		{"model not allowed", line("a"), func(string) (bool, error) { return false, nil },
			[]string{"model_not_allowed@1(body.model)"}, 1},
		{"too many lines", line("a") + "\n" + line("b") + "\n" + line("c") + "\n" + line("d") + "\n", nil,
			[]string{"too_many_requests@0"}, 4},
		{"line too long", line(strings.Repeat("x", 300)) + "\n" + line("b"), nil, []string{"line_too_large@1"}, 2},
		{"empty", "\n\n", nil, []string{"empty_file@0(input_file_id)"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := s.PutFile(ctx, "t", "in.jsonl", "batch", strings.NewReader(tc.file), 0)
			if err != nil {
				t.Fatal(err)
			}
			c, err := s.check(ctx, record{Batch: Batch{ID: "batch_x", InputFileID: f.ID, Endpoint: "/v1/chat/completions"}}, tc.allowed)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range c.errs {
				s := e.Code + "@"
				if e.Line != nil {
					s += fmt.Sprint(*e.Line)
				} else {
					s += "0"
				}
				if e.Param != nil {
					s += "(" + *e.Param + ")"
				}
				got = append(got, s)
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") || c.total != tc.total {
				t.Fatalf("errors %v total %d, want %v total %d", got, c.total, tc.want, tc.total)
			}
			if tc.want == nil && c.model != "m" {
				t.Fatalf("model %q", c.model)
			}
		})
	}
}

// Files and batches belong to a tenant: another tenant gets 404, as for
// an id that does not exist; an upload over its limit is refused and not kept.
func TestTenancyAndLimits(t *testing.T) {
	s := openStore(t, Config{})
	ctx := context.Background()
	f, err := s.PutFile(ctx, "acme", "in.jsonl", "batch", strings.NewReader(line("a")), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.File(ctx, "other", f.ID); !schemas.ErrFileNotFound.Is(schemas.AsError(err)) {
		t.Fatalf("another tenant's file: %v", err)
	}
	if err := s.DeleteFile(ctx, "other", f.ID); !schemas.ErrFileNotFound.Is(schemas.AsError(err)) {
		t.Fatalf("delete another tenant's file: %v", err)
	}
	if l, err := s.Files(ctx, "other", ListQuery{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("another tenant's list: %+v %v", l, err)
	}
	if _, err := s.CreateBatch(ctx, "other", "", CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions",
		CompletionWindow: "24h"}); !schemas.ErrFileNotFound.Is(schemas.AsError(err)) {
		t.Fatalf("a batch on another tenant's file: %v", err)
	}
	b, err := s.CreateBatch(ctx, "acme", "", CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"get":    func() error { _, err := s.Batch(ctx, "other", b.ID); return err },
		"cancel": func() error { _, err := s.CancelBatch(ctx, "other", b.ID); return err },
	} {
		if err := call(); !schemas.ErrBatchNotFound.Is(schemas.AsError(err)) {
			t.Fatalf("%s another tenant's batch: %v", name, err)
		}
	}
	if l, err := s.Batches(ctx, "acme", ListQuery{}); err != nil || len(l.Data) != 1 || l.Data[0].ID != b.ID {
		t.Fatalf("own list: %+v %v", l, err)
	}

	_, err = s.PutFile(ctx, "acme", "big.jsonl", "batch", strings.NewReader(strings.Repeat("x", 1000)), 999)
	if !schemas.ErrFileTooLarge.Is(schemas.AsError(err)) {
		t.Fatalf("over the limit: %v", err)
	}
	if l, _ := s.Files(ctx, "acme", ListQuery{}); len(l.Data) != 1 {
		t.Fatalf("files after a refused upload: %d, want 1", len(l.Data))
	}
}

// Create checks the request itself before any batch exists.
func TestCreateChecks(t *testing.T) {
	for _, tc := range []struct {
		req   CreateRequest
		param string
	}{
		{CreateRequest{Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, "input_file_id"},
		{CreateRequest{InputFileID: "f", CompletionWindow: "24h"}, "endpoint"},
		{CreateRequest{InputFileID: "f", Endpoint: "/v1/images", CompletionWindow: "24h"}, "endpoint"},
		{CreateRequest{InputFileID: "f", Endpoint: "/v1/completions", CompletionWindow: "1h"}, "completion_window"},
	} {
		err := tc.req.Check()
		var e *schemas.Error
		if !errors.As(err, &e) || e.Status != 400 || e.Body.Param == nil || *e.Body.Param != tc.param {
			t.Errorf("%+v: %v, want a 400 about %s", tc.req, err, tc.param)
		}
	}
}

// Pages are newest first, after the given id.
func TestPaging(t *testing.T) {
	items := []Batch{{ID: "b1", CreatedAt: 1}, {ID: "b2", CreatedAt: 2}, {ID: "b3", CreatedAt: 3}}
	key := func(b Batch) (int64, string) { return b.CreatedAt, b.ID }
	page, more := pageOf(items, ListQuery{Limit: 2}, 100, key)
	if len(page) != 2 || page[0].ID != "b3" || page[1].ID != "b2" || !more {
		t.Fatalf("first page %v more %v", page, more)
	}
	page, more = pageOf(items, ListQuery{Limit: 2, After: "b2"}, 100, key)
	if len(page) != 1 || page[0].ID != "b1" || more {
		t.Fatalf("second page %v more %v", page, more)
	}
}

// A custom_id may hold any character; its result's Nats-Msg-Id holds no
// line break (it would break the headers) and stays one per custom_id.
func TestResultMsgID(t *testing.T) {
	a, b := resultMsgID("batch_x", "a\r\nb"), resultMsgID("batch_x", "a b")
	if strings.ContainsAny(a, "\r\n") || a == b || !strings.HasPrefix(a, "batch_x/") {
		t.Fatalf("%q %q", a, b)
	}
}

// Why a line does not run: cancelled first, then past its window.
func TestEnding(t *testing.T) {
	now := time.Unix(1000, 0)
	past, future := int64(999), int64(2000)
	for _, tc := range []struct {
		rec  record
		want string
	}{
		{record{Batch: Batch{Status: StatusInProgress, ExpiresAt: &future}}, ""},
		{record{Batch: Batch{Status: StatusInProgress, ExpiresAt: &past}}, "batch_expired"},
		{record{Batch: Batch{Status: StatusCancelling, ExpiresAt: &past}}, "batch_cancelled"},
	} {
		if got := ending(tc.rec, now); got != tc.want {
			t.Errorf("%s expiring %d: %q, want %q", tc.rec.Status, *tc.rec.ExpiresAt, got, tc.want)
		}
	}
}
