package batch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/schemas"
)

// Tenant tokens are subject tokens for any name, and two names never
// share one.
func TestTenantToken(t *testing.T) {
	seen := map[string]string{}
	for _, tenant := range []string{"", "a", "A", "a.b", "a_b", "a-b", "a/b", "a b", "ü", strings.Repeat("x", 256)} {
		tok := tenantToken(tenant)
		if strings.ContainsAny(tok, ".*> \t") || tok == "" {
			t.Errorf("%q: token %q is not a subject token", tenant, tok)
		}
		if other, ok := seen[tok]; ok {
			t.Errorf("%q and %q share the token %q", tenant, other, tok)
		}
		seen[tok] = tenant
		if back, ok := tenantOfToken(tok); !ok || back != tenant {
			t.Errorf("%q: back %q %v", tenant, back, ok)
		}
	}
}

// A tenant's listing and use come from its own index entries, read in
// pages (more entries than one direct get returns), kept on upload and
// delete; batches too.
func TestIndexListsOwnTenant(t *testing.T) {
	s := openStore(t, Config{})
	ctx := context.Background()
	if _, _, err := s.Reconcile(ctx); err != nil { // an empty store: ready at once
		t.Fatal(err)
	}
	for i := range scanBatch*2 + 10 {
		if _, err := s.PutFile(ctx, "other", fmt.Sprint(i), "batch", strings.NewReader("x"), 0); err != nil {
			t.Fatal(err)
		}
	}
	var mine []File
	for i := range 3 {
		f, err := s.PutFile(ctx, "acme", fmt.Sprintf("a%d", i), "batch", strings.NewReader(strings.Repeat("y", 10*(i+1))), 0)
		if err != nil {
			t.Fatal(err)
		}
		mine = append(mine, f)
	}
	if l, err := s.Files(ctx, "acme", ListQuery{}); err != nil || len(l.Data) != 3 || l.Data[0].ID != mine[2].ID || l.Data[0].Bytes != 30 {
		t.Fatalf("acme's files: %+v %v", l, err)
	}
	if l, err := s.Files(ctx, "other", ListQuery{Limit: 10_000}); err != nil || len(l.Data) != scanBatch*2+10 {
		t.Fatalf("other's files (more than one page of the index): %d %v", len(l.Data), err)
	}
	if err := s.DeleteFile(ctx, "acme", mine[1].ID); err != nil {
		t.Fatal(err)
	}
	if u, err := s.Use(ctx, "acme"); err != nil || u.Files != 2 || u.FileBytes != 40 {
		t.Fatalf("acme's use after a delete: %+v %v", u, err)
	}
	b, err := s.CreateBatch(ctx, "acme", "", CreateRequest{InputFileID: mine[0].ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s.Batches(ctx, "acme", ListQuery{}); err != nil || len(l.Data) != 1 || l.Data[0].ID != b.ID {
		t.Fatalf("acme's batches: %+v %v", l, err)
	}
	if l, err := s.Batches(ctx, "other", ListQuery{}); err != nil || len(l.Data) != 0 {
		t.Fatalf("other's batches: %+v %v", l, err)
	}
	// The record changes status: its entry follows.
	if _, err := s.CancelBatch(ctx, "acme", b.ID); err != nil {
		t.Fatal(err)
	}
	es, _ := s.idx.batches(ctx, "acme")
	if len(es) != 1 || es[0].Status != StatusCancelling {
		t.Fatalf("entry after cancel: %+v", es)
	}
}

// An older deployment has objects and records and no index: listings scan
// until Reconcile has written the entries, and read the index after.
// Reconcile also drops the entry of a file that is gone, and mends a
// batch's status.
func TestReconcile(t *testing.T) {
	s := openStore(t, Config{})
	ctx := context.Background()
	// Written as the code before the index did: objects and records only.
	info, err := s.files.Put(ctx, jetstream.ObjectMeta{Name: "file-old1", Metadata: map[string]string{metaTenant: "acme",
		metaPurpose: "batch", metaFilename: "old.jsonl", metaCreated: "100"}}, strings.NewReader("old"))
	if err != nil {
		t.Fatal(err)
	}
	rec := record{Batch: Batch{ID: "batch_0old", Object: "batch", Status: StatusInProgress, CreatedAt: 100}, Tenant: "acme"}
	raw, _ := json.Marshal(rec)
	if _, err := s.batches.Create(ctx, rec.ID, raw); err != nil {
		t.Fatal(err)
	}
	if l, err := s.Files(ctx, "acme", ListQuery{}); err != nil || len(l.Data) != 1 || l.Data[0].ID != info.Name {
		t.Fatalf("before Reconcile (a scan): %+v %v", l, err)
	}
	if l, err := s.Batches(ctx, "acme", ListQuery{}); err != nil || len(l.Data) != 1 {
		t.Fatalf("batches before Reconcile: %+v %v", l, err)
	}
	added, removed, err := s.Reconcile(ctx)
	if err != nil || added != 2 || removed != 0 {
		t.Fatalf("Reconcile: +%d -%d %v", added, removed, err)
	}
	if ok, _ := s.indexReady(ctx); !ok {
		t.Fatal("not ready after Reconcile")
	}
	if fs, _ := s.idx.files(ctx, "acme"); len(fs) != 1 || fs[0].ID != "file-old1" || fs[0].Bytes != 3 {
		t.Fatalf("entries: %+v", fs)
	}
	if n, err := s.activeBatches(ctx, "acme"); err != nil || n != 1 {
		t.Fatalf("active: %d %v", n, err)
	}
	// Behind the index's back: a file goes, a batch ends.
	if err := s.files.Delete(ctx, "file-old1"); err != nil {
		t.Fatal(err)
	}
	rec.Status = StatusCompleted
	raw, _ = json.Marshal(rec)
	if _, err := s.batches.Put(ctx, rec.ID, raw); err != nil {
		t.Fatal(err)
	}
	// Counting checks a running entry against its record, and mends it.
	if n, err := s.activeBatches(ctx, "acme"); err != nil || n != 0 {
		t.Fatalf("active after the record ended: %d %v", n, err)
	}
	if _, removed, err := s.Reconcile(ctx); err != nil || removed != 1 {
		t.Fatalf("Reconcile after a delete: -%d %v", removed, err)
	}
	if l, _ := s.Files(ctx, "acme", ListQuery{}); len(l.Data) != 0 {
		t.Fatalf("a gone file listed: %+v", l)
	}
}

// quotaStore is a store with these quotas for every tenant.
func quotaStore(t *testing.T, q Quota) *Store {
	return openStore(t, Config{Quotas: func(context.Context, string) (Quota, error) { return q, nil }})
}

// Quotas: the count and the bytes known from the Content-Length refuse an
// upload before it is read; a stream is cut as it passes the bytes, and
// nothing of it is kept; concurrent uploads of one tenant cannot pass the
// quota together; batches count until they end.
func TestQuotas(t *testing.T) {
	s := quotaStore(t, Quota{FileBytes: 1000, Files: 3, Batches: 1})
	ctx := context.Background()
	isQuota := func(err error) bool { return schemas.ErrFileQuota.Is(schemas.AsError(err)) }
	f1, err := s.PutFile(ctx, "acme", "a", "batch", strings.NewReader(strings.Repeat("x", 400)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AdmitUpload(ctx, "acme", 601); !isQuota(err) {
		t.Fatalf("601 more bytes by their length: %v", err)
	}
	if _, err := s.PutFile(ctx, "acme", "b", "batch", strings.NewReader(strings.Repeat("x", 700)), 0); !isQuota(err) {
		t.Fatalf("700 more bytes streamed: %v", err)
	}
	if u, _ := s.Use(ctx, "acme"); u.Files != 1 || u.FileBytes != 400 {
		t.Fatalf("use after a cut upload: %+v", u)
	}
	if objs, _ := s.files.List(ctx); len(objs) != 1 {
		t.Fatalf("%d objects after a cut upload, want 1", len(objs))
	}
	// Two uploads at once, 400 bytes each, with 600 left: one is cut.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	var pws []*io.PipeWriter
	for i := range 2 {
		u, err := s.AdmitUpload(ctx, "acme", 0)
		if err != nil {
			t.Fatal(err)
		}
		pr, pw := io.Pipe()
		pws = append(pws, pw)
		wg.Go(func() {
			defer u.Close()
			_, errs[i] = u.Put(ctx, "c", "batch", pr, 0)
		})
	}
	for _, pw := range pws { // both are streaming before either ends
		_, _ = pw.Write([]byte(strings.Repeat("x", 200)))
	}
	for _, pw := range pws {
		_, _ = pw.Write([]byte(strings.Repeat("x", 200)))
		_ = pw.Close()
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) || !(isQuota(errs[0]) || isQuota(errs[1])) {
		t.Fatalf("two concurrent uploads past the quota together: %v, %v", errs[0], errs[1])
	}
	// The count: 2 files now; the third fits, the fourth is refused on
	// admission.
	if _, err := s.PutFile(ctx, "acme", "d", "batch", strings.NewReader("x"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AdmitUpload(ctx, "acme", 0); !isQuota(err) {
		t.Fatalf("a fourth file: %v", err)
	}
	// Another tenant has its own.
	if _, err := s.PutFile(ctx, "other", "e", "batch", strings.NewReader(strings.Repeat("x", 900)), 0); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	// Batches: one not ended, then refused; once it ends, another.
	req := CreateRequest{InputFileID: f1.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}
	b, err := s.CreateBatch(ctx, "acme", "", req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateBatch(ctx, "acme", "", req); !schemas.ErrBatchQuota.Is(schemas.AsError(err)) {
		t.Fatalf("a second batch: %v", err)
	}
	rec, rev, _ := s.get(ctx, b.ID)
	rec.Status = StatusFailed
	if err := s.put(ctx, rec, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateBatch(ctx, "acme", "", req); err != nil {
		t.Fatalf("a batch after the first ended: %v", err)
	}
	if len(s.uses.m) != 0 {
		t.Fatalf("upload accounting left behind: %d tenants", len(s.uses.m))
	}
}

// A full files bucket: a new file is refused (507, nothing kept), a delete
// still works and frees the room.
func TestFullBucket(t *testing.T) {
	s := openStore(t, Config{FilesMaxBytes: 1 << 20})
	ctx := context.Background()
	var ids []string
	for {
		f, err := s.PutFile(ctx, "acme", "f", "batch", strings.NewReader(strings.Repeat("x", 300<<10)), 0)
		if err != nil {
			if !schemas.ErrStorageFull.Is(schemas.AsError(err)) {
				t.Fatalf("into a full bucket: %v", err)
			}
			break
		}
		ids = append(ids, f.ID)
	}
	if len(ids) == 0 || len(ids) > 3 {
		t.Fatalf("%d files of 300 KiB in 1 MiB", len(ids))
	}
	// The rest, until not a byte fits: the object store's own delete
	// (a marker written first) would fail now.
	for _, size := range []int{16 << 10, 1 << 10, 64, 1} {
		for {
			f, err := s.PutFile(ctx, "acme", "f", "batch", strings.NewReader(strings.Repeat("x", size)), 0)
			if err != nil {
				break
			}
			ids = append(ids, f.ID)
		}
	}
	if l, _ := s.Files(ctx, "acme", ListQuery{}); len(l.Data) != len(ids) {
		t.Fatalf("listed %d, stored %d", len(l.Data), len(ids))
	}
	if err := s.DeleteFile(ctx, "acme", ids[0]); err != nil {
		t.Fatalf("delete on a full bucket: %v", err)
	}
	if _, err := s.PutFile(ctx, "other", "f", "batch", strings.NewReader(strings.Repeat("x", 300<<10)), 0); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
}

// TestListingFigures measures GET /v1/files's store call for one tenant
// with 3 files beside another tenant's many: the index against the scan
// of every object the listing did before it.
//
//	TOKENBUS_LIST_FIGURES=33000 go test -count=1 -v -run TestListingFigures ./batch/
func TestListingFigures(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TOKENBUS_LIST_FIGURES"))
	if n <= 0 {
		t.Skip("set TOKENBUS_LIST_FIGURES to the other tenant's number of files")
	}
	s := openStore(t, Config{})
	ctx := context.Background()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if _, err := s.PutFile(ctx, "other", fmt.Sprint(i), "batch", strings.NewReader(`{"custom_id":"x"}`), 0); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	for i := range 3 {
		if _, err := s.PutFile(ctx, "acme", fmt.Sprint(i), "batch", strings.NewReader("x"), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	time1 := func(list func() ([]File, error)) time.Duration {
		const runs = 5
		start := time.Now()
		for range runs {
			fs, err := list()
			if err != nil || len(fs) != 3 {
				t.Fatalf("%d files, %v", len(fs), err)
			}
		}
		return time.Since(start) / runs
	}
	scan := time1(func() ([]File, error) { return s.scanFiles(ctx, "acme") })
	idx := time1(func() ([]File, error) { return s.idx.files(ctx, "acme") })
	t.Logf("one tenant's 3 files beside another's %d: scan %s, index %s: %.0fx faster", n, scan.Round(time.Microsecond),
		idx.Round(time.Microsecond), float64(scan)/float64(idx))
}

// A download reads the file a chunk at a time as the client takes it: it
// makes no consumer on the files bucket (the object store's own reader made
// one, and pushed the whole file into memory at the server's pace), and
// the bytes and their digest are checked.
func TestOpenFileReadsChunks(t *testing.T) {
	s := openStore(t, Config{})
	ctx := context.Background()
	content := strings.Repeat("0123456789abcdef", 40<<10) // 640 KiB: five chunks
	f, err := s.PutFile(ctx, "acme", "f", "batch", strings.NewReader(content), 0)
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := s.OpenFile(ctx, "acme", f.ID)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(r, first); err != nil {
		t.Fatal(err)
	}
	// A slow client: one byte read so far. Nothing is pushed meanwhile.
	st, err := s.js.Stream(ctx, "OBJ_"+FilesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Consumers; n != 0 {
		t.Fatalf("%d consumers on the files bucket while a download is read", n)
	}
	rest, err := io.ReadAll(r)
	_ = r.Close()
	if b := string(first) + string(rest); err != nil || b != content {
		t.Fatalf("read %d of %d bytes: %v", len(b), len(content), err)
	}
	if _, _, err := s.OpenFile(ctx, "beta", f.ID); !schemas.ErrFileNotFound.Is(schemas.AsError(err)) {
		t.Fatalf("another tenant's file: %v", err)
	}
}
