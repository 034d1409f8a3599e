//go:build unix

package httpstream

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/schemas"
)

// loopbackEnv, when set to "addr conns", makes the test binary the load
// generator of BenchmarkLoopbackStream instead of running tests: a separate
// process, so that the benchmark's CPU figure is the server's alone.
const loopbackEnv = "TB_LOOPBACK_CLIENT"

func TestMain(m *testing.M) {
	if spec := os.Getenv(loopbackEnv); spec != "" {
		os.Exit(loopbackClient(spec))
	}
	os.Exit(m.Run())
}

// loopbackClient keeps conns keep-alive connections busy with stream
// requests, each read to its end, until its stdin closes.
func loopbackClient(spec string) int {
	addr, n, _ := strings.Cut(spec, " ")
	conns, err := strconv.Atoi(n)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad", loopbackEnv, spec)
		return 2
	}
	stop := make(chan struct{})
	errc := make(chan error, conns)
	for range conns {
		go func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errc <- err
				return
			}
			defer c.Close()
			r := bufio.NewReaderSize(c, 64<<10)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := io.WriteString(c, "GET /stream HTTP/1.1\r\nHost: bench\r\n\r\n"); err != nil {
					errc <- err
					return
				}
				resp, err := http.ReadResponse(r, nil)
				if err != nil {
					errc <- err
					return
				}
				_, err = io.Copy(io.Discard, resp.Body)
				if err != nil || resp.StatusCode != 200 || resp.Close {
					errc <- fmt.Errorf("response %d close=%v: %v", resp.StatusCode, resp.Close, err)
					return
				}
			}
		}()
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	select {
	case <-stop:
		return 0
	case err := <-errc:
		fmt.Fprintln(os.Stderr, "loopback client:", err)
		return 1
	}
}

// chunkCounter counts the chunks the server wrote and signals when it
// reaches a target.
type chunkCounter struct {
	n      atomic.Int64
	target atomic.Int64
	hit    chan struct{}
	once   sync.Once
}

func (c *chunkCounter) add(k int) {
	n := c.n.Add(int64(k))
	if t := c.target.Load(); t > 0 && n >= t {
		c.once.Do(func() { close(c.hit) })
	}
}

// loopbackScenario is how a stream's chunks reach the writer, in frames of
// burst chunks each. Paced: a bus goroutine hands every open stream one
// frame per millisecond, as the client's demultiplexer hands frames to each
// request's Stream when tokens trickle (each frame is flushed on its own).
// Not paced: a goroutine per stream hands over frames as fast as the writer
// takes them, through a queue of 16, as with a zero-latency engine (the
// writer flushes only when nothing waits).
type loopbackScenario struct {
	name  string
	burst int
	paced bool
}

// loopbackChunks is the number of chunks of one streamed response.
const loopbackChunks = 64

// loopbackBus feeds the streams of one benchmark.
type loopbackBus struct {
	sc      loopbackScenario
	payload []byte
	mu      sync.Mutex
	open    []*loopbackFeed
	stop    chan struct{}
}

type loopbackFeed struct {
	ch   chan []byte
	left int
}

func newLoopbackBus(sc loopbackScenario) *loopbackBus {
	b := &loopbackBus{sc: sc, stop: make(chan struct{}),
		payload: []byte(strings.TrimSuffix(strings.Repeat(benchChunkLine+"\n", sc.burst), "\n"))}
	if sc.paced {
		go b.run()
	}
	return b
}

// feed returns the channel of one response's frames; it is closed after
// the last.
func (b *loopbackBus) feed() chan []byte {
	frames := loopbackChunks / b.sc.burst
	if !b.sc.paced {
		ch := make(chan []byte, 16)
		go func() {
			for range frames {
				ch <- b.payload
			}
			close(ch)
		}()
		return ch
	}
	f := &loopbackFeed{ch: make(chan []byte, frames), left: frames}
	b.mu.Lock()
	b.open = append(b.open, f)
	b.mu.Unlock()
	return f.ch
}

func (b *loopbackBus) run() {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		b.mu.Lock()
		open := b.open[:0]
		for _, f := range b.open {
			f.ch <- b.payload // never blocks: room for every frame
			if f.left--; f.left == 0 {
				close(f.ch)
				continue
			}
			open = append(open, f)
		}
		clear(b.open[len(open):])
		b.open = open
		b.mu.Unlock()
	}
}

func (b *loopbackBus) close() { close(b.stop) }

// writeSyscalls is the process's count of write syscalls so far, -1 where
// /proc does not say.
func writeSyscalls() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// loopbackModes are the two ways of writing the stream.
var loopbackModes = []struct {
	name string
	app  func(bus *loopbackBus, n *chunkCounter) (*fiber.App, func())
}{
	{"hijack", hijackBenchApp},
	{"bodystream", bodyStreamBenchApp},
}

