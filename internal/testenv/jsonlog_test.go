package testenv

import (
	"strings"
	"testing"
)

func TestParseJSONLog(t *testing.T) {
	for _, tc := range []struct {
		name, log, err string
		lines          int
	}{
		{"slog lines", `{"time":"t","level":"INFO","msg":"up","component":"gateway"}` + "\n\n" + `{"a":{"b":[{"c":1},{"c":2}]}}` + "\n", "", 2},
		{"a key twice", `{"component":"dev","msg":"x","component":"gateway"}`, `key "component" twice`, 0},
		{"twice, nested", `{"a":[{"b":1,"b":2}]}`, `key "b" twice`, 0},
		{"not an object", `level=INFO msg=x`, "invalid character", 0},
		{"two values", `{"a":1}{"b":2}`, "more than one JSON value", 0},
	} {
		recs, err := ParseJSONLog([]byte(tc.log))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.err)
		case tc.err == "" && len(recs) != tc.lines:
			t.Errorf("%s: %d records, want %d", tc.name, len(recs), tc.lines)
		}
	}
}
