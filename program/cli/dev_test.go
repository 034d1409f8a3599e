package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The banner is the CLI's contract with a person at a terminal: `tokenbus
// dev` prints the addresses it really listens on (ports chosen at run time
// here), the admin token it made, and stops on a signal with "shutting down".
func TestDevBanner(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := Run(ctx, []string{"dev", "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1", "--data-dir", "temp",
			"--sim-workers", "1", "--log-level", "warn"}, pw, io.Discard)
		pw.CloseWithError(fmt.Errorf("dev exited: %v", err))
		errc <- err
	}()
	rd := bufio.NewReader(pr)
	var banner strings.Builder
	for !strings.HasPrefix(lastLine(banner.String()), "Ctrl-C") {
		line, err := rd.ReadString('\n')
		banner.WriteString(line)
		if err != nil {
			t.Fatalf("dev did not print its banner: %v\n%s", err, banner.String())
		}
	}
	out := banner.String()
	find := func(re string) string {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("banner has no %s:\n%s", re, out)
		}
		return m[1]
	}
	api := find(`OpenAI API\s+(http://127\.0\.0\.1:\d+)/v1\s+\(models llama-8b; adapters llama-8b-lora; 1 workers on sim\)`)
	admin := find(`admin API\s+(http://127\.0\.0\.1:\d+)\s+\(token adm-`)
	token := find(`curl http://127\.0\.0\.1:\d+/models -H 'Authorization: Bearer (adm-\S+)'`)
	natsURL := find(`NATS\s+(nats://127\.0\.0\.1:\d+)`)
	if console := find(`console\s+(http://127\.0\.0\.1:\d+/console/#token=adm-\S+)\n`); console != admin+"/console/#token="+token {
		t.Fatalf("console link %q, want %s/console/#token=<the admin token>", console, admin)
	}
	find(`store\s+(redis://127\.0\.0\.1:\d+)`)
	if strings.HasSuffix(api, ":0") || strings.HasSuffix(admin, ":0") || strings.HasSuffix(natsURL, ":-1") {
		t.Fatalf("the banner shows the configured ports, not the bound ones:\n%s", out)
	}

	for _, c := range []struct{ url, token string }{{api + "/ready", ""}, {admin + "/models", token}, {admin + "/console/", ""}} {
		req, _ := http.NewRequest("GET", c.url, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", c.url, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d", c.url, resp.StatusCode)
		}
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatalf("the banner's NATS URL: %v", err)
	}
	nc.Close()

	cancel()
	rest, _ := io.ReadAll(rd)
	if !strings.HasPrefix(string(rest), "shutting down\n") {
		t.Errorf("after the signal: %q, want \"shutting down\"", rest)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("dev: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("dev did not stop within 10s of the signal")
	}
}

func lastLine(s string) string {
	s = strings.TrimSuffix(s, "\n")
	return s[strings.LastIndex(s, "\n")+1:]
}
