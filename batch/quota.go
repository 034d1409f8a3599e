package batch

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/schemas"
)

// Quota is what one tenant may keep in the store: its files' bytes and
// count (output files included), and its batches not yet ended. A field of
// 0 or less is no limit.
type Quota struct {
	FileBytes int64
	Files     int64
	Batches   int64
}

// FileUse is what a tenant keeps in the store, from the index.
type FileUse struct {
	Files     int64 `json:"files"`
	FileBytes int64 `json:"file_bytes"`
	Batches   int64 `json:"batches"` // not yet ended
}

// Quotas are checked before anything is written: an upload over the count,
// or whose Content-Length already passes the bytes, is refused before its
// body is read; otherwise the upload is cut as soon as its bytes pass the
// quota and its chunks removed. A tenant's use is read from the index when
// an upload is admitted; what this process's uploads of the tenant add
// after that (those still streaming and those finished since) is counted
// here, in memory, so that concurrent uploads on one gateway cannot pass
// the quota together. Across G gateways each sees only its own uploads:
// together they can pass the bytes quota by at most (G-1) times what was
// left, and the count by (G-1) times the per-tenant upload limit. Batches
// likewise: one gateway creates a tenant's batches one at a time.

// tenantUse is one tenant's uploads in this process.
type tenantUse struct {
	refs      int   // admissions open
	streaming int64 // bytes read by uploads still running
	running   int64 // uploads admitted and not yet stored or closed
	doneBytes int64 // bytes of the uploads finished since the entry was made
	doneFiles int64
}

// uses is the tenantUse of every tenant with an upload open, and a lock
// per tenant for batch creation.
type uses struct {
	mu sync.Mutex
	m  map[string]*tenantUse
}

// acquire is tenant's entry, held until release; with uses.mu held.
func (u *uses) acquire(tenant string) *tenantUse {
	if u.m == nil {
		u.m = map[string]*tenantUse{}
	}
	t := u.m[tenant]
	if t == nil {
		t = &tenantUse{}
		u.m[tenant] = t
	}
	t.refs++
	return t
}

// release lets tenant's entry go; with uses.mu held.
func (u *uses) release(tenant string, t *tenantUse) {
	t.refs--
	if t.refs == 0 {
		delete(u.m, tenant) // nobody holds a snapshot of its counters
	}
}

// Upload is one admitted upload of a tenant: Put stores its file, Close
// ends the admission (after Put, or instead of it).
type Upload struct {
	s      *Store
	tenant string
	q      Quota
	t      *tenantUse // nil: no quota to count against
	// The index's use when admitted, and this process's finished uploads
	// of the tenant then: what finished since is doneBytes-bytes0.
	used           FileUse
	bytes0, files0 int64
	running        bool // counted in t.running
	put, closed    bool
}

// AdmitUpload admits one upload of tenant whose file is at least least
// bytes long (from its Content-Length; 0 unknown): ErrFileQuota if the
// tenant is at its count, or the file cannot fit in its bytes quota.
func (s *Store) AdmitUpload(ctx context.Context, tenant string, least int64) (*Upload, error) {
	q, err := s.quota(ctx, tenant)
	if err != nil {
		return nil, err
	}
	u := &Upload{s: s, tenant: tenant, q: q}
	if q.FileBytes <= 0 && q.Files <= 0 {
		return u, nil
	}
	s.uses.mu.Lock()
	u.t = s.uses.acquire(tenant)
	u.bytes0, u.files0 = u.t.doneBytes, u.t.doneFiles
	s.uses.mu.Unlock()
	// Read after the snapshot: an upload that finished before it is in the
	// index already (it counts itself done after its entry is written).
	if u.used, err = s.fileUse(ctx, tenant); err != nil {
		u.Close()
		return nil, unavailable(err)
	}
	s.uses.mu.Lock()
	files, bytes := u.useLocked()
	var refused error
	switch {
	case q.Files > 0 && files+1 > q.Files:
		refused = schemas.ErrFileQuota.New("files", q.Files, files)
	case q.FileBytes > 0 && bytes+max(least, 0) > q.FileBytes:
		refused = schemas.ErrFileQuota.New("file bytes", q.FileBytes, bytes)
	default:
		u.t.running++ // checked and counted at once: a concurrent admission sees it
		u.running = true
	}
	s.uses.mu.Unlock()
	if refused != nil {
		u.Close()
		return nil, refused
	}
	return u, nil
}

// useLocked is the tenant's files and bytes as this upload counts them:
// the index's when it was admitted, plus what this process's uploads of the
// tenant added since (finished, and still streaming). An upload that
// finished between the snapshot and the index read counts twice: the error
// is on the safe side.
func (u *Upload) useLocked() (files, bytes int64) {
	t := u.t
	return u.used.Files + t.doneFiles - u.files0 + t.running,
		u.used.FileBytes + t.doneBytes - u.bytes0 + t.streaming
}

// quota is tenant's quota; none without Config.Quotas.
func (s *Store) quota(ctx context.Context, tenant string) (Quota, error) {
	if s.cfg.Quotas == nil {
		return Quota{}, nil
	}
	return s.cfg.Quotas(ctx, tenant)
}

// Put stores r (read to its end, in chunks: never all in memory) as the
// upload's file. limit bounds its size (0: none): past it the file is
// removed and ErrFileTooLarge returned; past the tenant's bytes quota,
// ErrFileQuota. Once per Upload.
func (u *Upload) Put(ctx context.Context, filename, purpose string, r io.Reader, limit int64) (File, error) {
	if u.put || u.closed {
		return File{}, schemas.ErrInternal.New("an upload stored twice")
	}
	u.put = true
	var src io.Reader = r
	qr := &quotaReader{u: u, r: r}
	if u.t != nil && u.q.FileBytes > 0 {
		src = qr
	}
	f, err := u.s.putFile(ctx, "file-"+nuid.Next(), u.tenant, filename, purpose, src, limit)
	if qr.over && !schemas.ErrFileTooLarge.Is(schemas.AsError(err)) {
		err = schemas.ErrFileQuota.New("file bytes", u.q.FileBytes, u.q.FileBytes)
	}
	if u.t != nil {
		u.s.uses.mu.Lock()
		u.t.streaming -= qr.read
		if u.running {
			u.t.running--
			u.running = false
		}
		if err == nil {
			u.t.doneBytes += f.Bytes
			u.t.doneFiles++
		}
		u.s.uses.mu.Unlock()
	}
	return f, err
}

// Close ends the admission; it may be called more than once.
func (u *Upload) Close() {
	if u.t == nil {
		u.closed = true
		return
	}
	u.s.uses.mu.Lock()
	defer u.s.uses.mu.Unlock()
	if u.closed {
		return
	}
	u.closed = true
	if u.running {
		u.t.running--
		u.running = false
	}
	u.s.uses.release(u.tenant, u.t)
}

// quotaReader counts an upload's bytes against its tenant's quota as they
// are read, and fails the read that passes it.
type quotaReader struct {
	u    *Upload
	r    io.Reader
	read int64
	over bool
}

var errOverQuota = errors.New("file over the tenant's bytes quota")

func (q *quotaReader) Read(p []byte) (int, error) {
	n, err := q.r.Read(p)
	if n > 0 {
		u := q.u
		u.s.uses.mu.Lock()
		u.t.streaming += int64(n)
		q.read += int64(n)
		_, total := u.useLocked()
		u.s.uses.mu.Unlock()
		if total > u.q.FileBytes {
			q.over = true
			return 0, errOverQuota
		}
	}
	return n, err
}
