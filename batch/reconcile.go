package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Reconcile makes the index match the objects and records: an entry for
// every file and batch that lacks one (a deployment from before the index,
// or a process that died between storing a file and its entry), the status
// of every batch, and no entry for a file that is gone. Then it marks the
// index as covering everything, and listings read it instead of scanning.
// It reads every object's metadata and every record once: run it at start
// (any number of gateways may, at once). It returns what it changed.
func (s *Store) Reconcile(ctx context.Context) (added, removed int, err error) {
	if s.idx == nil {
		return 0, 0, s.idxErr
	}
	// Entries first, then objects: a file stored in between has its entry
	// by the time it is listed as an object (or gets one here).
	have := map[string]string{} // key -> value, every entry
	for _, kind := range []string{kindFile, kindBatch} {
		if err := s.idx.scan(ctx, kind, func(key string, data []byte) { have[key] = string(data) }); err != nil {
			return 0, 0, fmt.Errorf("read the index: %w", err)
		}
	}
	infos, err := s.files.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, 0, fmt.Errorf("list the files: %w", err)
	}
	objects := map[string]bool{}
	for _, info := range infos {
		f := fileOf(info)
		key := indexKey(kindFile, f.tenant, f.ID)
		objects[key] = true
		if _, ok := have[key]; ok {
			continue
		}
		if err := s.idx.putFile(ctx, f.tenant, f); err != nil {
			return added, removed, err
		}
		added++
		// Deleted meanwhile? Then its delete purged the entry before this
		// wrote it: take it out again.
		if _, err := s.files.GetInfo(ctx, f.ID); errors.Is(err, jetstream.ErrObjectNotFound) {
			_ = s.idx.remove(ctx, kindFile, f.tenant, f.ID)
		}
	}
	for key := range have {
		kind, rest, _ := strings.Cut(key, ".")
		tok, id, _ := strings.Cut(rest, ".")
		tenant, ok := tenantOfToken(tok)
		if kind != kindFile || objects[key] || !ok {
			continue
		}
		// Not listed: gone, or stored after the listing. Look.
		if _, err := s.files.GetInfo(ctx, id); errors.Is(err, jetstream.ErrObjectNotFound) {
			if err := s.idx.remove(ctx, kindFile, tenant, id); err != nil {
				return added, removed, err
			}
			removed++
		}
	}
	recs, err := s.all(ctx)
	if err != nil {
		return added, removed, fmt.Errorf("read the batches: %w", err)
	}
	for _, rec := range recs {
		e := entryOf(rec)
		key := indexKey(kindBatch, rec.Tenant, rec.ID)
		var cur batchEntry
		if v, ok := have[key]; ok && jsonInto(v, &cur) && cur.Status == e.Status && cur.CreatedAt == e.CreatedAt {
			continue
		}
		if err := s.idx.putBatch(ctx, rec.Tenant, e); err != nil {
			return added, removed, err
		}
		added++
	}
	if _, err := s.idx.kv.Put(ctx, indexReady, []byte("1")); err != nil {
		return added, removed, err
	}
	s.indexed.Store(true)
	return added, removed, nil
}

func jsonInto(s string, v any) bool { return json.Unmarshal([]byte(s), v) == nil }
