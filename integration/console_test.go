package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/program/cli"
)

// screenshotsEnv set to 1 makes TestConsole write its screenshots into
// docs/img/ (they are regenerated on request, not on every run).
const screenshotsEnv = "TOKENBUS_CONSOLE_SCREENSHOTS"

// The web console in a real browser (headless Chromium) against tokenbus
// dev: the printed link signs in and leaves no token in the address bar;
// every page shows live data; an adapter registered from the console is
// then served; the playground streams a reply with its TTFT and tokens/s;
// the traffic page charts the requests sent.
func TestConsole(t *testing.T) {
	t.Parallel()
	bin := chromium()
	if bin == "" {
		t.Skip("no chromium binary (apt-get install chromium; scripts/test installs it)")
	}
	d := startDev(t, func(c *program.DevConfig) {
		c.Engine.Sim.DecodeBase, c.Engine.Sim.PrefillBase = 5*time.Millisecond, 2*time.Millisecond
	})
	model := d.Models()[0]
	link := cli.ConsoleURL(d.AdminAddr(), d.AdminToken())

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()

	shots := os.Getenv(screenshotsEnv) == "1"
	shot := func(name string) {
		t.Helper()
		if !shots {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join("..", "docs", "img", "console-"+name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}
	// waitFor polls expr in the page until it is truthy.
	waitFor := func(what, expr string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond),
			chromedp.WithPollingTimeout(20*time.Second))); err != nil {
			t.Fatalf("%s (waiting for %s): %v; page: %.600s", what, expr, err, eval(`document.body.innerText`))
		}
	}
	page := func(name string) {
		t.Helper()
		eval(fmt.Sprintf(`location.hash = "#/%s"; ""`, name))
		waitFor("page "+name, fmt.Sprintf(`document.getElementById("page-%s")`, name))
	}

	// Sign-in through the fragment: the token moves to session storage.
	do("open the console link", chromedp.EmulateViewport(1280, 900), chromedp.Navigate(link))
	waitFor("fleet", `document.querySelectorAll("#workers tbody tr").length === 2`)
	if href := eval(`location.href`); strings.Contains(href, "token") || !strings.HasSuffix(href, "/console/#/fleet") {
		t.Fatalf("address bar %q: the token must be gone", href)
	}
	if got := eval(`sessionStorage.getItem("tokenbus.admin-token")`); got != d.AdminToken() {
		t.Fatalf("session storage has %q", got)
	}
	if txt := eval(`document.getElementById("workers").innerText`); !strings.Contains(txt, "dev-worker-1") || !strings.Contains(txt, "healthy") {
		t.Fatalf("fleet table: %s", txt)
	}
	shot("fleet")

	// Models: register an adapter from the console, then it is served.
	page("models")
	waitFor("models", `(document.getElementById("models") || {innerText: ""}).innerText.includes("`+model+`")`)
	do("register an adapter",
		chromedp.SetValue(`#register-adapter input[name=name]`, "console-lora"),
		chromedp.SetValue(`#register-adapter input[name=path]`, "sim://console-lora"),
		chromedp.Click(`#register-adapter button[type=submit]`))
	waitFor("the new adapter listed", `document.getElementById("models").innerText.includes("console-lora")`)
	r := post(t, d.URL, "/v1/chat/completions", `{"model":"console-lora","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
	if r.Status != 200 || !strings.Contains(r.Body, `"model":"console-lora"`) {
		t.Fatalf("chat with the adapter registered from the console: %d %s", r.Status, r.Body)
	}
	waitFor("the adapter loaded on a worker", `document.getElementById("models").innerText.includes("loaded")`)
	shot("models")

	// Keys: create one (shown once), usage listed.
	page("keys")
	do("create a key",
		chromedp.SetValue(`#create-key input[name=name]`, "ci"),
		chromedp.SetValue(`#create-key input[name=tenant]`, "acme"),
		chromedp.SetValue(`#create-key select[name=band]`, "batch"),
		chromedp.SetValue(`#create-key input[name=weight]`, "3"),
		chromedp.Click(`#create-key button[type=submit]`))
	waitFor("the new key", `(document.getElementById("new-key") || {textContent: ""}).textContent.startsWith("tb-")`)
	waitFor("the key listed", `document.querySelectorAll("#keys tbody tr").length === 1`)
	waitFor("its band and weight", `(() => { const r = document.querySelector("#keys tbody tr");
		return r.querySelector("select").value === "batch" && r.querySelector("input[type=number]").value === "3"; })()`)
	waitFor("usage", `(document.getElementById("usage") || {innerText: ""}).innerText.includes("console-lora")`)
	waitFor("usage per hour", `(document.getElementById("usage-hourly") || {innerText: ""}).innerText.includes("console-lora")`)
	shot("keys")

	// Tenants: the key's tenant with its use and the default quotas; its
	// own quota set from the form is shown, and applies (the admin API).
	page("tenants")
	waitFor("the tenant listed", `(document.getElementById("tenants") || {innerText: ""}).innerText.includes("acme")`)
	do("set a quota",
		chromedp.SetValue(`#set-quotas input[name=tenant]`, "acme"),
		chromedp.SetValue(`#set-quotas input[name=files]`, "7"),
		chromedp.Click(`#set-quotas button[type=submit]`))
	waitFor("the quota shown", `document.getElementById("tenants").innerText.includes("/ 7 (own)")`)
	shot("tenants")

	// Batches: one made on the OpenAI API shows with its progress.
	id := createBatch(t, d.URL, model, 3)
	page("batches")
	waitFor("the batch listed", `(document.getElementById("batches") || {innerText: ""}).innerText.includes("`+id+`")`)
	waitFor("the batch done", `document.getElementById("batches").innerText.includes("completed")`)
	shot("batches")

	// Playground: a streamed reply, with TTFT and tokens/s.
	page("playground")
	waitFor("models in the playground", `document.querySelectorAll("#playground select[name=model] option").length >= 3`)
	do("chat",
		chromedp.SetValue(`#playground select[name=model]`, model),
		chromedp.SetValue(`#playground input[name=max_tokens]`, "24"),
		chromedp.SetValue(`#playground textarea`, "Tell me a story"),
		chromedp.Click(`#playground button[type=submit]`))
	waitFor("the stream", `document.querySelector(".msg.assistant[data-done='1']")`)
	if reply := eval(`document.querySelector(".msg.assistant").textContent`); strings.TrimSpace(reply) == "" {
		t.Fatal("the playground's reply is empty")
	}
	ttft, tps, tokens := eval(`document.getElementById("ttft").textContent`), eval(`document.getElementById("tps").textContent`), eval(`document.getElementById("tokens").textContent`)
	if !strings.HasSuffix(ttft, " ms") || tps == "–" || tokens != "24" {
		t.Fatalf("playground stats: ttft %q tokens/s %q tokens %q; want a TTFT, a rate and 24 tokens", ttft, tps, tokens)
	}
	shot("playground")

	// Traffic: the requests sent while the page is open show in its charts.
	page("traffic")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // load for the charts, until the page shows it
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			req, _ := http.NewRequest("POST", d.URL+"/v1/chat/completions", strings.NewReader(
				`{"model":"`+model+`","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := httpClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()
	waitFor("traffic charted", `+(document.getElementById("live").dataset.points || 0) >= 3 &&
		!document.getElementById("now-requests").textContent.includes("requests/s 0") &&
		document.getElementById("now-ttft").textContent.includes("p50") && !document.getElementById("now-ttft").textContent.includes("p50 –") &&
		document.querySelector("#chart-requests path").getAttribute("d").length > 10`)
	if shots { // a screenshot with more than a few points
		waitFor("traffic for the screenshot", `+(document.getElementById("live").dataset.points || 0) >= 15`)
	}
	close(stop)
	<-done
	shot("traffic")

	// Phone width: the fleet's rows become cards, nothing scrolls sideways.
	do("phone width", chromedp.EmulateViewport(390, 844))
	page("fleet")
	waitFor("fleet at phone width", `document.querySelectorAll("#workers tbody tr").length === 2`)
	if w := eval(`String(document.documentElement.scrollWidth)`); w != "390" {
		t.Errorf("at 390 px wide the page is %s px wide", w)
	}
	shot("phone")

	// Signing out forgets the token.
	do("sign out", chromedp.Click(`#signout`))
	waitFor("the sign-in form", `!document.getElementById("signin").hidden && sessionStorage.length === 0`)
}

// createBatch uploads n chat lines for model and starts a batch; its id.
func createBatch(t *testing.T, base, model string, n int) string {
	t.Helper()
	var lines bytes.Buffer
	for i := range n {
		fmt.Fprintf(&lines, `{"custom_id":"r%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}}`+"\n", i, model)
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write(lines.Bytes())
	_ = mw.Close()
	var f, b struct{ ID string }
	if st, body, err := httpJSON("POST", base+"/v1/files", mw.FormDataContentType(), &buf, &f); err != nil || st != 200 {
		t.Fatalf("upload: %d %s %v", st, body, err)
	}
	if st, body, err := httpJSON("POST", base+"/v1/batches", "application/json", strings.NewReader(
		`{"input_file_id":"`+f.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`), &b); err != nil || st != 200 {
		t.Fatalf("create batch: %d %s %v", st, body, err)
	}
	return b.ID
}
