package usage

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/schemas"
)

// The stream and its one durable consumer.
const (
	Stream   = "TOKENBUS_USAGE"
	Consumer = "tokenbus-usage"
)

// StreamConfig bounds the stream. Zero values take the defaults shown.
// When it is full it refuses new records (DiscardNew: records already in
// it are never thrown away for newer ones); publishers then buffer and
// retry, then drop and count (see Publisher).
type StreamConfig struct {
	MaxBytes int64         // default 1 GiB
	MaxMsgs  int64         // default 10 million
	MaxAge   time.Duration // a record not written by then is dropped; default 7 days
	Replicas int           // default 1; 3 on a NATS cluster
}

func (c StreamConfig) stream() jetstream.StreamConfig {
	if c.MaxBytes <= 0 {
		c.MaxBytes = 1 << 30
	}
	if c.MaxMsgs <= 0 {
		c.MaxMsgs = 10_000_000
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 7 * 24 * time.Hour
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	return jetstream.StreamConfig{
		Name:        Stream,
		Description: "tokenbus usage records waiting to be written to Redis",
		Subjects:    []string{schemas.UsagePrefix + ">"},
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardNew,
		Storage:     jetstream.FileStorage,
		MaxBytes:    c.MaxBytes,
		MaxMsgs:     c.MaxMsgs,
		MaxAge:      c.MaxAge,
		Replicas:    c.Replicas,
		Duplicates:  2 * time.Minute, // a publish retried after a lost ack is stored once
	}
}

// EnsureStream creates the stream, or updates its limits.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	return js.CreateOrUpdateStream(ctx, cfg.stream())
}

// msgID is the record's Nats-Msg-Id: a publish retried within the stream's
// duplicate window is stored once.
func msgID(rec schemas.UsageRecord) string { return rec.KeyID + ":" + rec.RequestID }

// EncodeRecords appends recs to dst as one usage message: JSON Lines, one
// schemas.UsageRecord per line (a single record is the same, one line).
func EncodeRecords(dst []byte, recs []schemas.UsageRecord) []byte {
	for i := range recs {
		if i > 0 {
			dst = append(dst, '\n')
		}
		dst = schemas.AppendUsageRecord(dst, &recs[i])
	}
	return dst
}

// DecodeRecords reads a usage message: the records of its lines, and the
// lines that are no usage record (bad JSON, or no request id), each with
// why. Blank lines are skipped.
func DecodeRecords(data []byte) (recs []schemas.UsageRecord, bad []error) {
	for line := range bytes.SplitSeq(data, []byte{'\n'}) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		rec, ok := schemas.ParseUsageRecord(line)
		switch {
		case !ok:
			bad = append(bad, errNotRecord)
		case rec.RequestID == "":
			bad = append(bad, errNoRequestID)
		default:
			recs = append(recs, rec)
		}
	}
	return recs, bad
}

var (
	errNoRequestID = errors.New("a usage record without request_id")
	errNotRecord   = errors.New("not a usage record: malformed JSON, a member of the wrong type or a repeated key")
)
