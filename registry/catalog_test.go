package registry_test

import (
	"context"
	"slices"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

func testModelList(t *testing.T, b *backend) {
	s := b.store(t)
	ctx := context.Background()
	for _, m := range []registry.Model{{Name: "llama-8b", MaxModelLen: 8192, OwnedBy: "meta"}, {Name: "qwen"}} {
		if _, err := s.PutBase(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []registry.Model{{Name: "llama-8b-lora", Base: "llama-8b", Path: "sim://l"}, {Name: "qwen-lora", Base: "qwen", Path: "/q"}} {
		if _, err := s.PutAdapter(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	c := registry.NewCache(s, nil)
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	ids := func(list []schemas.Model) []string {
		var out []string
		for _, m := range list {
			p := ""
			if m.Parent != nil {
				p = "<" + *m.Parent
			}
			out = append(out, m.ID+p)
		}
		return out
	}
	for _, tc := range []struct {
		served []string
		want   []string
	}{
		// Registered models (and their adapters) are listed with no
		// worker up: a request for one waits for a worker to start
		// (docs/capacity.md).
		{nil, []string{"llama-8b", "llama-8b-lora<llama-8b", "qwen", "qwen-lora<qwen"}},
		{[]string{"llama-8b"}, []string{"llama-8b", "llama-8b-lora<llama-8b", "qwen", "qwen-lora<qwen"}},
		// A loaded adapter is listed once; an unregistered model as it is.
		{[]string{"llama-8b-lora", "llama-8b", "other"}, []string{"llama-8b", "llama-8b-lora<llama-8b", "other", "qwen", "qwen-lora<qwen"}},
	} {
		got := c.ModelList(entries(tc.served...))
		if g := ids(got); !slices.Equal(g, tc.want) {
			t.Fatalf("served %v: %v, want %v", tc.served, g, tc.want)
		}
	}
	list := c.ModelList(entries("llama-8b"))
	if b, a := list[0], list[1]; b.MaxModelLen != 8192 || b.OwnedBy != "meta" || b.Root != "llama-8b" || b.Object != "model" ||
		a.Root != "sim://l" || a.Created == 0 {
		t.Fatalf("%+v", list)
	}
	// What workers report: kept where the operator registered nothing,
	// replaced where they did (the operator's word wins).
	reported := entries("llama-8b", "qwen")
	reported[0].MaxModelLen, reported[1].MaxModelLen = 131072, 32768
	list = c.ModelList(reported)
	if got := []int{list[0].MaxModelLen, list[2].MaxModelLen}; !slices.Equal(got, []int{8192, 32768}) || list[2].ID != "qwen" {
		t.Fatalf("max_model_len %v of %v: want the registered 8192, the reported 32768", got, ids(list))
	}
	var none *registry.Cache
	if got := ids(none.ModelList(entries("x"))); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("nil cache: %v", got)
	}
}

// entries are /v1/models entries as the gateway makes them from heartbeats.
func entries(ids ...string) []schemas.Model {
	var out []schemas.Model
	for _, id := range ids {
		out = append(out, schemas.Model{ID: id, Object: "model", Created: 1, OwnedBy: "tokenbus", Root: id})
	}
	return out
}

// tokenbus dev runs on miniredis: the scripts and transactions work there too.
func TestOnMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	ctx := context.Background()
	s, err := registry.Open(ctx, "redis://"+mr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.PutBase(ctx, registry.Model{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutAdapter(ctx, registry.Model{Name: "a", Base: "b", Path: "/p"}); err != nil {
		t.Fatal(err)
	}
	k, secret, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "t", RPM: 2, TPM: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeyByHash(ctx, registry.HashSecret(secret)); err != nil {
		t.Fatal(err)
	}
	l := registry.NewLimiter(s) // Redis's clock: TIME inside the script
	for i, want := range []bool{true, true, false} {
		if d, err := l.Admit(ctx, k, registry.Admission{}); err != nil || d.Allowed != want {
			t.Fatalf("admit %d: %+v %v", i, d, err)
		}
	}
	if _, err := l.Record(ctx, schemas.UsageRecord{KeyID: k.ID, Model: "b", Usage: schemas.Usage{PromptTokens: 3, CompletionTokens: 4}}); err != nil {
		t.Fatal(err)
	}
	if u, err := s.Usage(ctx, "", ""); err != nil || len(u) != 1 || u[0].TotalTokens != 7 {
		t.Fatalf("usage %+v %v", u, err)
	}
	if err := s.DeleteKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RemoveModel(ctx, "b", true); err != nil {
		t.Fatal(err)
	}
}
