package batch

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/tokenbus/tokenbus/schemas"
)

// The JetStream names the batch API keeps its state under.
const (
	FilesBucket   = "TOKENBUS_FILES"         // Object Store: uploaded and produced files
	BatchesBucket = "TOKENBUS_BATCHES"       // Key-Value: one record per batch, by batch id
	WorkStream    = "TOKENBUS_BATCH"         // work queue: one message per line not yet answered
	ResultStream  = "TOKENBUS_BATCH_RESULTS" // one message per answered line
)

// Subjects. <batch-id> is a valid subject token (letters, digits, '_').
const (
	// WorkPrefix + <batch-id>: a line of the batch's input file, as is;
	// header HdrLine its 1-based line number.
	WorkPrefix = schemas.Prefix + ".batch.work."
	// ResultPrefix + <batch-id> + ".ok" or ".err": an OutputLine, with
	// Nats-Msg-Id <batch-id>/<custom_id>.
	ResultPrefix = schemas.Prefix + ".batch.result."
	// HdrLine is the line number of a work message.
	HdrLine = "Tb-Batch-Line"
)

// Endpoints a batch may name, and the request kind of each.
var endpoints = map[string]schemas.Kind{
	"/v1/chat/completions": schemas.KindChat,
	"/v1/completions":      schemas.KindCompletion,
	"/v1/embeddings":       schemas.KindEmbedding, // one unary request each, like the others
}

