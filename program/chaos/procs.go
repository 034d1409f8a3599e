package chaos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/tokenbus/tokenbus/internal/freeport"
)

// proc is one child process. Its output goes to a log file in the run's
// directory (appended across restarts), which the report names on failure.
type proc struct {
	name string
	bin  string
	args []string
	env  []string
	log  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// start runs the process (again, after a kill).
func (p *proc) start() error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a Ctrl-C at the terminal reaches the harness,
	// which stops its children in order, not every child at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	return nil
}

func (p *proc) running() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

// kill9 is the fault: SIGKILL, no chance to drain or say goodbye.
func (p *proc) kill9() {
	cmd, done := p.running()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// stop ends the process gracefully, and by force after a bound.
func (p *proc) stop(wait time.Duration) {
	cmd, done := p.running()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(wait):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

func freePorts(n int) ([]int, error) {
	out := make([]int, n)
	for i := range out {
		p, err := freeport.TCP()
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

// waitFor polls cond every 20 ms until it holds or the bound passes.
func waitFor(ctx context.Context, bound time.Duration, what string, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		if last = cond(); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %s: %v", what, bound, last)
		case <-t.C:
		}
	}
}

// httpOK is a condition: GET url answers 200.
func httpOK(url string, hdr ...string) func() error {
	return func() error {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := probeClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

var probeClient = &http.Client{Timeout: 2 * time.Second}

// tcpUp is a condition: something accepts on port.
func tcpUp(port int) func() error {
	return func() error {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

// build compiles tokenbus and nats-server (from the module cache: no network)
// into dir, once per run.
func build(ctx context.Context, dir string) (tokenbus, natsServer string, err error) {
	tokenbus = filepath.Join(dir, "tokenbus")
	natsServer = filepath.Join(dir, "nats-server")
	for _, b := range [][2]string{
		{tokenbus, "github.com/tokenbus/tokenbus/cmd/tokenbus"},
		{natsServer, "github.com/nats-io/nats-server/v2"},
	} {
		out, err := exec.CommandContext(ctx, "go", "build", "-o", b[0], b[1]).CombinedOutput()
		if err != nil {
			return "", "", fmt.Errorf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	return tokenbus, natsServer, nil
}
