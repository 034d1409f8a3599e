package cli

import (
	"context"
	"io"
	"strings"
	"testing"
)

// `gateway` refuses flag combinations it cannot serve, before connecting
// to anything.
func TestGatewayFlagChecks(t *testing.T) {
	t.Setenv("TOKENBUS_ADMIN_TOKEN", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"gateway"}, "--admin-token (or TOKENBUS_ADMIN_TOKEN) is required"},
		{[]string{"gateway", "--redis-url", "", "--admin", ""}, "--auth needs Redis"},
		{[]string{"gateway", "--redis-url", "", "--auth=false", "--admin-token", "x"}, "the admin API needs Redis"},
		{[]string{"gateway", "--admin-token", "x", "--cors-origins", "https://app.example,app.example"}, `--cors-origins: CORS origin "app.example": want scheme://host[:port]`},
	} {
		err := Run(context.Background(), tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