// Endpoints lists the endpoints a batch may name, sorted.
func Endpoints() []string {
	out := make([]string, 0, len(endpoints))
	for e := range endpoints {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

// Config tunes a Store. Zero values take the defaults shown.
type Config struct {
	Replicas int // of every stream and bucket; default 1 (3 on a NATS cluster)
	// MaxLines bounds a batch's input file; past it the batch fails
	// validation. Default 50000 (OpenAI's).
	MaxLines int
	// MaxLineBytes bounds one line; default 1 MiB less headroom for the
	// headers (a line travels as one NATS message).
	MaxLineBytes int
	// ResultsMaxAge bounds how long results wait for a batch to be
	// finalised; default 7 days (a 24h window and room for outages).
	ResultsMaxAge time.Duration
	// DedupWindow is the results stream's de-duplication window: a result
	// recorded again within it (a line redelivered after a crash) is not
	// stored twice. Finalising de-duplicates by custom_id as well, so a
	// repeat past the window is still answered once. Default 2h.
	DedupWindow time.Duration
	// The most each surface may hold, in bytes: the files bucket (default
	// 1 GiB), the work queue and the results stream (512 MiB each), the
	// batches bucket and the index bucket (64 MiB each). Each has its own
	// ceiling (and the server reserves it), so one filling up leaves the
	// others working; a full one refuses new writes (discard new), never
	// drops what it holds.
	FilesMaxBytes, WorkMaxBytes, ResultsMaxBytes, RecordsMaxBytes int64
	// Quotas, if set, gives a tenant's quota (Quota); nil: none.
	Quotas func(ctx context.Context, tenant string) (Quota, error)
}

func (c *Config) defaults() {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.MaxLines <= 0 {
		c.MaxLines = 50_000
	}
	if c.MaxLineBytes <= 0 {
		c.MaxLineBytes = 1<<20 - 16<<10
	}
	if c.ResultsMaxAge <= 0 {
		c.ResultsMaxAge = 7 * 24 * time.Hour
	}
	if c.DedupWindow <= 0 {
		c.DedupWindow = 2 * time.Hour
	}
	if c.FilesMaxBytes <= 0 {
		c.FilesMaxBytes = 1 << 30
	}
	if c.WorkMaxBytes <= 0 {
		c.WorkMaxBytes = 512 << 20
	}
	if c.ResultsMaxBytes <= 0 {
		c.ResultsMaxBytes = 512 << 20
	}
	if c.RecordsMaxBytes <= 0 {
		c.RecordsMaxBytes = 64 << 20
	}
}

// Store keeps files and batches in JetStream. Make one with Open; it is safe
// for concurrent use, and any number of gateways may share the same state.
type Store struct {
	cfg      Config
	js       jetstream.JetStream
	files    jetstream.ObjectStore
	filesRaw jetstream.Stream // the object store's stream: its subjects purged on delete
	batches  jetstream.KeyValue
	work     jetstream.Stream
	results  jetstream.Stream
	idx      *index // nil: none (idxErr says why)
	idxErr   error
	now      func() time.Time

	uses    uses        // this process's uploads per tenant (quota.go)
	indexed atomic.Bool // the index is known to cover everything
	// creating serialises one tenant's batch creations in this process,
	// so that two cannot pass the batches quota together.
	creating sync.Map // tenant -> *sync.Mutex
}

// Open makes (or finds) the buckets and streams.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Store, error) {
	cfg.defaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, js: js, now: time.Now}
	if s.files, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: FilesBucket,
		Description: "tokenbus files: batch input, output and error files", Storage: jetstream.FileStorage,
		Replicas: cfg.Replicas, MaxBytes: cfg.FilesMaxBytes}); err != nil {
		return nil, fmt.Errorf("files bucket: %w", err)
	}
	if s.filesRaw, err = js.Stream(ctx, "OBJ_"+FilesBucket); err != nil {
		return nil, fmt.Errorf("files bucket: %w", err)
	}
	if s.batches, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BatchesBucket,
		Description: "tokenbus batches: one record per batch", Storage: jetstream.FileStorage,
		Replicas: cfg.Replicas, History: 1, MaxBytes: cfg.RecordsMaxBytes}); err != nil {
		return nil, fmt.Errorf("batches bucket: %w", err)
	}
	if s.work, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: WorkStream,
		Description: "tokenbus batch lines waiting to run", Subjects: []string{WorkPrefix + "*"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
		Discard: jetstream.DiscardNew, Duplicates: cfg.DedupWindow, MaxBytes: cfg.WorkMaxBytes}); err != nil {
		return nil, fmt.Errorf("work stream: %w", err)
	}
	// Discard new: a full results stream refuses an answer (the line runs
	// again later) rather than drop the oldest answers of running batches.
	if s.results, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: ResultStream,
		Description: "tokenbus batch lines answered, until their batch is finalised",
		Subjects:    []string{ResultPrefix + "*.*"}, Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage,
		Replicas: cfg.Replicas, MaxAge: cfg.ResultsMaxAge, Duplicates: min(cfg.DedupWindow, cfg.ResultsMaxAge),
		MaxBytes: cfg.ResultsMaxBytes, Discard: jetstream.DiscardNew}); err != nil {
		return nil, fmt.Errorf("results stream: %w", err)
	}
	// Without the index (a NATS user not yet granted its bucket) the store
	// works as before it: listings and quota counts scan. IndexErr says so.
	// A permissions violation is not answered: the request waits out its
	// context, so the index gets its own, shorter one.
	ictx, cancel := context.WithTimeout(ctx, indexOpenTimeout)
	defer cancel()
	idx := &index{nc: nc}
	if idx.kv, err = js.CreateOrUpdateKeyValue(ictx, jetstream.KeyValueConfig{Bucket: IndexBucket,
		Description: "tokenbus files and batches by tenant: listings and quota counts", Storage: jetstream.FileStorage,
		Replicas: cfg.Replicas, History: 1, MaxBytes: cfg.RecordsMaxBytes}); err == nil {
		idx.stream, err = js.Stream(ictx, "KV_"+IndexBucket)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		s.idxErr = fmt.Errorf("index bucket %s: %w", IndexBucket, err)
		return s, nil
	}
	s.idx = idx
	return s, nil
}

// indexOpenTimeout bounds making the index bucket.
const indexOpenTimeout = 2 * time.Second

// IndexErr is why the store has no per-tenant index (nil when it has one):
// then every listing and quota count reads every object's metadata.
func (s *Store) IndexErr() error { return s.idxErr }

