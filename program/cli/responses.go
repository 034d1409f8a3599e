package cli

import (
	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/program"
)

// registerResponses defines the flags that bound the Responses API's state
// and runner (docs/responses.md, "Limits").
func registerResponses(fs *pflag.FlagSet, r *program.ResponsesConfig) {
	fs.Int64Var(&r.RecordBytes, "response-store-bytes", r.RecordBytes, "bytes the JetStream bucket of stored responses may hold (full: new ones are refused with 503, none is dropped)")
	fs.Int64Var(&r.EventBytes, "response-events-bytes", r.EventBytes, "bytes the JetStream stream of background responses' and resumable streams' events may hold (full: new ones are refused, none is dropped)")
	fs.IntVar(&r.MaxFollows, "response-followers", r.MaxFollows, "background responses and resumable streams this gateway streams to clients at once, each a JetStream consumer (past it: 503)")
	fs.IntVar(&r.MaxFollowsPerTenant, "response-followers-per-tenant", r.MaxFollowsPerTenant, "of them, one tenant's (past it: 429)")
	fs.IntVar(&r.RunnerSlots, "response-runner-slots", r.RunnerSlots, "background responses and resumable streams this gateway's runner generates at once")
	fs.IntVar(&r.RunnerTenantSlots, "response-runner-tenant-slots", r.RunnerTenantSlots, "of them, one tenant's: the rest wait for others' work, so that one tenant's backlog does not hold everyone's")
	fs.IntVar(&r.RunnerMaxAttempts, "response-max-attempts", r.RunnerMaxAttempts, "failed runs of one background response or resumable stream (JetStream refusing, gateways dying), retried up to a minute apart, before it ends failed with an error its client sees")
	fs.IntVar(&r.Quota.Stored, "quota-stored-responses", r.Quota.Stored, "stored responses and resumable streams one tenant may keep (within --response-retention); past it: 429; 0: no limit")
	fs.IntVar(&r.Quota.Background, "quota-background", r.Quota.Background, "background responses one tenant may have queued or running; past it: 429; 0: no limit")
	fs.IntVar(&r.Quota.Resumable, "quota-resumable", r.Quota.Resumable, "resumable chat streams one tenant may have queued or running; past it: 429; 0: no limit")
}
