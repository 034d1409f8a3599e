package program

import (
	"errors"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
)

// A JetStream feature (files and batches, stored and background responses)
// whose store does not open at start is turned off, and the gateway serves
// without it. When the reason is a permission its NATS user lacks, the
// server refuses the API request with an asynchronous error and the opening
// only times out, so "JetStream is unavailable" would send an operator the
// wrong way (or to "$JS.API.>"). So the refusal is looked for and named.

// refusedSince is the permission violation the server reported on nc after
// before (nc.LastError when the opening began), if any.
func refusedSince(nc *nats.Conn, before error) error {
	err := nc.LastError()
	if err == nil || err == before || !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	return err
}

// violationRe takes what was refused out of the server's error text:
// `Permissions Violation for Publish to "$JS.API.STREAM.CREATE.X"`.
var violationRe = regexp.MustCompile(`(?i)violation for (publish|subscription) to "([^"]*)"`)

// featureOff logs that feature ("files and batches", ...) is off because
// its store did not open (err), the NATS connection's last error having
// been before when it began: at error level naming the refused permission
// if the server refused one, else as JetStream being unavailable.
func (gw *gatewayRun) featureOff(feature string, before, err error) {
	refused := refusedSince(gw.nc, before)
	if refused == nil {
		gw.log.Warn(feature+" are off: JetStream is unavailable", "err", err)
		return
	}
	missing := refused.Error()
	if m := violationRe.FindStringSubmatch(missing); m != nil {
		op := "publish"
		if strings.EqualFold(m[1], "subscription") {
			op = "subscribe"
		}
		missing = op + " to " + m[2]
	}
	gw.log.Error(feature+" are OFF: this gateway's NATS user lacks a permission they need "+
		"(grant it as deploy/nats/nats.conf does, for this stream only; not $JS.API.>)",
		"feature", feature, "missing_permission", missing, "err", err)
}
