package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"
	"github.com/tokenbus/tokenbus/schemas"
)

// Limits on names and paths, so that records stay small.
const (
	maxNameLen = 256
	maxPathLen = 4096
)

// checkName validates a model, adapter or base name.
func checkName(param, name string) error {
	switch {
	case name == "":
		return invalid(schemas.ErrMissingParam.At(param, param))
	case len(name) > maxNameLen:
		return invalid(schemas.ErrInvalidValue.At(param, param, fmt.Sprintf("longer than %d bytes", maxNameLen)))
	}
	for _, r := range name {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return invalid(schemas.ErrInvalidValue.At(param, param, fmt.Sprintf("%q contains whitespace or control characters", name)))
		}
	}
	return nil
}

// PutBase creates a base model or replaces its metadata (keeping its
// creation time); created reports which. A name taken by an adapter is
// ErrConflict.
func (s *Store) PutBase(ctx context.Context, m Model) (created bool, err error) {
	if err := checkName("name", m.Name); err != nil {
		return false, err
	}
	if m.Base != "" || m.Path != "" {
		return false, invalid(schemas.ErrInvalidValue.At("base", "base", "a base model has no base or path; register adapters with PutAdapter"))
	}
	if m.MaxModelLen < 0 {
		return false, invalid(schemas.ErrInvalidValue.At("max_model_len", "max_model_len", "must not be negative"))
	}
	err = s.updateModels(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
		cur, ok, err := getModel(ctx, tx, m.Name)
		if err != nil {
			return nil, err
		}
		switch {
		case ok && cur.IsAdapter():
			return nil, conflict("`%s` is a LoRA adapter on `%s`, not a base model.", m.Name, cur.Base)
		case ok:
			m.Created = cur.Created
		case m.Created == 0:
			m.Created = time.Now().Unix()
		}
		created = !ok
		b, _ := json.Marshal(m)
		return func(p redis.Pipeliner) { p.HSet(ctx, keyModels, m.Name, b) }, nil
	})
	return created, err
}

// PutAdapter registers a LoRA adapter on its base model, which must be a
// registered base model (ErrInvalid otherwise). The check and the write are
// one atomic step. Registering the same adapter again (same base and path) is
// a no-op with created false; a different base or path, or a name taken by a
// base model, is ErrConflict: delete the adapter first, so that workers unload
// the old weights.
func (s *Store) PutAdapter(ctx context.Context, m Model) (created bool, err error) {
	if err := checkName("name", m.Name); err != nil {
		return false, err
	}
	if err := checkName("base", m.Base); err != nil {
		return false, err
	}
	switch {
	case m.Path == "":
		return false, invalid(schemas.ErrMissingParam.At("path", "path"))
	case len(m.Path) > maxPathLen:
		return false, invalid(schemas.ErrInvalidValue.At("path", "path", fmt.Sprintf("longer than %d bytes", maxPathLen)))
	case m.Base == m.Name:
		return false, invalid(schemas.ErrInvalidValue.At("base", "base", "an adapter cannot be its own base model"))
	}
	err = s.updateModels(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
		base, ok, err := getModel(ctx, tx, m.Base)
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return nil, invalid(schemas.ErrInvalidValue.At("base", "base", fmt.Sprintf("the base model `%s` is not registered", m.Base)))
		case base.IsAdapter():
			return nil, invalid(schemas.ErrInvalidValue.At("base", "base", fmt.Sprintf("`%s` is itself an adapter; an adapter's base must be a base model", m.Base)))
		}
		cur, ok, err := getModel(ctx, tx, m.Name)
		switch {
		case err != nil:
			return nil, err
		case ok && !cur.IsAdapter():
			return nil, conflict("`%s` is a base model.", m.Name)
		case ok && (cur.Base != m.Base || cur.Path != m.Path):
			return nil, conflict("The adapter `%s` is registered with base `%s` and path `%s`; delete it first to change them.",
				m.Name, cur.Base, cur.Path)
		case ok:
			return nil, nil // the same adapter: nothing to write
		}
		created = true
		if m.Created == 0 {
			m.Created = time.Now().Unix()
		}
		b, _ := json.Marshal(m)
		return func(p redis.Pipeliner) { p.HSet(ctx, keyModels, m.Name, b) }, nil
	})
	return created, err
}

