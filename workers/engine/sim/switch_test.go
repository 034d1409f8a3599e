package sim

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/schemas"
	"github.com/tokenbus/tokenbus/workers/engine"
)

func switchConfig(models ...string) Config {
	cfg := fastConfig()
	cfg.Model, cfg.Models = "", models
	return cfg
}

func TestSwitchConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
		ok   bool
		want string // the model loaded at start
	}{
		{"first loaded", func(c *Config) {}, true, "a"},
		{"model among them", func(c *Config) { c.Model = "b" }, true, "b"},
		{"model not among them", func(c *Config) { c.Model = "x" }, false, ""},
		{"repeated", func(c *Config) { c.Models = []string{"a", "a"} }, false, ""},
		{"empty name", func(c *Config) { c.Models = []string{"a", ""} }, false, ""},
		{"served names", func(c *Config) { c.ServedNames = []string{"alias"} }, false, ""},
		{"negative switch time", func(c *Config) { c.SwitchTime = -1 }, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := switchConfig("a", "b")
			tc.cfg(&cfg)
			e, err := New(cfg)
			if !tc.ok {
				if err == nil {
					e.Close()
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if got := e.Models(); !slices.Equal(got, []string{tc.want}) {
				t.Fatalf("models %q, want [%s]", got, tc.want)
			}
			if got := e.CanServe(); !slices.Equal(got, []string{"a", "b"}) {
				t.Fatalf("can serve %q", got)
			}
		})
	}
	// A sim of one model can switch to nothing.
	if got := newEngine(t, fastConfig()).CanServe(); len(got) != 0 {
		t.Fatalf("one model: can serve %q", got)
	}
}

func TestSwitchServesTheNewModel(t *testing.T) {
	cfg := switchConfig("a", "b")
	cfg.MaxModelLen = 4096
	e := newEngine(t, cfg)
	changed := make(chan struct{}, 4)
	e.NotifyModels(func() { changed <- struct{}{} })
	answer := func(model string) (string, error) {
		res, err := e.Generate(context.Background(), &engine.Request{ID: "x", Kind: schemas.KindCompletion, Model: model,
			Body: []byte(`{"model":"` + model + `","prompt":"hello there","max_tokens":8}`)}, nil)
		if err != nil {
			return "", err
		}
		return string(res.Response), nil
	}
	before, err := answer("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := answer("b"); err == nil || asError(t, err).Status != 404 {
		t.Fatalf("b before the switch: %v", err)
	}
	if err := e.LoadAdapter(context.Background(), "lora-a", "/w/lora-a"); err != nil {
		t.Fatal(err)
	}
	<-changed
	if err := e.Switch(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	<-changed
	if got := e.Models(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("models after the switch %q: want [b] (the adapter of a gone)", got)
	}
	if got := e.MaxModelLens(); len(got) != 1 || got["b"] != 4096 {
		t.Fatalf("context lengths %v", got)
	}
	if _, err := answer("a"); err == nil || asError(t, err).Status != 404 {
		t.Fatalf("a after the switch: %v", err)
	}
	after, err := answer("b")
	if err != nil {
		t.Fatal(err)
	}
	// Another model's weights: another answer to the same prompt.
	if text := func(s string) string { var c textCompletion; decodeStrict(t, []byte(s), &c); return c.Choices[0].Text }; text(before) == text(after) {
		t.Fatalf("a and b answered alike: %s", after)
	}
	// Back to a: the same answer as before.
	if err := e.Switch(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if again, err := answer("a"); err != nil || !sameText(t, again, before) {
		t.Fatalf("a again: %v %s, want %s", err, again, before)
	}
	// A switch to the model loaded is nothing; an unknown model is a 404.
	if err := e.Switch(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := e.Switch(context.Background(), "x"); err == nil || asError(t, err).Status != 404 {
		t.Fatalf("switch to x: %v", err)
	}
}

func sameText(t *testing.T, x, y string) bool {
	var a, b textCompletion
	decodeStrict(t, []byte(x), &a)
	decodeStrict(t, []byte(y), &b)
	return a.Choices[0].Text == b.Choices[0].Text
}

func TestSwitchTakesItsTimeAndCancels(t *testing.T) {
	cfg := switchConfig("a", "b")
	cfg.SwitchTime = time.Hour
	e := newEngine(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Switch(ctx, "b") }()
	select {
	case err := <-done:
		t.Fatalf("a switch of an hour returned at once: %v", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled switch: %v", err)
	}
	if got := e.Models(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("a cancelled switch left %q, want [a]", got)
	}
	// A closed engine switches to nothing.
	e.Close()
	if err := e.Switch(context.Background(), "b"); err == nil || asError(t, err).Status != 503 {
		t.Fatalf("switch after close: %v", err)
	}
}
