package batch

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/nats-io/nats.go/jetstream"
)

// readChunks opens file id of the files bucket for a runner to read, one
// chunk (128 KiB) at a time by direct gets of the bucket's stream: no
// consumer is made, and at most one chunk is held. The object store's own
// Get delivers the whole object to a push consumer as fast as the server
// sends it, whatever the reader takes: a 200 MiB input file read by a
// validation took ~2x its size in memory, and every read left a consumer
// behind for minutes. The size and SHA-256 the object was stored with are
// checked at the end.
func (s *Store) readChunks(ctx context.Context, id string) (io.ReadCloser, error) {
	info, err := s.files.GetInfo(ctx, id)
	if err != nil {
		return nil, err
	}
	if info.NUID == "" || info.Opts != nil && info.Opts.Link != nil {
		return nil, fmt.Errorf("file %s is not a plain object", id)
	}
	r := &chunkReader{ctx: ctx, size: info.Size, digest: info.Digest, sum: sha256.New(),
		subject: "$O." + FilesBucket + ".C." + info.NUID, seq: 1}
	if info.Size == 0 {
		return r, nil
	}
	if r.stream, err = s.js.Stream(ctx, "OBJ_"+FilesBucket); err != nil {
		return nil, err
	}
	return r, nil
}

type chunkReader struct {
	ctx     context.Context
	stream  jetstream.Stream
	subject string
	seq     uint64 // the next chunk is the first message of subject at or after it
	size    uint64
	read    uint64
	digest  string
	sum     hash.Hash
	buf     []byte // what is left of the chunk read last
	err     error
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 && r.err == nil {
		r.next()
	}
	if len(r.buf) == 0 {
		return 0, r.err
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// next reads the next chunk, or ends the object: io.EOF when its size and
// digest are as stored.
func (r *chunkReader) next() {
	if r.read >= r.size {
		r.err = io.EOF
		if r.size > 0 && r.digest != digestOf(r.sum) {
			r.err = errors.New("the file's content does not match its digest")
		}
		return
	}
	if err := r.ctx.Err(); err != nil {
		r.err = err
		return
	}
	m, err := r.stream.GetMsg(r.ctx, r.seq, jetstream.WithGetMsgSubject(r.subject))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		err = fmt.Errorf("the file ends after %d of its %d bytes", r.read, r.size)
	}
	if err != nil {
		r.err = err
		return
	}
	r.seq = m.Sequence + 1
	r.read += uint64(len(m.Data))
	r.sum.Write(m.Data)
	r.buf = m.Data
}

func (r *chunkReader) Close() error { return nil }

// digestOf is a SHA-256 as the object store writes it in an object's info.
func digestOf(h hash.Hash) string {
	return "SHA-256=" + base64.URLEncoding.EncodeToString(h.Sum(nil))
}
