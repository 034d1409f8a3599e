package gateway

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// smuggled is what each case sends after its request: a second, complete
// request. A server that reads it from the leftover bytes answers it.
const smuggled = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"

// sendUntilClosed sends raw on a fresh connection and reads until the server
// closes it (or the deadline, which fails the test).
func sendUntilClosed(t *testing.T, addr, raw string) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open 5s after the answer (read so far: %q)", got)
	}
	return string(got)
}

// Each smuggling shape: a 400 in OpenAI's shape, then the connection closes
// with the bytes after the request unread (no second response).
func TestSmugglingShapes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	addr := strings.TrimPrefix(h.base, "http://")
	const body = `{"model":"` + testModel + `","prompt":"hello!!!"}` // 40 bytes
	head := "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	for _, tc := range []struct {
		name, headers string
	}{
		{"conflicting Content-Length", "Content-Length: 40\r\nContent-Length: 5\r\n"},
		{"conflicting Content-Length, longer last", "Content-Length: 40\r\nContent-Length: 72\r\n"},
		{"repeated identical Content-Length", "Content-Length: 40\r\nContent-Length: 40\r\n"},
		{"Content-Length list", "Content-Length: 40, 40\r\n"},
		{"Transfer-Encoding and Content-Length", "Transfer-Encoding: chunked\r\nContent-Length: 40\r\n"},
		{"Content-Length and Transfer-Encoding", "Content-Length: 40\r\nTransfer-Encoding: chunked\r\n"},
		{"Transfer-Encoding gzip, chunked", "Transfer-Encoding: gzip, chunked\r\n"},
		{"Transfer-Encoding twice", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"},
		{"Transfer-Encoding identity", "Transfer-Encoding: identity\r\nContent-Length: 40\r\n"},
		{"Transfer-Encoding xchunked", "Transfer-Encoding: xchunked\r\n"},
		{"Content-Length with plus", "Content-Length: +40\r\n"},
		{"Content-Length negative", "Content-Length: -40\r\n"},
		{"Content-Length hex", "Content-Length: 0x28\r\n"},
		{"Content-Length inner space", "Content-Length: 4 0\r\n"},
		{"Content-Length overflow", "Content-Length: 99999999999999999999999\r\n"},
		{"Content-Length 19 digits", "Content-Length: 0000000000000000040\r\n"},
		{"space before colon", "Content-Length : 40\r\n"},
		{"obs-fold", "Content-Length: 40\r\nX-Note: a\r\n b\r\n"},
		{"obs-fold tab", "Content-Length: 40\r\nX-Note: a\r\n\tb\r\n"},
		{"folded Content-Length", "Content-Length:\r\n 40\r\n"},
		{"bare CR in a header", "X-Note: a\rContent-Length: 5\r\nContent-Length: 40\r\n"},
		{"bare CR ends a header", "Content-Length: 40\r\nX-Note: a\r\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := sendUntilClosed(t, addr, head+tc.headers+"\r\n"+body+smuggled)
			if !strings.HasPrefix(got, "HTTP/1.1 400 ") {
				t.Fatalf("status line: %q", firstLine(got))
			}
			if n := strings.Count(got, "HTTP/1.1 "); n != 1 {
				t.Fatalf("%d responses, want 1 (the leftover bytes were read as a request): %q", n, got)
			}
			if !strings.Contains(got, `"code":"bad_request"`) {
				t.Fatalf("not the bad_request error: %q", got)
			}
		})
	}
	// The control: the same bytes with one honest Content-Length are two
	// requests, both answered, so a case above that was served would show.
	t.Run("control", func(t *testing.T) {
		got := sendUntilClosed(t, addr, head+"Content-Length: 40\r\n\r\n"+body+
			strings.Replace(smuggled, "\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1))
		if n := strings.Count(got, "HTTP/1.1 200 "); n != 2 {
			t.Fatalf("%d responses 200, want 2: %q", n, got)
		}
	})
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\r\n")
	return line
}

func TestRawFramingProblem(t *testing.T) {
	for raw, want := range map[string]string{
		"Host: x\r\nContent-Length: 5\r\n\r\n":              "",
		"Host: x\nContent-Length: 5\n\n":                    "",
		"Transfer-Encoding: Chunked\r\n\r\n":                "",
		"Content-Length: 5\r\ncontent-length: 5\r\n":        "repeated Content-Length",
		"Content-Length: \r\n":                              "invalid Content-Length",
		"Transfer-Encoding: chunked\r\nContent-Length: 5\n": "Transfer-Encoding with Content-Length",
		"X: a\r\n\tb\r\n":                                   "folded header line (obs-fold)",
		"X: a\rb\r\n":                                       "bare CR in a header",
	} {
		if got := rawFramingProblem([]byte(raw)); got != want {
			t.Errorf("%q: %q, want %q", raw, got, want)
		}
	}
}

// The original finding: a malformed header line made a 400 that quoted the
// raw request (Authorization included) in its body and its log line, which
// also said GET for a POST.
func TestUnparsableRequestQuotesNothing(t *testing.T) {
	var logBuf testenv.Buffer
	g := New(Config{}, nil, &fakeCatalog{}, nil, nil, slog.New(slog.NewJSONHandler(&logBuf, nil)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(func() { _ = g.Shutdown(context.Background()) })
	const secret = "tb-QUOTEDSECRET0123456789abcdefghijklmnop"
	got := sendUntilClosed(t, ln.Addr().String(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+secret+
		"\r\nThis is no header line\r\nContent-Length: 2\r\n\r\n{}")
	if !strings.HasPrefix(got, "HTTP/1.1 400 ") || !strings.Contains(got, `"message":"The HTTP request is malformed: invalid header."`) {
		t.Fatalf("answer: %q", got)
	}
	for _, part := range []string{"QUOTEDSECRET", "Authorization", "no header line"} {
		if strings.Contains(got, part) || strings.Contains(logBuf.String(), part) {
			t.Errorf("%q in the answer or the log:\n%s\n%s", part, got, logBuf.String())
		}
	}
	lines, err := testenv.ParseJSONLog([]byte(logBuf.String()))
	if err != nil || len(lines) != 1 || lines[0]["method"] != "-" || lines[0]["status"] != float64(400) {
		t.Fatalf("log: %v %s", err, logBuf.String())
	}
}

// BenchmarkEdgeChecks: what every request now pays at the edge: the framing
// check of a typical OpenAI SDK request's headers (FramingHook), and the
// redactor on its request id and model.
func BenchmarkEdgeChecks(b *testing.B) {
	var req fasthttp.Request
	raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: api.example.com\r\nAccept: application/json\r\n" +
		"Accept-Encoding: gzip, deflate\r\nAuthorization: Bearer tb-8KnEpMW92qRP4tlTGqy1gLtY_JCabi2i1huyt5WxmS0\r\n" +
		"Content-Type: application/json\r\nUser-Agent: OpenAI/Python 1.99.0\r\nX-Stainless-Lang: python\r\n" +
		"X-Stainless-Package-Version: 1.99.0\r\nX-Stainless-Os: Linux\r\nX-Stainless-Arch: x64\r\n" +
		"X-Stainless-Runtime: CPython\r\nX-Stainless-Runtime-Version: 3.12.3\r\nX-Stainless-Retry-Count: 0\r\n" +
		"X-Request-Id: 6c1f7a0e-1f7b-4d1e-9b9a-3f1d2c3b4a5e\r\nContent-Length: 2\r\n\r\n{}"
	if err := req.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	r := NewRedactor("admin-token-0123456789", "nats-password-0123456789")
	b.ReportAllocs()
	for b.Loop() {
		FramingHook(&req.Header)
		_ = r.String("6c1f7a0e-1f7b-4d1e-9b9a-3f1d2c3b4a5e")
		_ = r.String("llama-8b")
	}
	if req.Header.ConnectionClose() {
		b.Fatal("a clean request was marked")
	}
}

// A method Fiber does not know gets OpenAI's 400 (Fiber's own is plain
// text), the connection closed.
func TestUnknownMethod(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	got := sendUntilClosed(t, strings.TrimPrefix(h.base, "http://"), "BREW /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"+smuggled)
	if !strings.HasPrefix(got, "HTTP/1.1 400 ") || !strings.Contains(got, `"code":"bad_request"`) ||
		!strings.Contains(got, "unknown method") || strings.Count(got, "HTTP/1.1 ") != 1 {
		t.Fatalf("answer: %q", got)
	}
}