// unavailable wraps a JetStream failure as the client sees it: a full
// bucket or stream (or JetStream's whole store) is ErrStorageFull, anything
// else ErrBatchesOff.
func unavailable(err error) error {
	var e *schemas.Error
	if errors.As(err, &e) {
		return e
	}
	if full(err) {
		return schemas.ErrStorageFull.New()
	}
	return schemas.ErrBatchesOff.New(err)
}

// nats-server's error codes for a store with no room left.
const (
	jsInsufficientResources jetstream.ErrorCode = 10023
	jsStorageExceeded       jetstream.ErrorCode = 10047
)

// full reports whether err is JetStream refusing a write for want of room:
// a stream at its MaxBytes (discard new), or the server's or account's
// store exhausted.
func full(err error) bool {
	var ae *jetstream.APIError
	if errors.As(err, &ae) && (ae.ErrorCode == jsInsufficientResources || ae.ErrorCode == jsStorageExceeded) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "maximum bytes exceeded") || strings.Contains(msg, "insufficient resources") ||
		strings.Contains(msg, "insufficient storage")
}

// --- Files ---

// Object metadata keys of a file.
const (
	metaTenant   = "tenant"
	metaPurpose  = "purpose"
	metaFilename = "filename"
	metaCreated  = "created_at"
)

// PutFile stores r (read to its end, in chunks: never all in memory) as a
// new file of tenant, within the tenant's quota (AdmitUpload, Upload.Put).
// limit bounds its size (0: none): past it the file is removed and
// ErrFileTooLarge returned.
func (s *Store) PutFile(ctx context.Context, tenant, filename, purpose string, r io.Reader, limit int64) (File, error) {
	u, err := s.AdmitUpload(ctx, tenant, 0)
	if err != nil {
		return File{}, err
	}
	defer u.Close()
	return u.Put(ctx, filename, purpose, r, limit)
}

// putFile stores r as file id of tenant, then its index entry. Without the
// entry the file is removed again: a file is listed and counted from the
// moment it is stored.
func (s *Store) putFile(ctx context.Context, id, tenant, filename, purpose string, r io.Reader, limit int64) (File, error) {
	created := s.now().Unix()
	lr := &limitReader{r: r, n: limit}
	// Chunks of the object store's full size, whatever the reader's reads
	// (a multipart part returns a few KiB at a time).
	info, err := s.files.Put(ctx, jetstream.ObjectMeta{Name: id, Metadata: map[string]string{
		metaTenant: tenant, metaPurpose: purpose, metaFilename: filename, metaCreated: strconv.FormatInt(created, 10)}},
		fullReader{lr})
	if lr.over {
		if info != nil || err == nil {
			s.cleanUp(ctx, func(ctx context.Context) error { return s.removeObject(ctx, id) })
		}
		return File{}, schemas.ErrFileTooLarge.New(limit)
	}
	if err != nil {
		// The object store purges the chunks of a failed put, but a chunk
		// refused asynchronously (a full bucket) is seen only after its
		// metadata went out: remove whatever is left.
		s.cleanUp(ctx, func(ctx context.Context) error { return s.removeObject(ctx, id) })
		var e *schemas.Error
		if errors.As(err, &e) {
			return File{}, e // the body's reader failed with an API error (a quota)
		}
		return File{}, unavailable(err)
	}
	f := fileOf(info)
	if err := s.idx.putFile(ctx, tenant, f); err != nil {
		s.cleanUp(ctx, func(ctx context.Context) error { return s.removeObject(ctx, id) })
		return File{}, unavailable(err)
	}
	return f, nil
}

// fullReader reads until p is full (or the end): each Read of the object
// store is one chunk message.
type fullReader struct{ r io.Reader }

func (f fullReader) Read(p []byte) (int, error) {
	n, err := io.ReadFull(f.r, p)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	return n, err
}

// limitReader fails once more than n bytes were read (n 0: no limit).
type limitReader struct {
	r    io.Reader
	n    int64
	read int64
	over bool
}

var errOverLimit = errors.New("file over the size limit")

// cleanUp runs fn, which undoes part of a write that failed, even when
// ctx has ended (a client gone, a deadline passed), for a few seconds.
func (s *Store) cleanUp(ctx context.Context, fn func(context.Context) error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = fn(cctx)
}

