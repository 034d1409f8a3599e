package cli

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/internal/testenv"
	"github.com/tokenbus/tokenbus/registry"
)

// deploy/nats/nats.conf holds the output of `tokenbus nats-users` for its
// example tenants: regenerate the block from its BEGIN line and compare.
func TestNATSConfTenantsInStep(t *testing.T) {
	b, err := os.ReadFile("../../deploy/nats/nats.conf")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "# BEGIN tokenbus nats-users ", "# END tokenbus nats-users"
	conf := string(b)
	i := strings.Index(conf, begin)
	j := strings.Index(conf, end)
	if i < 0 || j < i {
		t.Fatal("nats.conf has no generated tenant block")
	}
	line, block, _ := strings.Cut(conf[i+len(begin):], "\n")
	block = block[:strings.Index(block, end)]
	block = block[:strings.LastIndex(block, "\n")+1] // up to the END line's indentation
	var out bytes.Buffer
	if err := Run(context.Background(), append([]string{"nats-users"}, strings.Fields(line)...), &out, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != block {
		t.Fatalf("nats.conf's tenant block is not what `tokenbus nats-users %s` prints now:\n%s\nwant\n%s", line, block, out.String())
	}
}

// From the registry: one user per tenant, with every key of it.
func TestNATSUsersFromRegistry(t *testing.T) {
	r := testenv.StartRedis(t)
	ctx := context.Background()
	store, err := registry.Open(ctx, r.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	a1, _, _ := store.CreateKey(ctx, registry.KeySpec{Tenant: "acme"})
	a2, _, _ := store.CreateKey(ctx, registry.KeySpec{Tenant: "acme", Models: []string{"meta-llama/Llama-3.1-8B"}})
	b1, _, _ := store.CreateKey(ctx, registry.KeySpec{Tenant: "acme.eu"})
	var out bytes.Buffer
	if err := Run(ctx, []string{"nats-users", "--redis-url", r.URL}, &out, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		`{ user: "acme", password: $NATS_ACME_PASSWORD,`,
		`"tokenbus.v1.treq.` + a1.ID + `.>"`,
		`"tokenbus.v1.treq.` + a2.ID + `.meta-llama~2fLlama-3~2e1-8B"`,
		`subscribe: { allow: [ "_INBOX.acme.>" ] }`,
		// A tenant name with a '.' is one token: no prefix of another's.
		`{ user: "acme.eu", password: $NATS_ACMEx2eEU_PASSWORD,`,
		`"tokenbus.v1.treq.` + b1.ID + `.>"`,
		`subscribe: { allow: [ "_INBOX.acme~2eeu.>" ] }`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %s:\n%s", want, got)
		}
	}
	if strings.Count(got, "{ user:") != 2 {
		t.Errorf("want two users:\n%s", got)
	}
}

// Input that would make two tenants one, or a tenant a component, is
// refused with nothing printed.
func TestNATSUsersRefuses(t *testing.T) {
	const nk = "UAYVCPJBLDUFZMHEC2ST6SQIEA34TONJVYWJK4WLQNRDSD7DULJF3KOC"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tenant", "k1:workers"}, `tenant "workers": the name is reserved`},
		{[]string{"--tenant", "k1:gateway"}, `tenant "gateway": the name is reserved`},
		{[]string{"--tenant", "k1:a", "--tenant", "k1:b"}, `tenants "a" and "b" would share the NATS request subjects of API key k1`},
		{[]string{"--tenant", "k1:a", "--tenant", "k2:b", "--nkey", "a=" + nk, "--nkey", "b=" + nk}, `would share the NATS nkey`},
		{[]string{"--tenant", "k1:a", "--nkey", "ab=" + nk}, `--nkey ab=...: no API key of tenant "ab"`},
	} {
		var out bytes.Buffer
		err := Run(context.Background(), append([]string{"nats-users"}, tc.args...), &out, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %s", tc.args, err, tc.want)
		}
		if out.Len() != 0 {
			t.Errorf("%q: printed %q", tc.args, out.String())
		}
	}
}
