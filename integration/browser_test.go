package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tokenbus/tokenbus/program"
)

// browserPage is a page whose script streams a chat completion from the
// API with fetch() and a ReadableStream, as a browser app would, and writes
// what it got into #out (then sets data-done). The Authorization and JSON
// Content-Type headers make the browser send a preflight first.
const browserPage = `<!doctype html>
<html><body><pre id="out"></pre><script>
(async () => {
  const out = document.getElementById("out");
  let result;
  try {
    const r = await fetch(%q + "/v1/chat/completions", {
      method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer unused"},
      body: JSON.stringify({model: "llama-8b", stream: true, max_tokens: 12,
                            messages: [{role: "user", content: "Tell me a story"}]}),
    });
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "", text = "", chunks = 0, done = false;
    for (;;) {
      const {value, done: end} = await reader.read();
      if (end) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        if (!ev.startsWith("data: ")) continue;
        const data = ev.slice(6);
        if (data === "[DONE]") { done = true; continue; }
        chunks++;
        for (const c of JSON.parse(data).choices) text += (c.delta && c.delta.content) || "";
      }
    }
    result = {ok: true, status: r.status, text, chunks, done, requestId: r.headers.get("x-request-id") || ""};
  } catch (e) {
    result = {ok: false, error: String(e)};
  }
  out.textContent = JSON.stringify(result);
  out.dataset.done = "1";
})();
</script></body></html>`

// pageResult is what browserPage writes.
type pageResult struct {
	OK        bool   `json:"ok"`
	Status    int    `json:"status"`
	Text      string `json:"text"`
	Chunks    int    `json:"chunks"`
	Done      bool   `json:"done"`
	RequestID string `json:"requestId"`
	Error     string `json:"error"`
}

// chromium is the path of a Chromium (or Chrome) binary, "" when none.
func chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// A real browser (headless Chromium) on a page of another origin streams a
// chat completion from tokenbus dev: the preflight passes, the SSE stream
// arrives through fetch() with Access-Control-Allow-Origin, and the script
// may read X-Request-Id. A page of an origin not allowed is blocked by the
// browser (fetch fails) though the gateway is the same.
func TestBrowserCORS(t *testing.T) {
	t.Parallel()
	bin := chromium()
	if bin == "" {
		t.Skip("no chromium binary (apt-get install chromium; scripts/test installs it)")
	}
	// Two page servers: two origins (other ports of 127.0.0.1). The API's
	// address is known only once dev runs, and dev's allowed origins must be
	// known before: the pages read it late.
	var api string
	page := func() *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprintf(w, browserPage, api)
		}))
	}
	allowed, blocked := page(), page()
	t.Cleanup(allowed.Close)
	t.Cleanup(blocked.Close)
	d := startDev(t, func(c *program.DevConfig) {
		c.HTTP.CORS.Origins = []string{allowed.URL}
		c.SimWorkers = 1
	})
	api = d.URL

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	if err := chromedp.Do(bctx); err != nil { // starts the browser, for as long as bctx lives
		t.Fatalf("starting %s: %v", bin, err)
	}

	load := func(url string) pageResult {
		t.Helper()
		ctx, cancel := chromedp.NewContext(bctx) // a tab
		defer cancel()
		ctx, cancelT := context.WithTimeout(ctx, 60*time.Second)
		defer cancelT()
		if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS(`#out[data-done="1"]`))); err != nil {
			t.Fatalf("browser on %s: %v", url, err)
		}
		out, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#out")))
		if err != nil {
			t.Fatalf("browser on %s: %v", url, err)
		}
		var r pageResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("page wrote %q: %v", out, err)
		}
		return r
	}

	r := load(allowed.URL)
	if !r.OK || r.Status != 200 || !r.Done || r.Chunks < 3 || strings.TrimSpace(r.Text) == "" || !strings.HasPrefix(r.RequestID, "req-") {
		t.Fatalf("allowed origin: %+v; want a whole stream with text, [DONE] and a readable X-Request-Id", r)
	}
	r = load(blocked.URL)
	if r.OK || !strings.Contains(r.Error, "TypeError") {
		t.Fatalf("origin not allowed: %+v; want the browser to block the fetch (TypeError)", r)
	}
}
