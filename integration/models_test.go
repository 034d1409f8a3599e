package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/fakevllm"
	"github.com/tokenbus/tokenbus/internal/natsconn"
	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/program"
)

// modelEntry is what vLLM's /v1/models says of a model, as a client reads
// it (null and absent alike: "" and 0).
type modelEntry struct {
	ID          string `json:"id"`
	Root        string `json:"root"`
	Parent      string `json:"parent"`
	MaxModelLen int    `json:"max_model_len"`
}

// /v1/models as vLLM lists it, through the official Go client: base models
// first, then each base model's adapters; root and parent as vLLM gives
// them; max_model_len as the engines report it, through real workers (the
// sim's configured context; the fake vLLM's max_model_len), an adapter's
// its base's. Two bases from two engines, an adapter of each: sorted by
// name the list would begin with an adapter. Also dev's example adapter is
// named after the model it serves, and /version answers vLLM's shape.
func TestModelList(t *testing.T) {
	t.Parallel()
	const simModel = "meta-llama/Llama-3.1-8B-Instruct"
	d := startDev(t, func(c *program.DevConfig) {
		c.Engine.Model, c.Engine.Sim.MaxModelLen, c.SimWorkers = simModel, 4096, 1
		c.Version = "9.9.9-test"
	})
	if got := d.Adapters(); !slices.Equal(got, []string{"Llama-3.1-8B-Instruct-lora"}) {
		t.Fatalf("dev registered %v; want the example adapter named after %s", got, simModel)
	}

	fake := fakevllm.New()
	fake.Base, fake.MaxModelLen = []string{"aaa-base"}, 12288
	fake.SetMetrics("")
	srv := httptest.NewServer(fake)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	wcfg := program.DefaultWorker()
	wcfg.NATS, wcfg.Redis.URL = natsconn.Options{URL: d.NATSURL}, d.StoreURL()
	wcfg.Worker.ID, wcfg.Engine.Kind, wcfg.Engine.URL = "fake-vllm", "vllm", srv.URL
	wcfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx := context.Background()
	wk, err := program.StartWorker(ctx, wcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wk.Close() })
	// The worker registered its base model; an adapter on it is listed
	// (not loaded yet) since the base is served.
	if st := adminCall(t, d, d.AdminToken(), "POST", "/adapters", `{"name":"aaa-lora","base":"aaa-base","path":"/loras/aaa"}`, nil); st != 201 {
		t.Fatalf("POST /adapters: %d", st)
	}

	want := []modelEntry{
		{ID: "aaa-base", Root: "aaa-base", MaxModelLen: 12288},
		{ID: simModel, Root: simModel, MaxModelLen: 4096},
		{ID: "aaa-lora", Root: "/loras/aaa", Parent: "aaa-base", MaxModelLen: 12288},
		{ID: "Llama-3.1-8B-Instruct-lora", Root: "sim://Llama-3.1-8B-Instruct-lora", Parent: simModel, MaxModelLen: 4096},
	}
	c := openaiClient(d.URL + "/v1")
	testenv.WaitFor(t, 10*time.Second, func() error {
		page, err := c.Models.List(ctx)
		if err != nil {
			return err
		}
		var got []modelEntry
		for _, m := range page.Data {
			var e modelEntry
			if err := json.Unmarshal([]byte(m.RawJSON()), &e); err != nil {
				return err
			}
			if m.Object != "model" || m.OwnedBy == "" || m.Created == 0 {
				return fmt.Errorf("entry %s", m.RawJSON())
			}
			got = append(got, e)
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("models\n%+v, want\n%+v", got, want)
		}
		return nil
	})
	// A base model's entry has "parent": null, as vLLM's.
	m, err := c.Models.Get(ctx, "aaa-base")
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(m.RawJSON()), &raw); err != nil {
		t.Fatal(err)
	}
	if p, ok := raw["parent"]; !ok || p != nil || raw["max_model_len"] != float64(12288) || raw["root"] != "aaa-base" {
		t.Fatalf("GET /v1/models/aaa-base: %s", m.RawJSON())
	}

	resp, err := http.Get(d.URL + "/version")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != `{"version":"9.9.9-test"}` {
		t.Fatalf("/version: %d %s", resp.StatusCode, b)
	}
}
