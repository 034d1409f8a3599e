package natsusers

import (
	"fmt"
	"strings"

	"github.com/tokenbus/tokenbus/schemas"
)

// What a tenant becomes on the bus, each a function of its name alone and
// each injective, so that no two tenants share a login, a password or an
// inbox:
//
//   - its NATS user: the name itself (nats-server compares user names
//     exactly, case included);
//   - its inbox prefix: schemas.TenantInbox, the name as one subject token
//     (ModelToken's escape, shared with the dispatchers that answer into it);
//   - its password variable: PasswordVar, below.
//
// Reserved names are the deploy users of deploy/nats/nats.conf and the name
// whose inbox is a component's own.

// PasswordVar is the environment variable that holds a tenant user's
// password: NATS_<NAME>_PASSWORD, where each byte of the name is written
//
//	a-z  as A-Z        0-9  as itself        '-'  as '_'
//	any other byte as 'x' and its two lower-case hex digits
//
// so "tenant-a" is NATS_TENANT_A_PASSWORD as before, and "Acme" is
// NATS_x41CME_PASSWORD, "team.x" NATS_TEAMx2eX_PASSWORD, "team_x"
// NATS_TEAMx5fX_PASSWORD. Why an escape rather than upper-casing and '_'
// for the rest (what it was): that made "team-x" and "team.x", or "Acme"
// and "acme", one variable, so one tenant knew the other's password. Why
// an escape rather than a hash suffix: it is exact (no collision to argue
// about), it can be read back (the variable says whose it is), and the
// common names (lower case, digits, '-') keep the variable they had. A
// lower-case 'x' never stands for a name byte, so it cannot be misread,
// and the variable stays within [A-Za-z0-9_], which shells, compose files
// and the NATS config parser all take.
func PasswordVar(tenant string) string {
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len("NATS_") + len(tenant) + len("_PASSWORD") + 8)
	b.WriteString("NATS_")
	for i := 0; i < len(tenant); i++ {
		switch c := tenant[i]; {
		case c >= 'a' && c <= 'z':
			b.WriteByte(c - 'a' + 'A')
		case c >= '0' && c <= '9':
			b.WriteByte(c)
		case c == '-':
			b.WriteByte('_')
		default:
			b.WriteByte('x')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		}
	}
	b.WriteString("_PASSWORD")
	return b.String()
}

// Reserved are the names no tenant may have, and why: a tenant named after
// a deploy user would be a second user of that name (and read that user's
// password variable); a tenant named "workers" would be allowed to read the
// workers' own inbox (schemas.WorkerInboxPrefix).
var Reserved = map[string]string{
	"gateway":    "the gateway's NATS user",
	"dispatcher": "the dispatchers' NATS user",
	"worker":     "the workers' NATS user",
	"workers":    "its inbox would be the workers' own, " + schemas.WorkerInboxPrefix,
	"operator":   "the operators' NATS user",
	"sys":        "the system account's NATS user",
}

// CheckName reports why tenant cannot be a NATS-native tenant, if it
// cannot: empty, reserved, or holding what the config cannot quote.
func CheckName(tenant string) error {
	if tenant == "" {
		return fmt.Errorf("a tenant without a name")
	}
	if why, ok := Reserved[tenant]; ok {
		return fmt.Errorf("tenant %q: the name is reserved (%s); give the tenant another name", tenant, why)
	}
	if schemas.TenantInbox(tenant) == schemas.WorkerInboxPrefix {
		return fmt.Errorf("tenant %q: its inbox would be the workers' own, %s", tenant, schemas.WorkerInboxPrefix)
	}
	for i := 0; i < len(tenant); i++ {
		if c := tenant[i]; c == '"' || c == '\\' || c < ' ' || c == 0x7f {
			return fmt.Errorf("tenant %q: quotes, backslashes and control characters cannot stand in the config", tenant)
		}
	}
	return nil
}

// checkNKey: a public user nkey is 'U' and 55 more base32 characters.
func checkNKey(tenant, key string) error {
	ok := len(key) == 56 && key[0] == 'U'
	for i := 0; ok && i < len(key); i++ {
		c := key[i]
		ok = c >= 'A' && c <= 'Z' || c >= '2' && c <= '7'
	}
	if !ok {
		return fmt.Errorf("tenant %q: nkey %q is not a public user nkey (U and 55 base32 characters)", tenant, key)
	}
	return nil
}

// Check reports the first reason tenants cannot be written: a name
// CheckName refuses, a malformed key id or nkey, or two tenants that would
// share a user, a password variable, an nkey, an inbox or an API key's
// request subjects. The mappings are injective, so for distinct names only
// a shared nkey or key id can collide; the
// check is made on what would be written all the same, so that a change
// to a mapping cannot quietly merge two tenants.
func Check(tenants []Tenant) error {
	owner := map[string]string{} // "what value" -> tenant
	claim := func(tenant, what, value string) error {
		k := what + "\x00" + value
		if other, ok := owner[k]; ok {
			return fmt.Errorf("tenants %q and %q would share the NATS %s %s", other, tenant, what, value)
		}
		owner[k] = tenant
		return nil
	}
	for _, t := range tenants {
		if err := CheckName(t.Name); err != nil {
			return err
		}
		if err := claim(t.Name, "inbox", schemas.TenantInbox(t.Name)); err != nil {
			return err
		}
		// A key given to two tenants would let one publish billed to the
		// other (the dispatcher bills the key's own tenant).
		for _, k := range t.Keys {
			if !schemas.ValidToken(k.ID) {
				return fmt.Errorf("tenant %q: key id %q is not a subject token", t.Name, k.ID)
			}
			if err := claim(t.Name, "request subjects of API key", k.ID); err != nil {
				return err
			}
		}
		if t.NKey != "" {
			if err := checkNKey(t.Name, t.NKey); err != nil {
				return err
			}
			if err := claim(t.Name, "nkey", t.NKey); err != nil {
				return err
			}
			continue
		}
		if err := claim(t.Name, "user", t.Name); err != nil {
			return err
		}
		if err := claim(t.Name, "password variable", PasswordVar(t.Name)); err != nil {
			return err
		}
	}
	return nil
}
