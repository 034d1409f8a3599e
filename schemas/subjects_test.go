package schemas

import "testing"

func TestSafeToken(t *testing.T) {
	for in, want := range map[string]string{"host.example.com": "host-example-com", "a b*c>d\x7f": "a-b-c-d-", "wörker": "wörker"} {
		if got := SafeToken(in); got != want || !ValidToken(got) {
			t.Errorf("SafeToken(%q) = %q, want %q (valid token)", in, got, want)
		}
	}
}
