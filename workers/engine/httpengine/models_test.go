package httpengine

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/tokenbus/tokenbus/internal/testenv"
)

// /v1/models as real servers write it, read over HTTP: missing created and
// owned_by, extra fields and fields of other types, data null, entries
// without an id, an id listed twice.
func TestModelsVariants(t *testing.T) {
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body.Load().(string))
	}))
	t.Cleanup(srv.Close)
	body.Store(`{"data":[]}`)
	e := newEngine(t, fastConfig(srv.URL))
	for _, tc := range []struct {
		name, body string
		want       []Model
	}{
		{"OpenAI's", `{"object":"list","data":[{"id":"m","object":"model","created":1,"owned_by":"me"}]}`, []Model{{ID: "m"}}},
		{"minimal", `{"data":[{"id":"m"}]}`, []Model{{ID: "m"}}},
		{"no created, no owned_by, extras", `{"data":[{"id":"m","object":"model","meta":{"n_ctx":4096,"n_vocab":32000}}],"models":[{"name":"m"}]}`, []Model{{ID: "m"}}},
		{"other types", `{"object":"list","data":[{"id":"m","created":"2024-05-01T00:00:00Z","owned_by":null,"root":5,"parent":false}]}`, []Model{{ID: "m"}}},
		{"vLLM adapter", `{"data":[{"id":"base","root":"/w/base","parent":null,"max_model_len":8192},{"id":"a","root":"/w/a","parent":"base","max_model_len":null}]}`,
			[]Model{{ID: "base", Root: "/w/base", MaxModelLen: 8192}, {ID: "a", Root: "/w/a", Parent: "base"}}},
		{"max_model_len not a positive integer", `{"data":[{"id":"a","max_model_len":"4096"},{"id":"b","max_model_len":4096.5},{"id":"c","max_model_len":-1},{"id":"d","max_model_len":0}]}`,
			[]Model{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d"}}},
		{"data null", `{"object":"list","data":null}`, []Model{}},
		{"no data", `{"object":"list"}`, []Model{}},
		{"entries without an id, a repeat", `{"data":[{"object":"model"},{"id":""},{"id":7},"x",{"id":"m"},{"id":"m"}]}`, []Model{{ID: "m"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body.Store(tc.body)
			got, err := e.FetchModels(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	body.Store(`{"data":{"id":"m"}}`)
	if _, err := e.FetchModels(t.Context()); err == nil {
		t.Error("a data object that is not a list was read without error")
	}

	// The refresh keeps the base models' max_model_len for heartbeats
	// (adapters have their base's; a model without one is left out).
	body.Store(`{"data":[{"id":"base","max_model_len":8192},{"id":"other"},{"id":"a","parent":"base","max_model_len":4096}]}`)
	if err := e.refreshAll(t.Context(), e); err != nil {
		t.Fatal(err)
	}
	if got := e.MaxModelLens(); len(got) != 1 || got["base"] != 8192 {
		t.Errorf("MaxModelLens %v, want map[base:8192]", got)
	}
}

// SetModels tells NotifyModels's function of a change, and only of one.
func TestSetModelsNotifies(t *testing.T) {
	// No server: the engine's probes go to a listener held by the test, reset.
	e := newEngine(t, Config{URL: "http://" + testenv.ResetListener(t).Addr, Models: []string{"m"}, Logger: slog.New(slog.DiscardHandler)})
	var told atomic.Int32
	e.NotifyModels(func() { told.Add(1) })
	for _, s := range []struct {
		models []string
		told   int32
	}{
		{[]string{"m"}, 0},
		{[]string{"m", "m-lora"}, 1},
		{[]string{"m", "m-lora"}, 1},
		{nil, 2},
	} {
		e.SetModels(s.models)
		if n := told.Load(); n != s.told {
			t.Fatalf("after SetModels(%v): told %d times, want %d", s.models, n, s.told)
		}
	}
}
