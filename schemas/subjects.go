package schemas

import "strings"

// Prefix is the root of every tokenbus subject. The version is part of the
// subject so that a v2 protocol can run beside v1 on one NATS cluster.
const Prefix = "tokenbus.v1"

// Subjects. A <model-token> is ModelToken(model); a <worker-id> must itself be
// a valid subject token (see ValidToken).
const (
	// ReqPrefix + <model-token>: client requests; dispatchers listen in queue group DispatcherQueue.
	ReqPrefix = Prefix + ".req."
	// TenantReqPrefix + <key-id> + "." + <model-token>: a NATS-native
	// tenant's requests. NATS permissions pin each tenant user to its own
	// key ids, so the subject says who is asking; dispatchers listen in
	// queue group DispatcherQueue and answer only into TenantInbox of the
	// key's tenant.
	TenantReqPrefix = Prefix + ".treq."
	// WorkPrefix + <worker-id>: requests forwarded by a dispatcher to one worker.
	WorkPrefix = Prefix + ".work."
	// HeartbeatPrefix + <worker-id>: worker heartbeats (Heartbeat JSON).
	HeartbeatPrefix = Prefix + ".hb."
	// DonePrefix + <worker-id>: one DoneNotice per finished request.
	DonePrefix = Prefix + ".done."
	// KVEventsPrefix + <worker-id>: what the worker's engine stored in and
	// evicted from its prefix cache (KVEvents JSON).
	KVEventsPrefix = Prefix + ".kv."
	// CancelPrefix + <worker-id>: body = CancelBody; the worker aborts it.
	CancelPrefix = Prefix + ".cancel."
	// PrefillPrefix + <worker-id>: the prefill of a disaggregated request,
	// sent by its decode worker (docs/disaggregation.md); + ".cancel": its
	// cancellation (CancelBody). Workers publish here, and to no other
	// worker's work or cancel subject.
	PrefillPrefix = Prefix + ".prefill."
	// CtlPrefix + <worker-id> + "." + <op>: request/reply control of one worker.
	CtlPrefix = Prefix + ".ctl."
	// BouncePrefix + <dispatcher-id>: a worker that is full hands a forwarded
	// request back to the dispatcher that sent it (header HdrBounce names the subject).
	BouncePrefix = Prefix + ".bounce."
	// FlowsPrefix + <dispatcher-id>: a dispatcher's backlogged flows
	// (FlowDemand JSON), so that dispatchers sharing workers divide their
	// slots by weighted demand (docs/scheduling.md).
	FlowsPrefix = Prefix + ".flows."
	// QueueCancel: body = CancelBody; every dispatcher drops that request from its queue.
	QueueCancel = Prefix + ".qcancel"
	// DemandPrefix + <model-token>: Demand events, published while requests
	// wait for a model that no live worker serves.
	DemandPrefix = Prefix + ".demand."
	// EventsPrefix + <kind>: registry changes (models, adapters, keys).
	EventsPrefix = Prefix + ".events."

	// DispatcherQueue is the queue group of all dispatchers on ReqPrefix + ">".
	DispatcherQueue = "tokenbus-dispatchers"

	// WorkerInboxPrefix is the inbox prefix of workers' own requests (the
	// start-up ping of their id), apart from every client's inbox.
	WorkerInboxPrefix = "_INBOX.workers"

	// MaxReplyLen bounds the reply subject of a request a dispatcher
	// forwards. NATS refuses a protocol line longer than its max_control_line
	// (4096 bytes by default) by closing the connection that sent it, and a
	// dispatcher and a worker put a client's reply subject in their own
	// lines: an unbounded one would let one request cut them off. tokenbus's
	// own replies are _INBOX.<tenant token: at most 768 bytes>.<NUID>.<request
	// id: at most 128 bytes>.
	MaxReplyLen = 2048
)

// ReqSubject is the subject a client publishes a request for model to.
func ReqSubject(model string) string { return ReqPrefix + ModelToken(model) }

// TenantReqSubject is the subject a tenant publishes a request for model to
// with the API key keyID.
func TenantReqSubject(keyID, model string) string {
	return TenantReqPrefix + keyID + "." + ModelToken(model)
}

// ParseTenantReqSubject returns the key id and model of a tenant request subject.
func ParseTenantReqSubject(subject string) (keyID, model string, ok bool) {
	rest, ok := strings.CutPrefix(subject, TenantReqPrefix)
	if !ok {
		return "", "", false
	}
	keyID, tok, ok := strings.Cut(rest, ".")
	if !ok || keyID == "" {
		return "", "", false
	}
	m, err := ParseModelToken(tok)
	return keyID, m, err == nil
}

// TenantInbox is the inbox prefix (without the trailing '.') of a tenant's
// reply subjects: "_INBOX." plus the tenant name encoded as ModelToken does,
// so that it is one subject token and no tenant's prefix covers another's
// ("a" and "a.b" would otherwise nest).
func TenantInbox(tenant string) string { return "_INBOX." + ModelToken(tenant) }

// WorkSubject is the subject on which worker id takes forwarded requests.
func WorkSubject(workerID string) string { return WorkPrefix + workerID }

// HeartbeatSubject is where worker id publishes its heartbeats.
func HeartbeatSubject(workerID string) string { return HeartbeatPrefix + workerID }

// DoneSubject is where worker id announces finished requests.
func DoneSubject(workerID string) string { return DonePrefix + workerID }

// FlowsSubject is where dispatcher id announces its backlogged flows.
func FlowsSubject(dispatcherID string) string { return FlowsPrefix + dispatcherID }

// KVEventsSubject is where worker id publishes its engine's KV events.
func KVEventsSubject(workerID string) string { return KVEventsPrefix + workerID }

// CancelSubject is where worker id takes cancellations.
func CancelSubject(workerID string) string { return CancelPrefix + workerID }

// PrefillSubject is where worker id takes the prefills of other workers'
// disaggregated requests.
func PrefillSubject(workerID string) string { return PrefillPrefix + workerID }

// PrefillCancelSubject is where worker id takes cancellations of those prefills.
func PrefillCancelSubject(workerID string) string { return PrefillPrefix + workerID + ".cancel" }

// CtlSubject is the control subject for operation op on worker id.
func CtlSubject(workerID, op string) string { return CtlPrefix + workerID + "." + op }

// DemandSubject is where dispatchers announce demand for model that no
// live worker serves.
func DemandSubject(model string) string { return DemandPrefix + ModelToken(model) }

// BounceSubject is where dispatcher id takes requests back from full workers.
func BounceSubject(dispatcherID string) string { return BouncePrefix + dispatcherID }

// ModelFromReqSubject returns the model named by a request subject.
func ModelFromReqSubject(subject string) (string, bool) {
	tok, ok := strings.CutPrefix(subject, ReqPrefix)
	if !ok {
		return "", false
	}
	m, err := ParseModelToken(tok)
	return m, err == nil
}

// SafeToken turns s into something that can stand as one subject token: each
// character ValidToken refuses becomes '-'. Workers' default ids are their
// host name made safe this way.
func SafeToken(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c <= ' ' || c == '.' || c == '*' || c == '>' || c == 0x7f {
			b[i] = '-'
		}
	}
	return string(b)
}

// ValidToken reports whether s can stand as one subject token: non-empty, and
// none of '.', '*', '>', whitespace or control characters.
func ValidToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c == '.' || c == '*' || c == '>' || c == 0x7f {
			return false
		}
	}
	return true
}
