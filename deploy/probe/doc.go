// Command tokenbus-probe is the health check of the tokenbus container image.
// The image is distroless (no shell, no curl), so Docker HEALTHCHECKs and
// Kubernetes exec probes run this small static binary instead:
//
//	tokenbus-probe http http://127.0.0.1:8080/health   # exit 0 on a 2xx answer
//	tokenbus-probe heartbeat                           # exit 0 when this worker's heartbeat is seen on NATS
//
// heartbeat connects with the same TOKENBUS_NATS_* settings as the worker in
// the same container (flags or environment, see docs/security.md) and waits
// for a heartbeat on tokenbus.v1.hb.<id>: --id / TOKENBUS_ID when set, else
// any worker whose id is this host name plus "-<suffix>" (the worker's
// default id). A heartbeat proves the worker process runs, is connected to
// NATS and is not wedged; --require-healthy also requires its engine to be
// healthy (a worker in front of a vLLM that is down then fails the probe).
//
// It belongs in the tokenbus binary as `tokenbus health`; until then it lives
// here, under deploy/, and is built into the same image.
//
// Tokenbus imports: internal/flagenv, internal/natsconn, schemas.
package main
