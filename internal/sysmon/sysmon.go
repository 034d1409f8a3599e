package sysmon

import (
	"strings"
)

// Setting is the GODEBUG entry Exec adds: a scheduler trace every 2^31-1 ms.
const Setting = "schedtrace=2147483647"

// env returns environ with Setting added to GODEBUG, and false when GODEBUG
// already names schedtrace (the user's choice, or Exec has run).
func env(environ []string) ([]string, bool) {
	out := make([]string, 0, len(environ)+1)
	godebug := ""
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			godebug = v
			continue
		}
		out = append(out, kv)
	}
	for _, s := range strings.Split(godebug, ",") {
		if strings.HasPrefix(strings.TrimSpace(s), "schedtrace=") {
			return environ, false
		}
	}
	if godebug == "" {
		return append(out, "GODEBUG="+Setting), true
	}
	return append(out, "GODEBUG="+godebug+","+Setting), true
}
