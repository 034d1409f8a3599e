package dispatcher

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// Admission is what admitting a tenant request reserved against its key's
// TPM limit: Reserved tokens in rate-limit window Window (0: nothing). The
// worker's usage record carries both, so the usage log can settle the
// reservation to the real count.
type Admission struct {
	Reserved int
	Window   int64
}

// Admitter checks a tenant request against its API key's RPM and TPM limits
// and counts it. A refusal is a *schemas.Error (429 rate_limit_exceeded with
// retry_after), the same answer the gateway gives over HTTP; any other error
// means the limits could not be checked, and the request is let through
// (fail open, as the gateway does). A request sent again (Attempt.Again)
// that its first admission lets in again is not counted twice.
type Admitter interface {
	Admit(ctx context.Context, k registry.Key, req *schemas.Request, at Attempt) (Admission, error)
}

// Attempt says which sending of a request an admission is for.
type Attempt struct {
	RequestID string
	// Again: the client sent it again after a worker failed it (a retry
	// or a migration: Tb-Exclude or Tb-Resume, client/failover.go). It is
	// the request admitted before, counted once against RPM, its first
	// reservation settled by whichever worker finishes it.
	Again bool
}

// attemptOf is the attempt a request's headers say. A request sent again
// is the same request only when it excludes a worker that failed it
// (failures) or that this dispatcher no longer sees live: a client sends
// again after its worker failed, and a tenant could otherwise send any
// request again with these headers to have it counted once.
func (d *Dispatcher) attemptOf(h map[string][]string) Attempt {
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	at := Attempt{RequestID: get(schemas.HdrRequestID)}
	ex := get(schemas.HdrExclude)
	if ex == "" || len(ex) > schemas.MaxExclude {
		return at
	}
	if d.failed.failedOn(at.RequestID, ex) {
		at.Again = true
		return at
	}
	for _, id := range strings.Split(ex, ",") {
		if id != "" && !d.fleet.Live(id) {
			at.Again = true
			return at
		}
	}
	// A migrated stream (Tb-Resume) whose worker is alive and whose failed
	// done notice has not arrived yet: the worker sends that notice before
	// the error frame, but on another subject, which this dispatcher reads
	// on another goroutine; the continuation can win the race. Wait a
	// moment for the notice, one such request at a time (a tenant forging
	// these headers can delay no more than one of its own requests).
	if get(schemas.HdrResume) != "" && d.failed.await(at.RequestID, ex, failureWait) {
		at.Again = true
	}
	return at
}

// failureWait bounds how long a continuation waits for its failed done notice.
const failureWait = 200 * time.Millisecond

// setAdmission marks an admitted tenant request for the worker's usage
// record, and with its key's flow.
func setAdmission(h map[string][]string, k registry.Key, a Admission) {
	h[schemas.HdrTenant] = []string{k.Tenant}
	h[schemas.HdrKeyID] = []string{k.ID}
	// The key's flow (flow.go); a client's own were stripped.
	h[schemas.HdrBand] = []string{k.FlowBand().String()}
	if k.Weight > 1 {
		h[schemas.HdrWeight] = []string{strconv.Itoa(k.Weight)}
	}
	if k.MaxQueueMS > 0 {
		h[schemas.HdrMaxQueue] = []string{strconv.FormatInt(k.MaxQueueMS, 10)}
	}
	if a.Reserved > 0 {
		h[schemas.HdrReserved] = []string{strconv.Itoa(a.Reserved)}
		h[schemas.HdrWindow] = []string{strconv.FormatInt(a.Window, 10)}
	}
}
