package registry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// openStore starts a redis-server for the test and opens a Store on it.
func openStore(t *testing.T) (*registry.Store, *testenv.Redis) {
	t.Helper()
	r := testenv.StartRedis(t)
	s, err := registry.Open(context.Background(), r.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, r
}

// wantErr checks err matches sentinel and maps to status through AsError.
func wantErr(t *testing.T, what string, err, sentinel error, status int) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("%s: err = %v, want %v", what, err, sentinel)
	}
	if e := schemas.AsError(err); e.Status != status {
		t.Fatalf("%s: status %d, want %d (%v)", what, e.Status, status, e)
	}
}

func testAdapters(t *testing.T, b *backend) {
	s := b.store(t)
	ctx := context.Background()
	created, err := s.PutBase(ctx, registry.Model{Name: "llama-8b", MaxModelLen: 8192, OwnedBy: "meta"})
	if err != nil || !created {
		t.Fatalf("PutBase: %v %v", created, err)
	}
	first, _ := s.Model(ctx, "llama-8b")
	// Replacing a base model's metadata keeps its creation time.
	if created, err := s.PutBase(ctx, registry.Model{Name: "llama-8b", MaxModelLen: 4096, Created: first.Created + 100}); err != nil || created {
		t.Fatalf("PutBase again: %v %v", created, err)
	}
	if m, _ := s.Model(ctx, "llama-8b"); m.MaxModelLen != 4096 || m.Created != first.Created {
		t.Fatalf("after update %+v (created %d)", m, first.Created)
	}
	lora := registry.Model{Name: "llama-8b-lora", Base: "llama-8b", Path: "s3://w/lora"}
	if created, err := s.PutAdapter(ctx, lora); err != nil || !created {
		t.Fatalf("PutAdapter: %v %v", created, err)
	}
	if created, err := s.PutAdapter(ctx, lora); err != nil || created {
		t.Fatalf("PutAdapter again, same: %v %v", created, err)
	}

	for _, tc := range []struct {
		name     string
		put      func() error
		sentinel error
		status   int
	}{
		{"adapter on a missing base", func() error {
			_, err := s.PutAdapter(ctx, registry.Model{Name: "x", Base: "nope", Path: "/p"})
			return err
		}, registry.ErrInvalid, 400},
		{"adapter on an adapter", func() error {
			_, err := s.PutAdapter(ctx, registry.Model{Name: "x", Base: "llama-8b-lora", Path: "/p"})
			return err
		}, registry.ErrInvalid, 400},
		{"adapter without path", func() error {
			_, err := s.PutAdapter(ctx, registry.Model{Name: "x", Base: "llama-8b"})
			return err
		}, registry.ErrInvalid, 400},
		{"adapter with a space in its name", func() error {
			_, err := s.PutAdapter(ctx, registry.Model{Name: "a b", Base: "llama-8b", Path: "/p"})
			return err
		}, registry.ErrInvalid, 400},
		{"adapter with another path", func() error {
			_, err := s.PutAdapter(ctx, registry.Model{Name: "llama-8b-lora", Base: "llama-8b", Path: "/other"})
			return err
		}, registry.ErrConflict, 409},
		{"adapter named like a base", func() error {
			_, err := s.PutAdapter(ctx, registry.Model{Name: "llama-8b", Base: "llama-8b", Path: "/p"})
			return err
		}, registry.ErrInvalid, 400},
		{"base named like an adapter", func() error {
			_, err := s.PutBase(ctx, registry.Model{Name: "llama-8b-lora"})
			return err
		}, registry.ErrConflict, 409},
		{"base without a name", func() error {
			_, err := s.PutBase(ctx, registry.Model{})
			return err
		}, registry.ErrInvalid, 400},
		{"delete a base with adapters", func() error { return s.DeleteModel(ctx, "llama-8b") }, registry.ErrConflict, 409},
		{"delete a missing model", func() error { return s.DeleteModel(ctx, "nope") }, registry.ErrNotFound, 404},
	} {
		wantErr(t, tc.name, tc.put(), tc.sentinel, tc.status)
	}

	if ad, err := s.Adapters(ctx, "llama-8b"); err != nil || len(ad) != 1 || ad[0] != (registry.Model{Name: lora.Name, Base: lora.Base, Path: lora.Path, Created: ad[0].Created}) {
		t.Fatalf("Adapters = %+v, %v", ad, err)
	}
	wantErr(t, "RemoveAdapter of a base", func() error { _, err := s.RemoveAdapter(ctx, "llama-8b"); return err }(), registry.ErrInvalid, 400)
	wantErr(t, "RemoveAdapter of nothing", func() error { _, err := s.RemoveAdapter(ctx, "nope"); return err }(), registry.ErrNotFound, 404)
	if _, err := s.PutAdapter(ctx, registry.Model{Name: "lora2", Base: "llama-8b", Path: "/2"}); err != nil {
		t.Fatal(err)
	}
	if m, err := s.RemoveAdapter(ctx, "lora2"); err != nil || m.Path != "/2" {
		t.Fatalf("RemoveAdapter = %+v, %v", m, err)
	}
	removed, err := s.RemoveModel(ctx, "llama-8b", true)
	if err != nil || len(removed) != 2 || removed[0].Name != "llama-8b" || removed[1].Name != "llama-8b-lora" {
		t.Fatalf("forced RemoveModel = %+v, %v", removed, err)
	}
	if list, err := s.Models(ctx); err != nil || len(list) != 0 {
		t.Fatalf("after forced delete: %+v %v", list, err)
	}
}