// removeObject removes file id's chunks, then its metadata, by purging
// their subjects. Unlike the object store's Delete, which writes a delete
// marker first, a purge writes nothing: it frees space on a full store.
func (s *Store) removeObject(ctx context.Context, id string) error {
	info, err := s.files.GetInfo(ctx, id, jetstream.GetObjectInfoShowDeleted())
	if err != nil {
		return err
	}
	if info.NUID != "" {
		if err := s.filesRaw.Purge(ctx, jetstream.WithPurgeSubject("$O."+FilesBucket+".C."+info.NUID)); err != nil {
			return err
		}
	}
	return s.filesRaw.Purge(ctx, jetstream.WithPurgeSubject("$O."+FilesBucket+".M."+base64.URLEncoding.EncodeToString([]byte(id))))
}

func (l *limitReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.read += int64(n)
	if l.n > 0 && l.read > l.n {
		l.over = true
		return 0, errOverLimit
	}
	return n, err
}

func fileOf(info *jetstream.ObjectInfo) File {
	created, _ := strconv.ParseInt(info.Metadata[metaCreated], 10, 64)
	return File{ID: info.Name, Object: "file", Bytes: int64(info.Size), CreatedAt: created,
		Filename: info.Metadata[metaFilename], Purpose: info.Metadata[metaPurpose], Status: "processed",
		tenant: info.Metadata[metaTenant]}
}

// File returns tenant's file id; ErrFileNotFound if there is none, or it is
// another tenant's.
func (s *Store) File(ctx context.Context, tenant, id string) (File, error) {
	if !validFileID(id) {
		return File{}, schemas.ErrFileNotFound.New(id)
	}
	info, err := s.files.GetInfo(ctx, id)
	if errors.Is(err, jetstream.ErrObjectNotFound) || (err == nil && info.Metadata[metaTenant] != tenant) {
		return File{}, schemas.ErrFileNotFound.New(id)
	}
	if err != nil {
		return File{}, unavailable(err)
	}
	return fileOf(info), nil
}

// OpenFile opens tenant's file id for reading; the caller closes it.
func (s *Store) OpenFile(ctx context.Context, tenant, id string) (io.ReadCloser, File, error) {
	f, err := s.File(ctx, tenant, id)
	if err != nil {
		return nil, File{}, err
	}
	// A chunk at a time, as the client takes it (readChunks): the object
	// store's own reader pushes the whole file into the gateway's memory
	// as fast as the server sends it, and leaves a consumer behind.
	r, err := s.readChunks(ctx, id)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, File{}, schemas.ErrFileNotFound.New(id)
	}
	if err != nil {
		return nil, File{}, unavailable(err)
	}
	return r, f, nil
}

// DeleteFile removes tenant's file id and its index entry. It writes
// nothing (purges only), so it works, and frees space, while JetStream is
// full.
func (s *Store) DeleteFile(ctx context.Context, tenant, id string) error {
	if _, err := s.File(ctx, tenant, id); err != nil {
		return err
	}
	if err := s.removeObject(ctx, id); err != nil {
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return schemas.ErrFileNotFound.New(id)
		}
		return unavailable(err)
	}
	if err := s.idx.remove(ctx, kindFile, tenant, id); err != nil {
		// The file is gone; its entry is removed by the next Reconcile.
		return unavailable(err)
	}
	return nil
}

// ListQuery pages a list: the items after the id After (exclusive; ""
// from the start), at most Limit (1..10000 for files, 1..100 for
// batches; 0 the default), newest first unless Asc.
type ListQuery struct {
	After   string
	Limit   int
	Asc     bool
	Purpose string // files only: "" all
}

