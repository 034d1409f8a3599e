package cli

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/tokenbus/tokenbus/internal/flagenv"
	"github.com/tokenbus/tokenbus/program/natsusers"
	"github.com/tokenbus/tokenbus/registry"
)

// runNATSUsers prints the NATS users entries of NATS-native tenants, from
// the registry's API keys and/or --tenant pairs (docs/security.md).
func runNATSUsers(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := flagenv.NewFlagSet("nats-users")
	var (
		topo  registry.Topology
		pairs []string
		nkeys map[string]string
	)
	rf := registerRedis(fs, &topo, "Redis holding the API keys: one user per tenant of those keys (empty: only --tenant)", false)
	fs.StringArrayVar(&pairs, "tenant", nil, "key-id:tenant or key-id:tenant:model,model (repeat for each key); a tenant named after a deploy user (gateway, dispatcher, worker, operator, sys) or workers is refused")
	fs.StringToStringVar(&nkeys, "nkey", nil, "tenant=public nkey (U...): the tenant logs in with that nkey instead of a password")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := rf.check(); err != nil {
		return err
	}
	var keys []registry.Key
	if topo.Configured() {
		store, err := registry.OpenTopology(ctx, topo)
		if err != nil {
			return err
		}
		defer store.Close()
		if keys, err = store.ListKeys(ctx); err != nil {
			return err
		}
	}
	for _, p := range pairs {
		k, err := natsusers.ParseTenant(p)
		if err != nil {
			return err
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return fmt.Errorf("no keys: give --redis-url (or --redis-sentinel, --redis-cluster) or --tenant")
	}
	tenants := natsusers.FromKeys(keys, nkeys)
	// An --nkey for a tenant with no key is a typo: that tenant would
	// silently keep a password login.
	for name := range nkeys {
		if !slices.ContainsFunc(tenants, func(t natsusers.Tenant) bool { return t.Name == name }) {
			return fmt.Errorf("--nkey %s=...: no API key of tenant %q", name, name)
		}
	}
	// Written only if every tenant passes natsusers.Check: distinct users,
	// password variables, inboxes, nkeys and keys, no reserved name.
	return natsusers.Write(stdout, tenants)
}
