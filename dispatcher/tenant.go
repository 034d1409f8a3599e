package dispatcher

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// Tenant requests. A NATS-native tenant publishes on
// schemas.TenantReqSubject(<key-id>, <model>), and the NATS permissions that
// tokenbus generates (tokenbus nats-users) let each tenant user publish only
// under its own key ids: the subject says who is asking, no header does. The
// dispatcher looks the key up, answers only into the key's tenant inbox,
// checks the key's model list and its limits, and marks the request for the
// worker (Tb-Tenant, Tb-Key-Id, the reservation), having removed every such
// header the client sent.

// Keys looks API keys up by id; registry.Store implements it. A key that is
// not there (deleted) is registry.ErrNotFound.
type Keys interface {
	Key(ctx context.Context, id string) (registry.Key, error)
}

// tenantKey is the key of a tenant request, or why it is dropped: an
// unknown key has no tenant, so there is no inbox it may be answered in.
func (d *Dispatcher) tenantKey(keyID string) (registry.Key, bool) {
	if d.cfg.Keys == nil {
		d.m.rejected.WithLabelValues("no_keys").Inc()
		return registry.Key{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.KeyTimeout)
	defer cancel()
	k, err := d.cfg.Keys.Key(ctx, keyID)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		d.m.rejected.WithLabelValues("unknown_key").Inc()
		d.log.Warn("dropping a tenant request for an unknown API key", "key_id", keyID)
		return registry.Key{}, false
	case err != nil:
		d.m.rejected.WithLabelValues("key_lookup").Inc()
		d.log.Warn("dropping a tenant request: the API key lookup failed", "key_id", keyID, "err", err)
		return registry.Key{}, false
	}
	return k, true
}

// tenantReplyAllowed reports whether reply is under the tenant's inbox
// prefix: a tenant cannot aim a stream at another's inbox.
func tenantReplyAllowed(reply, tenant string) bool {
	p := schemas.TenantInbox(tenant)
	return len(reply) <= schemas.MaxReplyLen && len(reply) > len(p) && reply[len(p)] == '.' && strings.HasPrefix(reply, p)
}

// admitTenant checks a read tenant request against its key: the model list,
// then the limits. It reports the error to answer with, if any.
func (d *Dispatcher) admitTenant(m *nats.Msg, k registry.Key, view *schemas.Request) *schemas.Error {
	if !k.Allows(view.Model) {
		d.m.rejected.WithLabelValues("model_not_allowed").Inc()
		return schemas.ErrModelNotAllowed.New(view.Model)
	}
	var a Admission
	if d.cfg.Admit != nil {
		ctx, cancel := context.WithTimeout(context.Background(), d.cfg.KeyTimeout)
		var err error
		a, err = d.cfg.Admit.Admit(ctx, k, view, d.attemptOf(m.Header))
		cancel()
		var se *schemas.Error
		switch {
		case errors.As(err, &se):
			d.m.rejected.WithLabelValues("rate_limited").Inc()
			return se
		case err != nil:
			d.m.admitFailOpen.Inc()
			d.log.Warn("rate-limit check failed: allowing the request (fail open)", "key_id", k.ID, "err", err)
		}
	}
	setAdmission(m.Header, k, a)
	return nil
}

// stripDispatcherHeaders removes every header only dispatchers may set (and
// Tb-Tenant on a tenant request) from a request a client published.
func stripDispatcherHeaders(h nats.Header, tenant bool) {
	for name := range h {
		if schemas.DispatcherOnly(name, tenant) {
			delete(h, name)
		}
	}
}

// defaultKeyTimeout bounds a key lookup and an admission.
const defaultKeyTimeout = 2 * time.Second