// Files lists tenant's files, from the index: other tenants' files are not
// read.
func (s *Store) Files(ctx context.Context, tenant string, q ListQuery) (FileList, error) {
	mine, err := s.tenantFiles(ctx, tenant)
	if err != nil {
		return FileList{}, unavailable(err)
	}
	var all []File
	for _, f := range mine {
		if q.Purpose == "" || f.Purpose == q.Purpose {
			all = append(all, f)
		}
	}
	page, more := pageOf(all, q, 10_000, func(f File) (int64, string) { return f.CreatedAt, f.ID })
	l := FileList{Object: "list", Data: page, HasMore: more}
	if len(page) > 0 {
		l.FirstID, l.LastID = &page[0].ID, &page[len(page)-1].ID
	}
	if l.Data == nil {
		l.Data = []File{}
	}
	return l, nil
}

// tenantFiles is every file of tenant: from the index, or, until the index
// covers everything (an older deployment before its first Reconcile), a
// scan of every object.
func (s *Store) tenantFiles(ctx context.Context, tenant string) ([]File, error) {
	ok, err := s.indexReady(ctx)
	if err != nil {
		return nil, err
	}
	if ok {
		return s.idx.files(ctx, tenant)
	}
	return s.scanFiles(ctx, tenant)
}

// scanFiles is every file of tenant, from every object's metadata: what
// listings did before the index.
func (s *Store) scanFiles(ctx context.Context, tenant string) ([]File, error) {
	infos, err := s.files.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, err
	}
	var out []File
	for _, info := range infos {
		if f := fileOf(info); f.tenant == tenant {
			out = append(out, f)
		}
	}
	return out, nil
}

// fileUse is tenant's files and their bytes.
func (s *Store) fileUse(ctx context.Context, tenant string) (FileUse, error) {
	files, err := s.tenantFiles(ctx, tenant)
	if err != nil {
		return FileUse{}, err
	}
	u := FileUse{Files: int64(len(files))}
	for _, f := range files {
		u.FileBytes += f.Bytes
	}
	return u, nil
}

// Use is what tenant keeps in the store: its files, their bytes, and its
// batches not yet ended.
func (s *Store) Use(ctx context.Context, tenant string) (FileUse, error) {
	u, err := s.fileUse(ctx, tenant)
	if err != nil {
		return FileUse{}, unavailable(err)
	}
	if u.Batches, err = s.activeBatches(ctx, tenant); err != nil {
		return FileUse{}, unavailable(err)
	}
	return u, nil
}

// indexReady reports whether the index covers every object and record;
// once it does, it always will (entries are written with each change).
func (s *Store) indexReady(ctx context.Context) (bool, error) {
	if s.indexed.Load() {
		return true, nil
	}
	ok, err := s.idx.ready(ctx)
	if ok {
		s.indexed.Store(true)
	}
	return ok, err
}

