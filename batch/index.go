package batch

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The per-tenant index: one small entry per file and per batch in the
// Key-Value bucket IndexBucket, keyed by kind, tenant and id, so that a
// tenant's listing and its quota counts read its own entries only.
//
// Why JetStream and not Redis: the objects and records it indexes are in
// JetStream, so an entry and its object live and fail together (no second
// store whose outage or loss would hide files), and a gateway without Redis
// keeps it. A tenant's entries are read with batched direct gets filtered
// by subject (no consumer is created, and the server walks its per-subject
// index rather than other tenants' messages). Entries are removed by a
// subject purge, which writes nothing: it works on a full store.
//
// Keys: f.<tenant-token>.<file-id> (the File as JSON) and
// b.<tenant-token>.<batch-id> (batchEntry). The tenant token is "t" and the
// tenant's name in unpadded base64url: a subject token for any name, ""
// included, and two names never share one.

// IndexBucket is the Key-Value bucket of the per-tenant index.
const IndexBucket = "TOKENBUS_INDEX"

// indexReady is the key set once the index covers every object and record
// (the first Reconcile); until then listings scan, as before the index.
const indexReady = "ready"

// Kinds of entries.
const (
	kindFile  = "f"
	kindBatch = "b"
)

// tenantToken is tenant as one subject token.
func tenantToken(tenant string) string {
	return "t" + base64.RawURLEncoding.EncodeToString([]byte(tenant))
}

// tenantOfToken reverses tenantToken.
func tenantOfToken(tok string) (string, bool) {
	rest, ok := strings.CutPrefix(tok, "t")
	if !ok {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	return string(b), err == nil
}

func indexKey(kind, tenant, id string) string { return kind + "." + tenantToken(tenant) + "." + id }

// indexSubject is the subject an index key is stored under.
func indexSubject(key string) string { return "$KV." + IndexBucket + "." + key }

// batchEntry is a batch's index entry: enough to page a listing and to
// count the batches not yet ended without reading their records.
type batchEntry struct {
	ID        string `json:"-"`
	Tenant    string `json:"-"`
	CreatedAt int64  `json:"created_at"`
	Status    string `json:"status"`
}

// index is the per-tenant index on its bucket.
type index struct {
	nc     *nats.Conn
	kv     jetstream.KeyValue
	stream jetstream.Stream
}

// Writes and removals on a nil index (a store without one) do nothing.

func (x *index) putFile(ctx context.Context, tenant string, f File) error {
	if x == nil {
		return nil
	}
	b, _ := json.Marshal(f)
	_, err := x.kv.Put(ctx, indexKey(kindFile, tenant, f.ID), b)
	return err
}

func (x *index) putBatch(ctx context.Context, tenant string, e batchEntry) error {
	if x == nil {
		return nil
	}
	b, _ := json.Marshal(e)
	_, err := x.kv.Put(ctx, indexKey(kindBatch, tenant, e.ID), b)
	return err
}

// remove purges an entry: no delete marker is written, so it works while
// JetStream is full.
func (x *index) remove(ctx context.Context, kind, tenant, id string) error {
	if x == nil {
		return nil
	}
	return x.stream.Purge(ctx, jetstream.WithPurgeSubject(indexSubject(indexKey(kind, tenant, id))))
}

// files is tenant's file entries.
func (x *index) files(ctx context.Context, tenant string) ([]File, error) {
	var out []File
	err := x.scan(ctx, kindFile+"."+tenantToken(tenant), func(_ string, data []byte) {
		var f File
		if json.Unmarshal(data, &f) == nil && f.ID != "" {
			f.tenant = tenant
			out = append(out, f)
		}
	})
	return out, err
}

// batches is tenant's batch entries.
func (x *index) batches(ctx context.Context, tenant string) ([]batchEntry, error) {
	var out []batchEntry
	err := x.scan(ctx, kindBatch+"."+tenantToken(tenant), func(key string, data []byte) {
		var e batchEntry
		if json.Unmarshal(data, &e) == nil {
			e.ID, e.Tenant = key[strings.LastIndexByte(key, '.')+1:], tenant
			out = append(out, e)
		}
	})
	return out, err
}

// scanBatch is how many entries one direct get returns at most.
const scanBatch = 256

// defaultScanTimeout bounds a scan whose context has no deadline.
const defaultScanTimeout = 30 * time.Second

// scan calls fn with the key and value of every entry under prefix (keys
// prefix.>), in stream order, with batched direct gets: each asks for the
// next scanBatch messages on the filter after the last one seen, and ends
// with an end-of-batch message saying how many are still pending.
func (x *index) scan(ctx context.Context, prefix string, fn func(key string, data []byte)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultScanTimeout)
		defer cancel()
	}
	inbox := x.nc.NewRespInbox()
	sub, err := x.nc.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	filter := indexSubject(prefix + ".>")
	keyStart := len(indexSubject(""))
	api := "$JS.API.DIRECT.GET.KV_" + IndexBucket
	var seq uint64
	for {
		req, _ := json.Marshal(map[string]any{"seq": seq, "next_by_subj": filter, "batch": scanBatch})
		if err := x.nc.PublishRequest(api, inbox, req); err != nil {
			return err
		}
		for {
			m, err := sub.NextMsgWithContext(ctx)
			if err != nil {
				return fmt.Errorf("index scan: %w", err)
			}
			switch m.Header.Get("Status") {
			case "":
			case "404": // nothing (more) matches
				return nil
			case "204": // end of this batch
				if m.Header.Get("Nats-Num-Pending") == "0" {
					return nil
				}
				last, err := strconv.ParseUint(m.Header.Get("Nats-Last-Sequence"), 10, 64)
				if err != nil || last == 0 {
					return errors.New("index scan: a batch ended without a last sequence")
				}
				seq = last + 1
			default:
				return fmt.Errorf("index scan: %s %s", m.Header.Get("Status"), m.Header.Get("Description"))
			}
			if m.Header.Get("Status") == "204" {
				break
			}
			if s, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64); err == nil {
				seq = s + 1
			}
			subj := m.Header.Get("Nats-Subject")
			if len(subj) <= keyStart || m.Header.Get("KV-Operation") != "" { // a delete or purge marker
				continue
			}
			fn(subj[keyStart:], m.Data)
		}
	}
}

// ready reports whether the index covers everything (Reconcile has run
// once on this bucket).
func (x *index) ready(ctx context.Context) (bool, error) {
	if x == nil {
		return false, nil
	}
	_, err := x.kv.Get(ctx, indexReady)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	return err == nil, err
}
