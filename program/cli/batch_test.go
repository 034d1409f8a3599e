package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/program"
)

// tokenbus batch submit --wait: plain request bodies become batch lines,
// the progress line ends completed, and the output file has every line.
func TestBatchSubmit(t *testing.T) {
	cfg := program.DefaultDev()
	cfg.HTTP.Listen, cfg.HTTP.Admin, cfg.NATSListen = "127.0.0.1:0", "", "127.0.0.1:-1"
	cfg.SimWorkers = 1
	cfg.Engine.Sim.DecodeBase, cfg.Engine.Sim.PrefillBase = time.Millisecond, time.Millisecond
	d, err := program.StartDev(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })

	dir := t.TempDir()
	in := filepath.Join(dir, "prompts.jsonl")
	var lines strings.Builder
	for i := range 20 {
		fmt.Fprintf(&lines, `{"max_tokens":3,"messages":[{"role":"user","content":"q%d"}]}`+"\n", i)
	}
	lines.WriteString(`{"custom_id":"mine","method":"POST","url":"/v1/chat/completions","body":{"max_tokens":2,"messages":[{"role":"user","content":"x"}]}}` + "\n")
	if err := os.WriteFile(in, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = Run(context.Background(), []string{"batch", "submit", in, "--url", "http://" + d.Addr(), "--model", d.Models()[0],
		"--wait", "--poll", "20ms"}, &out, &out)
	if err != nil || !strings.Contains(out.String(), "completed    [##############################] 21/21 lines") {
		t.Fatalf("batch submit: %v\n%s", err, out.String())
	}
	got, err := os.ReadFile(filepath.Join(dir, "prompts.output.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(got, []byte("\n")); n != 21 || !bytes.Contains(got, []byte(`"custom_id":"line-20"`)) || !bytes.Contains(got, []byte(`"custom_id":"mine"`)) {
		t.Fatalf("output: %d lines\n%.500s", n, got)
	}
	if _, err := os.Stat(filepath.Join(dir, "prompts.errors.jsonl")); !os.IsNotExist(err) {
		t.Fatalf("an error file with no errors: %v", err)
	}
}

func TestProgressLine(t *testing.T) {
	var b batchView
	b.Status = "in_progress"
	b.RequestCounts.Total, b.RequestCounts.Completed, b.RequestCounts.Failed = 100, 40, 10
	got := progressLine(b, 10*time.Second)
	want := "in_progress  [###############...............] 50/100 lines (10 failed)  5.0 lines/s  ETA 10s   "
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

// --data-dir: "temp" is dev's temporary directory; "" .tokenbus/jetstream
// in the directory dev runs in (made if missing), so that two checkouts
// do not share files and batches, whatever XDG_STATE_HOME says.
func TestDevDataDir(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	if got, err := devDataDir("temp"); got != "" || err != nil {
		t.Fatalf("temp: %q %v", got, err)
	}
	var dirs []string
	for range 2 {
		checkout := t.TempDir()
		t.Chdir(checkout)
		got, err := devDataDir("")
		if want := filepath.Join(checkout, ".tokenbus", "jetstream"); got != want || err != nil {
			t.Fatalf("default: %q %v, want %q", got, err, want)
		}
		if fi, err := os.Stat(got); err != nil || !fi.IsDir() {
			t.Fatalf("default not made: %v", err)
		}
		dirs = append(dirs, got)
		if got, err := devDataDir("state"); got != filepath.Join(checkout, "state") || err != nil {
			t.Fatalf("a relative --data-dir: %q %v, want it absolute", got, err)
		}
	}
	if dirs[0] == dirs[1] {
		t.Fatalf("two checkouts share %s", dirs[0])
	}
	// Where it cannot be made, an error (dev then says so and runs on a
	// temporary directory).
	t.Chdir(t.TempDir())
	if err := os.WriteFile(".tokenbus", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := devDataDir(""); err == nil {
		t.Fatal(".tokenbus is a file: want an error")
	}
}