// pageOf sorts items by (created, id), newest first unless q.Asc, and
// returns the page after q.After.
func pageOf[T any](items []T, q ListQuery, maxLimit int, key func(T) (int64, string)) ([]T, bool) {
	limit := q.Limit
	if limit <= 0 {
		limit = 20
	}
	limit = min(limit, maxLimit)
	slices.SortFunc(items, func(a, b T) int {
		ca, ia := key(a)
		cb, ib := key(b)
		c := cmpInt(ca, cb)
		if c == 0 {
			c = strings.Compare(ia, ib)
		}
		if !q.Asc {
			c = -c
		}
		return c
	})
	if q.After != "" {
		i := slices.IndexFunc(items, func(t T) bool { _, id := key(t); return id == q.After })
		items = items[i+1:] // i is -1 for an unknown cursor: from the start, as OpenAI does
	}
	if len(items) > limit {
		return items[:limit], true
	}
	return items, false
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// --- Batches ---

// CreateRequest is the body of POST /v1/batches.
type CreateRequest struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

// Check validates a create request as OpenAI does before a batch exists.
func (r CreateRequest) Check() error {
	switch {
	case r.InputFileID == "":
		return schemas.ErrMissingParam.At("input_file_id", "input_file_id")
	case r.Endpoint == "":
		return schemas.ErrMissingParam.At("endpoint", "endpoint")
	case r.CompletionWindow == "":
		return schemas.ErrMissingParam.At("completion_window", "completion_window")
	case r.CompletionWindow != "24h":
		return schemas.ErrInvalidValue.At("completion_window", "completion_window", "only '24h' is supported")
	}
	if err := schemas.CheckMetadata(r.Metadata); err != nil {
		return err
	}
	if _, ok := endpoints[r.Endpoint]; !ok {
		return schemas.ErrInvalidValue.At("endpoint", "endpoint", "supported are "+strings.Join(Endpoints(), ", "))
	}
	return nil
}

// completionWindow is the only window OpenAI offers.
const completionWindow = 24 * time.Hour

// newBatchID is "batch_" and a time-ordered, unique suffix of letters and
// digits (a subject token and a consumer name as it is).
func newBatchID(t time.Time) string {
	return fmt.Sprintf("batch_%011x%s", t.UnixMilli(), nuid.Next()[12:])
}

// CreateBatch records a new batch of tenant (and API key keyID, whose model
// list the lines are checked against) in status validating; a runner
// validates its input file and queues its lines.
func (s *Store) CreateBatch(ctx context.Context, tenant, keyID string, req CreateRequest) (Batch, error) {
	if err := req.Check(); err != nil {
		return Batch{}, err
	}
	f, err := s.File(ctx, tenant, req.InputFileID)
	if err != nil {
		return Batch{}, err
	}
	if f.Purpose != "batch" {
		return Batch{}, schemas.ErrInvalidValue.At("input_file_id", "input_file_id", "the file's purpose must be 'batch'")
	}
	q, err := s.quota(ctx, tenant)
	if err != nil {
		return Batch{}, err
	}
	if q.Batches > 0 {
		// One creation of the tenant's at a time in this process: the
		// count below then includes every batch this process made.
		mu, _ := s.creating.LoadOrStore(tenant, &sync.Mutex{})
		mu.(*sync.Mutex).Lock()
		defer mu.(*sync.Mutex).Unlock()
		n, err := s.activeBatches(ctx, tenant)
		if err != nil {
			return Batch{}, unavailable(err)
		}
		if n+1 > q.Batches {
			return Batch{}, schemas.ErrBatchQuota.New(q.Batches)
		}
	}
	now := s.now()
	exp := now.Add(completionWindow).Unix()
	rec := record{Batch: Batch{ID: newBatchID(now), Object: "batch", Endpoint: req.Endpoint, InputFileID: req.InputFileID,
		CompletionWindow: req.CompletionWindow, Status: StatusValidating, CreatedAt: now.Unix(), ExpiresAt: &exp,
		Metadata: req.Metadata}, Tenant: tenant, KeyID: keyID}
	// The index entry first: a record is never without one (an entry
	// without a record is skipped, and dropped when counted).
	if err := s.idx.putBatch(ctx, tenant, entryOf(rec)); err != nil {
		return Batch{}, unavailable(err)
	}
	b, _ := json.Marshal(rec)
	if _, err := s.batches.Create(ctx, rec.ID, b); err != nil {
		s.cleanUp(ctx, func(ctx context.Context) error { return s.idx.remove(ctx, kindBatch, tenant, rec.ID) })
		return Batch{}, unavailable(err)
	}
	return rec.Batch, nil
}

func entryOf(rec record) batchEntry {
	return batchEntry{ID: rec.ID, Tenant: rec.Tenant, CreatedAt: rec.CreatedAt, Status: rec.Status}
}

// activeBatches counts tenant's batches not yet ended. The index's status
// may lag its record (a process that died between the two writes): an
// entry that says running is checked against its record, and mended.
func (s *Store) activeBatches(ctx context.Context, tenant string) (int64, error) {
	entries, err := s.tenantBatches(ctx, tenant)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range entries {
		if terminal(e.Status) {
			continue
		}
		rec, _, err := s.get(ctx, e.ID)
		switch {
		case schemas.ErrBatchNotFound.Is(schemas.AsError(err)):
			// An entry whose record was never written (CreateBatch
			// failed between the two); an older one than a minute is not
			// a creation in progress.
			if s.now().Unix()-e.CreatedAt > 60 {
				_ = s.idx.remove(ctx, kindBatch, tenant, e.ID)
			} else {
				n++
			}
			continue
		case err != nil:
			return 0, err
		case terminal(rec.Status):
			_ = s.idx.putBatch(ctx, tenant, entryOf(rec))
			continue
		}
		n++
	}
	return n, nil
}

// tenantBatches is the index entry of every batch of tenant, or, until the
// index covers everything, the same read from every record.
func (s *Store) tenantBatches(ctx context.Context, tenant string) ([]batchEntry, error) {
	ok, err := s.indexReady(ctx)
	if err != nil {
		return nil, err
	}
	if ok {
		return s.idx.batches(ctx, tenant)
	}
	recs, err := s.all(ctx)
	if err != nil {
		return nil, err
	}
	var out []batchEntry
	for _, r := range recs {
		if r.Tenant == tenant {
			out = append(out, entryOf(r))
		}
	}
	return out, nil
}

// get reads a batch record with its revision.
func (s *Store) get(ctx context.Context, id string) (record, uint64, error) {
	if !validBatchID(id) {
		return record{}, 0, schemas.ErrBatchNotFound.New(id)
	}
	e, err := s.batches.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return record{}, 0, schemas.ErrBatchNotFound.New(id)
	}
	if err != nil {
		return record{}, 0, unavailable(err)
	}
	var rec record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return record{}, 0, schemas.ErrInternal.New("batch record " + id + " is not JSON")
	}
	return rec, e.Revision(), nil
}

