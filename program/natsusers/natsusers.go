package natsusers

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/tokenbus/tokenbus/registry"
	"github.com/tokenbus/tokenbus/schemas"
)

// Key is one API key as its tenant's permissions name it.
type Key struct {
	ID     string
	Models []string // empty: every model
}

// Tenant is one NATS-native tenant: a NATS user.
type Tenant struct {
	Name string
	Keys []Key
	// NKey is the user's public nkey (U…); empty: a user named Name with the
	// password $PasswordVar(Name) from the nats-server's environment.
	NKey string
}

// FromKeys groups registry keys by tenant, tenants and keys in name order;
// nkeys maps a tenant to its public nkey.
func FromKeys(keys []registry.Key, nkeys map[string]string) []Tenant {
	by := map[string]*Tenant{}
	for _, k := range keys {
		t := by[k.Tenant]
		if t == nil {
			t = &Tenant{Name: k.Tenant, NKey: nkeys[k.Tenant]}
			by[k.Tenant] = t
		}
		t.Keys = append(t.Keys, Key{ID: k.ID, Models: slices.Clone(k.Models)})
	}
	out := make([]Tenant, 0, len(by))
	for _, t := range by {
		slices.SortFunc(t.Keys, func(a, b Key) int { return cmp.Compare(a.ID, b.ID) })
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b Tenant) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Write writes the users entries of tenants, indented for the users list of
// deploy/nats/nats.conf's TOKENBUS account; it writes nothing when Check
// refuses them.
func Write(w io.Writer, tenants []Tenant) error {
	if err := Check(tenants); err != nil {
		return err
	}
	for _, t := range tenants {
		var pub []string
		var ids []string
		for _, k := range t.Keys {
			ids = append(ids, k.ID)
			if len(k.Models) == 0 {
				pub = append(pub, quote(schemas.TenantReqPrefix+k.ID+".>"))
				continue
			}
			for _, m := range k.Models {
				pub = append(pub, quote(schemas.TenantReqSubject(k.ID, m)))
			}
		}
		pub = append(pub, quote(schemas.QueueCancel), quote(schemas.CancelPrefix+"*"))
		login := fmt.Sprintf("user: %s, password: $%s", quote(t.Name), PasswordVar(t.Name))
		if t.NKey != "" {
			login = "nkey: " + t.NKey
		}
		inbox := schemas.TenantInbox(t.Name)
		if _, err := fmt.Fprintf(w, `      # tenant %s, API keys: %s. Requests only on its keys' subjects; replies
      # only under %s (its client sets that inbox prefix).
      { %s,
        permissions: {
          publish: { allow: [ %s ] }
          subscribe: { allow: [ %s ] }
        }
      }
`, t.Name, strings.Join(ids, ", "), inbox, login, strings.Join(pub, ", "), quote(inbox+".>")); err != nil {
			return err
		}
	}
	return nil
}

func quote(s string) string { return `"` + s + `"` }

// ParseTenant reads a --tenant value: key-id:tenant, or
// key-id:tenant:model,model to allow only those models.
func ParseTenant(v string) (registry.Key, error) {
	parts := strings.SplitN(v, ":", 3)
	if len(parts) < 2 || parts[0] == "" || parts[1] == "" {
		return registry.Key{}, fmt.Errorf("--tenant %q: want key-id:tenant or key-id:tenant:model,model", v)
	}
	k := registry.Key{ID: parts[0], KeySpec: registry.KeySpec{Tenant: parts[1]}}
	if len(parts) == 3 && parts[2] != "" {
		k.Models = strings.Split(parts[2], ",")
	}
	return k, nil
}