// RemoveModel deletes a model and returns what it deleted: the model first,
// then, for a base model, its adapters. A base model that still has adapters
// is ErrConflict unless force is set, which deletes the adapters too.
func (s *Store) RemoveModel(ctx context.Context, name string, force bool) ([]Model, error) {
	var removed []Model
	err := s.updateModels(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
		all, err := tx.HGetAll(ctx, keyModels).Result()
		if err != nil {
			return nil, err
		}
		raw, ok := all[name]
		if !ok {
			return nil, modelNotFound(name)
		}
		var m Model
		_ = json.Unmarshal([]byte(raw), &m)
		m.Name = name
		removed = []Model{m}
		if !m.IsAdapter() {
			for _, a := range decodeModels(all) {
				if a.Base == name {
					removed = append(removed, a)
				}
			}
		}
		if len(removed) > 1 && !force {
			names := make([]string, 0, len(removed)-1)
			for _, a := range removed[1:] {
				names = append(names, a.Name)
			}
			return nil, conflict("The base model `%s` has %d adapter(s) (%s); delete them first or force.",
				name, len(names), joinNames(names))
		}
		return func(p redis.Pipeliner) {
			for _, r := range removed {
				p.HDel(ctx, keyModels, r.Name)
			}
		}, nil
	})
	if err != nil {
		return nil, err
	}
	return removed, nil
}

// Adapters returns the adapters registered on base.
func (s *Store) Adapters(ctx context.Context, base string) ([]Model, error) {
	all, err := s.Models(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(m Model) bool { return m.Base != base }), nil
}

// getModel reads one model inside a transaction.
func getModel(ctx context.Context, tx *redis.Tx, name string) (Model, bool, error) {
	b, err := tx.HGet(ctx, keyModels, name).Bytes()
	if errors.Is(err, redis.Nil) {
		return Model{}, false, nil
	}
	if err != nil {
		return Model{}, false, err
	}
	var m Model
	if err := json.Unmarshal(b, &m); err != nil {
		return Model{}, false, err
	}
	return m, true, nil
}

// updateModels runs an optimistic transaction on the models hash.
func (s *Store) updateModels(ctx context.Context, decide func(*redis.Tx) (func(redis.Pipeliner), error)) error {
	return s.update(ctx, decide, keyModels)
}

// update runs decide under WATCH of keys and applies the writes it returns
// in MULTI/EXEC, retrying when another client changed a watched key in
// between. decide returning nil writes means nothing to do.
func (s *Store) update(ctx context.Context, decide func(*redis.Tx) (func(redis.Pipeliner), error), keys ...string) error {
	const attempts = 20
	var err error
	for range attempts {
		err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			write, err := decide(tx)
			if err != nil || write == nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				write(p)
				return nil
			})
			return err
		}, keys...)
		if !errors.Is(err, redis.TxFailedErr) {
			return storeErr(err)
		}
	}
	return storeErr(err)
}

func joinNames(names []string) string {
	const show = 5
	out := ""
	for i, n := range names {
		if i == show {
			return out + ", ..."
		}
		if i > 0 {
			out += ", "
		}
		out += "`" + n + "`"
	}
	return out
}

// RemoveAdapter deletes an adapter: ErrNotFound if there is none of that
// name, ErrInvalid if the name is a base model.
func (s *Store) RemoveAdapter(ctx context.Context, name string) (Model, error) {
	var m Model
	err := s.updateModels(ctx, func(tx *redis.Tx) (func(redis.Pipeliner), error) {
		cur, ok, err := getModel(ctx, tx, name)
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return nil, modelNotFound(name)
		case !cur.IsAdapter():
			return nil, invalid(schemas.ErrInvalidValue.At("name", "name", fmt.Sprintf("`%s` is a base model, not an adapter", name)))
		}
		m = cur
		return func(p redis.Pipeliner) { p.HDel(ctx, keyModels, name) }, nil
	})
	return m, err
}