// PutAdapter's check of the base and its write are one step: racing with the
// base's deletion never leaves an adapter without its base.
func testAdapterBaseRace(t *testing.T, b *backend) {
	s := b.store(t)
	ctx := context.Background()
	for round := range 30 {
		if _, err := s.PutBase(ctx, registry.Model{Name: "base"}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.PutAdapter(ctx, registry.Model{Name: fmt.Sprintf("a%d-%d", round, i), Base: "base", Path: "/w"})
				if err != nil && !errors.Is(err, registry.ErrInvalid) {
					t.Error(err)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.DeleteModel(ctx, "base"); err != nil && !errors.Is(err, registry.ErrConflict) {
				t.Error(err)
			}
		}()
		wg.Wait()
		list, err := s.Models(ctx)
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, m := range list {
			names[m.Name] = true
		}
		for _, m := range list {
			if m.IsAdapter() && !names[m.Base] {
				t.Fatalf("round %d: adapter %s outlived its base", round, m.Name)
			}
		}
		if _, err := s.RemoveModel(ctx, "base", true); err != nil && !errors.Is(err, registry.ErrNotFound) {
			t.Fatal(err)
		}
	}
}

// Every Store method answers ErrUnavailable (503) while Redis is down, and
// works again once it is back.
func TestStoreUnavailable(t *testing.T) {
	s, r := openStore(t)
	ctx := context.Background()
	r.Stop()
	checks := map[string]func() error{
		"PutBase": func() error { _, err := s.PutBase(ctx, registry.Model{Name: "m"}); return err },
		"PutAdapter": func() error {
			_, err := s.PutAdapter(ctx, registry.Model{Name: "a", Base: "m", Path: "/p"})
			return err
		},
		"RemoveModel": func() error { _, err := s.RemoveModel(ctx, "m", true); return err },
		"Model":       func() error { _, err := s.Model(ctx, "m"); return err },
		"Models":      func() error { _, err := s.Models(ctx); return err },
		"CreateKey": func() error {
			_, _, err := s.CreateKey(ctx, registry.KeySpec{Tenant: "t"})
			return err
		},
		"ListKeys":  func() error { _, err := s.ListKeys(ctx); return err },
		"KeyByHash": func() error { _, err := s.KeyByHash(ctx, "h"); return err },
		"DeleteKey": func() error { return s.DeleteKey(ctx, "key_x") },
		"Usage":     func() error { _, err := s.Usage(ctx, "", ""); return err },
		"Admit": func() error {
			_, err := registry.NewLimiter(s).Admit(ctx, registry.Key{ID: "k", KeySpec: registry.KeySpec{RPM: 1}}, registry.Admission{})
			return err
		},
		"Record": func() error {
			_, err := registry.NewLimiter(s).Record(ctx, schemas.UsageRecord{KeyID: "k", Model: "m"})
			return err
		},
	}
	for name, f := range checks {
		wantErr(t, name, f(), registry.ErrUnavailable, 503)
	}
	r.Restart(t)
	testenv.WaitFor(t, 10*time.Second, func() error {
		_, err := s.PutBase(ctx, registry.Model{Name: "m"})
		return err
	})
}
