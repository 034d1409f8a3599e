package natsconn

import "testing"

func TestRedactURLs(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                    "nats://127.0.0.1:4222",
		"nats://user:s3cretpass@h:4222":            "nats://REDACTED@h:4222",
		"nats://s3crettoken@h:4222,nats://h2:4222": "nats://REDACTED@h:4222,nats://h2:4222",
		"nats://a:b@h1, nats://c:d@h2":             "nats://REDACTED@h1,nats://REDACTED@h2",
		"nats://us%zzer:s3cret@h":                  "(unparsable URL)",
	} {
		if got := redactURLs(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}