// validBatchID: what newBatchID makes (a KV key and a subject token).
func validBatchID(id string) bool {
	rest, ok := strings.CutPrefix(id, "batch_")
	if !ok || rest == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// Batch returns tenant's batch id, with its progress counted.
func (s *Store) Batch(ctx context.Context, tenant, id string) (Batch, error) {
	rec, _, err := s.get(ctx, id)
	if err != nil {
		return Batch{}, err
	}
	if rec.Tenant != tenant {
		return Batch{}, schemas.ErrBatchNotFound.New(id)
	}
	s.progress(ctx, &rec)
	return rec.Batch, nil
}

// progress fills the request counts of a running batch from the results
// stream's per-subject counts (a repeat that slipped past de-duplication
// can count twice until the batch is finalised, which counts exactly).
func (s *Store) progress(ctx context.Context, rec *record) {
	if rec.Status != StatusInProgress && rec.Status != StatusCancelling && rec.Status != StatusFinalizing {
		return
	}
	ok, failed, err := s.resultCounts(ctx, rec.ID)
	if err != nil {
		return
	}
	rec.RequestCounts.Completed = min(ok, rec.RequestCounts.Total)
	rec.RequestCounts.Failed = min(failed, rec.RequestCounts.Total-rec.RequestCounts.Completed)
}

func (s *Store) resultCounts(ctx context.Context, id string) (ok, failed int, err error) {
	info, err := s.results.Info(ctx, jetstream.WithSubjectFilter(ResultPrefix+id+".*"))
	if err != nil {
		return 0, 0, err
	}
	return int(info.State.Subjects[ResultPrefix+id+".ok"]), int(info.State.Subjects[ResultPrefix+id+".err"]), nil
}

// Batches lists tenant's batches: the page is chosen from the index, then
// only its records are read.
func (s *Store) Batches(ctx context.Context, tenant string, q ListQuery) (BatchList, error) {
	entries, err := s.tenantBatches(ctx, tenant)
	if err != nil {
		return BatchList{}, unavailable(err)
	}
	ids, more := pageOf(entries, q, 100, func(e batchEntry) (int64, string) { return e.CreatedAt, e.ID })
	page := make([]Batch, 0, len(ids))
	for _, e := range ids {
		r, _, err := s.get(ctx, e.ID)
		if schemas.ErrBatchNotFound.Is(schemas.AsError(err)) || (err == nil && r.Tenant != tenant) {
			continue // an entry without its record (a creation that failed midway)
		}
		if err != nil {
			return BatchList{}, err
		}
		s.progress(ctx, &r)
		page = append(page, r.Batch)
	}
	l := BatchList{Object: "list", Data: page, HasMore: more}
	if len(page) > 0 {
		l.FirstID, l.LastID = &page[0].ID, &page[len(page)-1].ID
	}
	if l.Data == nil {
		l.Data = []Batch{}
	}
	return l, nil
}

// all reads every batch record.
func (s *Store) all(ctx context.Context) ([]record, error) {
	lister, err := s.batches.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = lister.Stop() }()
	var out []record
	for k := range lister.Keys() {
		rec, _, err := s.get(ctx, k)
		if err != nil {
			continue // deleted since it was listed
		}
		out = append(out, rec)
	}
	return out, nil
}

