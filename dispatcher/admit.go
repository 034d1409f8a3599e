package dispatcher

import (
	"context"
	"strconv"

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
// (fail open, as the gateway does).
type Admitter interface {
	Admit(ctx context.Context, k registry.Key, req *schemas.Request) (Admission, error)
}

// setAdmission marks an admitted tenant request for the worker's usage record.
func setAdmission(h map[string][]string, k registry.Key, a Admission) {
	h[schemas.HdrTenant] = []string{k.Tenant}
	h[schemas.HdrKeyID] = []string{k.ID}
	if a.Reserved > 0 {
		h[schemas.HdrReserved] = []string{strconv.Itoa(a.Reserved)}
		h[schemas.HdrWindow] = []string{strconv.FormatInt(a.Window, 10)}
	}
}
