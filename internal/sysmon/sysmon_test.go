package sysmon

import (
	"slices"
	"testing"
)

func TestEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []string
		want    []string
		changed bool
	}{
		{"no GODEBUG", []string{"A=1"}, []string{"A=1", "GODEBUG=" + Setting}, true},
		{"other settings kept", []string{"GODEBUG=madvdontneed=1", "B=2"},
			[]string{"B=2", "GODEBUG=madvdontneed=1," + Setting}, true},
		{"empty GODEBUG", []string{"GODEBUG="}, []string{"GODEBUG=" + Setting}, true},
		{"user's schedtrace wins", []string{"GODEBUG=schedtrace=0"}, []string{"GODEBUG=schedtrace=0"}, false},
		{"already applied", []string{"GODEBUG=x=1, schedtrace=2147483647"}, []string{"GODEBUG=x=1, schedtrace=2147483647"}, false},
		{"scheddetail alone is not schedtrace", []string{"GODEBUG=scheddetail=1"},
			[]string{"GODEBUG=scheddetail=1," + Setting}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := env(tc.in)
			if changed != tc.changed || !slices.Equal(got, tc.want) {
				t.Fatalf("env(%q) = %q, %v; want %q, %v", tc.in, got, changed, tc.want, tc.changed)
			}
		})
	}
}
