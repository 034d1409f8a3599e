package program

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/registry"
)

// ensureModels registers models that are not registered yet, so that they
// stay known (503, not 404) while no worker serves them, and tells every
// cache about the new ones.
func ensureModels(ctx context.Context, store *registry.Store, models []string, nc *nats.Conn) error {
	for _, m := range models {
		created, err := store.EnsureModel(ctx, registry.Model{Name: m, OwnedBy: "tokenbus"})
		if err != nil {
			return err
		}
		if created {
			_ = registry.Announce(nc, m)
		}
	}
	return nil
}

// registerModels is ensureModels on the store topo names, opened for it.
func registerModels(ctx context.Context, topo registry.Topology, models []string, nc *nats.Conn) error {
	store, err := registry.OpenTopology(ctx, topo)
	if err != nil {
		return err
	}
	defer store.Close()
	return ensureModels(ctx, store, models, nc)
}

// registerAdapters registers LoRA adapters given as name=path on base and
// returns their names. An adapter already registered differently is kept as
// it is, with a warning.
func registerAdapters(ctx context.Context, store *registry.Store, base string, specs []string, nc *nats.Conn, log *slog.Logger) ([]string, error) {
	var names []string
	for _, spec := range specs {
		if spec = strings.TrimSpace(spec); spec == "" {
			continue
		}
		name, path, ok := strings.Cut(spec, "=")
		if !ok || name == "" || path == "" {
			return nil, fmt.Errorf("--adapters: %q is not name=path", spec)
		}
		created, err := store.PutAdapter(ctx, registry.Model{Name: name, Base: base, Path: path, OwnedBy: "tokenbus"})
		if errors.Is(err, registry.ErrConflict) {
			log.Warn("adapter already registered differently; keeping it", "adapter", name, "err", err)
		} else if err != nil {
			return nil, fmt.Errorf("--adapters %s: %w", name, err)
		}
		if created {
			_ = registry.Announce(nc, name)
		}
		names = append(names, name)
	}
	return names, nil
}
