package responses

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenbus/tokenbus/schemas"
)

// Quota bounds what one tenant keeps and runs; 0 is no limit.
type Quota struct {
	// Stored: responses (store:true, background) and resumable streams
	// kept, within the retention.
	Stored int
	// Background: background responses queued or running.
	Background int
	// Resumable: resumable chat streams queued or running.
	Resumable int
}

// FixedQuota is a Config.Quota giving every tenant q.
func FixedQuota(q Quota) func(context.Context, string) (Quota, error) {
	return func(context.Context, string) (Quota, error) { return q, nil }
}

// The kinds of work, the last token of a work subject.
const (
	kindBackground = "bg"
	kindChat       = "chat"
)

// TenantToken is a tenant as one subject token (and consumer name part): a
// tenant name may hold any character, so it is hashed (96 bits: two
// tenants share a token with odds of 2^-96 per pair).
func TenantToken(tenant string) string {
	h := sha256.Sum256([]byte(tenant))
	return "t" + hex.EncodeToString(h[:12])
}

func workSubject(tenant, kind string) string { return WorkPrefix + TenantToken(tenant) + "." + kind }

func kindOf(rec *Record) string {
	if rec.Kind == KindChat {
		return kindChat
	}
	return kindBackground
}

// quota is tenant's quota, none without Config.Quota.
func (s *Store) quota(ctx context.Context, tenant string) (Quota, error) {
	if s.cfg.Quota == nil {
		return Quota{}, nil
	}
	q, err := s.cfg.Quota(ctx, tenant)
	if err != nil {
		var e *schemas.Error
		if errors.As(err, &e) {
			return Quota{}, e
		}
		return Quota{}, schemas.ErrResponsesOff.New("the tenant's quota could not be read")
	}
	return q, nil
}

// admitWork checks tenant's queued and running work of kind against its
// quota: one count of the work queue's subject (a message stays there
// until its run ends). Concurrent requests may each see room: the quota
// can be passed by as many as arrive at once, never more.
func (s *Store) admitWork(ctx context.Context, tenant, kind string, q Quota) error {
	limit, what, frees := q.Background, "background responses queued or running", "wait for one to end or cancel one"
	if kind == kindChat {
		limit, what, frees = q.Resumable, "resumable streams queued or running", "wait for one to end or cancel one"
	}
	if limit <= 0 {
		return nil
	}
	subj := workSubject(tenant, kind)
	info, err := s.work.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return unavailable(err)
	}
	if n := info.State.Subjects[subj]; n >= uint64(limit) {
		return schemas.ErrResponseQuota.New(n, what, frees)
	}
	return nil
}

// reserve checks tenant's stored responses against its quota and counts
// response id among them (rec.Index); call it before the record is
// written, and unreserve if it is not.
func (s *Store) reserve(ctx context.Context, rec *Record, q Quota) error {
	subj := IndexPrefix + TenantToken(rec.Tenant)
	if q.Stored > 0 {
		info, err := s.index.Info(ctx, jetstream.WithSubjectFilter(subj))
		if err != nil {
			return unavailable(err)
		}
		if n := info.State.Subjects[subj]; n >= uint64(q.Stored) {
			return schemas.ErrResponseQuota.New(n, "stored responses and resumable streams",
				"delete some (DELETE /v1/responses/{id}) or wait for them to expire")
		}
	}
	id := rec.Response.ID
	ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: []byte(id),
		Header: nats.Header{jetstream.MsgIDHeader: []string{id}}})
	if err != nil {
		return unavailable(err)
	}
	rec.Index = ack.Sequence
	return nil
}

// unreserve takes rec out of its tenant's count. It works on a full
// store (a delete needs no room) and outlives a cancelled request.
func (s *Store) unreserve(ctx context.Context, rec *Record) {
	if rec.Index == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = s.index.DeleteMsg(dctx, rec.Index)
	rec.Index = 0
}

// Reserve counts a foreground response to be stored (store:true) against
// its tenant's quota before it is generated: a 429 then comes before any
// token. Put stores it; Release undoes a reservation never stored.
func (s *Store) Reserve(ctx context.Context, rec *Record) error {
	q, err := s.quota(ctx, rec.Tenant)
	if err != nil {
		return err
	}
	return s.reserve(ctx, rec, q)
}

// Release undoes Reserve for a response that was not stored.
func (s *Store) Release(ctx context.Context, rec *Record) { s.unreserve(ctx, rec) }

// Submit stores a background response or resumable stream (queued) and
// queues it for a runner, on its tenant's subject, once its tenant's
// quotas allow: a refusal (429) or a failure writes nothing that stays.
func (s *Store) Submit(ctx context.Context, rec *Record) error {
	q, err := s.quota(ctx, rec.Tenant)
	if err != nil {
		return err
	}
	kind := kindOf(rec)
	if err := s.admitWork(ctx, rec.Tenant, kind, q); err != nil {
		return err
	}
	if err := s.reserve(ctx, rec, q); err != nil {
		return err
	}
	if err := s.Put(ctx, rec); err != nil {
		s.unreserve(ctx, rec)
		return err
	}
	id := rec.Response.ID
	_, err = s.js.PublishMsg(ctx, &nats.Msg{Subject: workSubject(rec.Tenant, kind), Data: []byte(id),
		Header: nats.Header{jetstream.MsgIDHeader: []string{id}}})
	if err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = s.purge(dctx, id)
		cancel()
		s.unreserve(ctx, rec)
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && strings.Contains(apiErr.Description, "per subject") {
			// The server's own ceiling (workPerSubject), whatever Quota said.
			return schemas.ErrResponseQuota.New(workPerSubject, "requests of this kind queued or running (the server's ceiling)", "wait for one to end")
		}
		return unavailable(err)
	}
	select {
	case s.queued <- TenantToken(rec.Tenant):
	default: // a runner polls too
	}
	return nil
}