// CancelBatch asks for tenant's batch id to be cancelled: it goes to
// cancelling, and a runner answers its lines not yet run as cancelled,
// lets those running finish, and finalises it as cancelled.
func (s *Store) CancelBatch(ctx context.Context, tenant, id string) (Batch, error) {
	for {
		rec, rev, err := s.get(ctx, id)
		if err != nil {
			return Batch{}, err
		}
		if rec.Tenant != tenant {
			return Batch{}, schemas.ErrBatchNotFound.New(id)
		}
		switch rec.Status {
		case StatusCancelling, StatusCancelled:
			s.progress(ctx, &rec)
			return rec.Batch, nil
		case StatusValidating, StatusInProgress:
		default:
			return Batch{}, schemas.ErrBatchState.New(rec.Status)
		}
		now := s.now().Unix()
		rec.Status, rec.CancellingAt = StatusCancelling, &now
		err = s.put(ctx, rec, rev)
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // changed under us: look again
		}
		if err != nil {
			return Batch{}, unavailable(err)
		}
		s.progress(ctx, &rec)
		return rec.Batch, nil
	}
}

// put writes rec if the stored one is still at revision rev
// (jetstream.ErrKeyExists otherwise): runners and gateways never overwrite
// each other's changes.
//
// The batch's index entry follows the record's status; if writing it
// fails, the record stands (the entry is derived: counting checks it
// against the record, and Reconcile rewrites it).
func (s *Store) put(ctx context.Context, rec record, rev uint64) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err = s.batches.Update(ctx, rec.ID, b, rev); err != nil {
		return err
	}
	_ = s.idx.putBatch(ctx, rec.Tenant, entryOf(rec))
	return nil
}

// AdminBatch is a batch as the admin API lists it: every tenant's, with
// its tenant and, while it runs, its lines still queued.
type AdminBatch struct {
	Batch
	Tenant string `json:"tenant"`
	Model  string `json:"model,omitempty"`
	Queued int    `json:"queued_lines"`
}

// AdminBatches lists every tenant's batches, newest first; with active, only
// those not yet ended.
func (s *Store) AdminBatches(ctx context.Context, active bool) ([]AdminBatch, error) {
	recs, err := s.all(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	queued := map[string]uint64{}
	if info, err := s.work.Info(ctx, jetstream.WithSubjectFilter(WorkPrefix+"*")); err == nil {
		for subj, n := range info.State.Subjects {
			queued[strings.TrimPrefix(subj, WorkPrefix)] = n
		}
	}
	out := []AdminBatch{}
	for _, r := range recs {
		if active && terminal(r.Status) {
			continue
		}
		s.progress(ctx, &r)
		out = append(out, AdminBatch{Batch: r.Batch, Tenant: r.Tenant, Model: r.Model, Queued: int(queued[r.ID])})
	}
	slices.SortFunc(out, func(a, b AdminBatch) int {
		if c := cmpInt(b.CreatedAt, a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	return out, nil
}

// BatchTenant is the tenant of batch id, for the admin API (which acts for
// every tenant through the tenant-scoped methods); ErrBatchNotFound if
// there is none.
func (s *Store) BatchTenant(ctx context.Context, id string) (string, error) {
	rec, _, err := s.get(ctx, id)
	if err != nil {
		return "", err
	}
	return rec.Tenant, nil
}

// Queued counts the lines of every batch waiting in the work queue (taken
// by no runner yet, or taken and not yet acknowledged).
func (s *Store) Queued(ctx context.Context) (uint64, error) {
	info, err := s.work.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}