// hijackBenchApp streams as the gateway does, with this package: the
// response head and the first burst from the handler, the rest on the
// hijacked connection, which goes back to fasthttp after the stream.
func hijackBenchApp(bus *loopbackBus, n *chunkCounter) (*fiber.App, func()) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	s := New(app.Server(), Config{})
	app.Get("/stream", func(c *fiber.Ctx) error {
		src := bus.feed()
		first := <-src
		c.Set(fiber.HeaderXRequestID, "bench")
		c.Status(fiber.StatusOK)
		st := s.Begin(c.Context(), nil)
		k, _ := st.WriteEvents(first)
		n.add(k)
		if len(src) == 0 {
			_ = st.Flush()
		}
		st.Run(context.Background(), func(st *Stream) {
			for p := range src {
				k, _ := st.WriteEvents(p)
				n.add(k)
				if len(src) == 0 {
					_ = st.Flush()
				}
			}
			_ = st.Done()
		})
		return nil
	})
	return app, s.Drain
}

// bodyStreamBenchApp streams with fasthttp's own body-stream writer: a
// bufio.Writer flushed once per burst.
func bodyStreamBenchApp(bus *loopbackBus, n *chunkCounter) (*fiber.App, func()) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Get("/stream", func(c *fiber.Ctx) error {
		src := bus.feed()
		first := <-src
		c.Set(fiber.HeaderXRequestID, "bench")
		c.Set(fiber.HeaderContentType, "text/event-stream")
		c.Set(fiber.HeaderCacheControl, "no-cache")
		c.Set("X-Accel-Buffering", "no")
		c.Status(fiber.StatusOK)
		c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
			write := func(p []byte) {
				k := 0
				_ = schemas.ForEachLine(p, func(line []byte) error {
					k++
					_, _ = w.Write(sseData)
					_, _ = w.Write(line)
					_, err := w.Write(sseEnd)
					return err
				})
				n.add(k)
				if len(src) == 0 {
					_ = w.Flush()
				}
			}
			write(first)
			for p := range src {
				write(p)
			}
			_, _ = w.Write(sseDone)
		})
		return nil
	})
	return app, func() {}
}

// BenchmarkLoopbackStream streams SSE to a load generator in another
// process over loopback TCP: 64 keep-alive connections, each asking for one
// stream of 64 chunks after another. One op is one chunk written; cpu-ns/op
// is the server process's CPU time (user + system) per chunk, the figure the
// choice between the two writers rests on, writes/op its write syscalls per
// chunk and allocs/stream its allocations per response. ns/op is wall time per chunk: set by the pace when paced, else
// with the load generator competing for the same cores.
func BenchmarkLoopbackStream(b *testing.B) {
	const conns = 64
	for _, sc := range []loopbackScenario{{"paced1", 1, true}, {"paced4", 4, true}, {"backlog", 1, false}} {
		for _, mode := range loopbackModes {
			b.Run(sc.name+"/"+mode.name, func(b *testing.B) {
				n := &chunkCounter{hit: make(chan struct{})}
				bus := newLoopbackBus(sc)
				defer bus.close()
				app, closeConns := mode.app(bus, n)
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				go func() { _ = app.Listener(ln) }()
				defer func() {
					closeConns()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_ = app.ShutdownWithContext(ctx)
				}()

				cmd := exec.Command(os.Args[0])
				cmd.Env = append(os.Environ(), loopbackEnv+"="+ln.Addr().String()+" "+strconv.Itoa(conns))
				cmd.Stderr = os.Stderr
				stdin, err := cmd.StdinPipe()
				if err != nil {
					b.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				exited := make(chan error, 1)
				go func() { exited <- cmd.Wait() }()
				defer func() {
					_ = stdin.Close()
					select {
					case err := <-exited:
						if err != nil {
							b.Errorf("load generator: %v", err)
						}
					case <-time.After(10 * time.Second):
						_ = cmd.Process.Kill()
						b.Error("load generator did not exit")
					}
				}()

				// Warm up: every connection served a few streams.
				deadline := time.Now().Add(10 * time.Second)
				for n.n.Load() < conns*loopbackChunks*4 {
					if time.Now().After(deadline) {
						b.Fatal("no streams served in 10 s")
					}
					time.Sleep(10 * time.Millisecond)
				}

				var before, after syscall.Rusage
				b.ReportAllocs()
				b.ResetTimer()
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				w0 := writeSyscalls()
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
				n.target.Store(n.n.Load() + int64(b.N))
				select {
				case <-n.hit:
				case err := <-exited:
					b.Fatalf("load generator exited: %v", err)
				}
				_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
				w1 := writeSyscalls()
				runtime.ReadMemStats(&m1)
				b.StopTimer()
				b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)*loopbackChunks/float64(b.N), "allocs/stream")
				if w0 >= 0 && w1 >= 0 {
					b.ReportMetric(float64(w1-w0)/float64(b.N), "writes/op")
				}
				cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
	}
}
