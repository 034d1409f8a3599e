package natsusers

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

// unPasswordVar inverts PasswordVar: that it exists (and round-trips) is
// the proof that no two names share a variable.
func unPasswordVar(v string) (string, bool) {
	mid, ok := strings.CutPrefix(v, "NATS_")
	if !ok {
		return "", false
	}
	if mid, ok = strings.CutSuffix(mid, "_PASSWORD"); !ok {
		return "", false
	}
	var out []byte
	for i := 0; i < len(mid); i++ {
		switch c := mid[i]; {
		case c >= 'A' && c <= 'Z':
			out = append(out, c-'A'+'a')
		case c >= '0' && c <= '9':
			out = append(out, c)
		case c == '_':
			out = append(out, '-')
		case c == 'x' && i+2 < len(mid):
			b, err := strconv.ParseUint(mid[i+1:i+3], 16, 8)
			if err != nil || mid[i+1:i+3] != strings.ToLower(mid[i+1:i+3]) {
				return "", false
			}
			out = append(out, byte(b))
			i += 2
		default:
			return "", false
		}
	}
	return string(out), true
}

func TestPasswordVar(t *testing.T) {
	for name, want := range map[string]string{
		"tenant-a": "NATS_TENANT_A_PASSWORD", // the common names keep their variable
		"acme2":    "NATS_ACME2_PASSWORD",
		"team-x":   "NATS_TEAM_X_PASSWORD",
		"team.x":   "NATS_TEAMx2eX_PASSWORD",
		"team_x":   "NATS_TEAMx5fX_PASSWORD",
		"Acme":     "NATS_x41CME_PASSWORD",
		"acme":     "NATS_ACME_PASSWORD",
		"é":        "NATS_xc3xa9_PASSWORD",
	} {
		if got := PasswordVar(name); got != want {
			t.Errorf("PasswordVar(%q) = %s, want %s", name, got, want)
		}
	}
	// The finding's pairs are apart.
	for _, p := range [][2]string{{"team-x", "team.x"}, {"Acme", "acme"}, {"team-x", "team_x"}, {"a-b", "A-B"}} {
		if PasswordVar(p[0]) == PasswordVar(p[1]) {
			t.Errorf("%q and %q share %s", p[0], p[1], PasswordVar(p[0]))
		}
	}
}

// FuzzPasswordVar: every name's variable reads back as that name (so the
// mapping is injective), and stays within what shells and the NATS config
// parser take as a variable name.
func FuzzPasswordVar(f *testing.F) {
	for _, s := range []string{"tenant-a", "team.x", "Acme", "x41", "a_b", "xx", "\xff", "-", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		v := PasswordVar(name)
		back, ok := unPasswordVar(v)
		if !ok || back != name {
			t.Fatalf("PasswordVar(%q) = %s reads back as %q (%v)", name, v, back, ok)
		}
		for i := 0; i < len(v); i++ {
			if c := v[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				t.Fatalf("PasswordVar(%q) = %s has %q", name, v, c)
			}
		}
	})
}

func TestCheckRefuses(t *testing.T) {
	key := func(id string) []Key { return []Key{{ID: id}} }
	const nk = "UAYVCPJBLDUFZMHEC2ST6SQIEA34TONJVYWJK4WLQNRDSD7DULJF3KOC"
	for _, tc := range []struct {
		name    string
		tenants []Tenant
		want    string
	}{
		{"workers' inbox", []Tenant{{Name: "workers", Keys: key("k1")}}, `"workers": the name is reserved (its inbox would be the workers' own, _INBOX.workers)`},
		{"gateway", []Tenant{{Name: "gateway", Keys: key("k1")}}, `"gateway": the name is reserved (the gateway's NATS user)`},
		{"dispatcher", []Tenant{{Name: "dispatcher", Keys: key("k1")}}, "reserved"},
		{"worker", []Tenant{{Name: "worker", Keys: key("k1")}}, "reserved"},
		{"operator", []Tenant{{Name: "operator", Keys: key("k1")}}, "reserved"},
		{"sys", []Tenant{{Name: "sys", Keys: key("k1")}}, "reserved"},
		{"an nkey does not free a name", []Tenant{{Name: "workers", Keys: key("k1"), NKey: nk}}, "reserved"},
		{"empty", []Tenant{{Name: "", Keys: key("k1")}}, "without a name"},
		{"quote", []Tenant{{Name: `a"b`, Keys: key("k1")}}, "quotes"},
		{"tab", []Tenant{{Name: "a\tb", Keys: key("k1")}}, "control characters"},
		{"one nkey, two tenants", []Tenant{{Name: "a", Keys: key("k1"), NKey: nk}, {Name: "b", Keys: key("k2"), NKey: nk}},
			`tenants "a" and "b" would share the NATS nkey`},
		{"one key, two tenants", []Tenant{{Name: "a", Keys: key("k1")}, {Name: "b", Keys: key("k1")}},
			`tenants "a" and "b" would share the NATS request subjects of API key k1`},
		{"one tenant twice", []Tenant{{Name: "a", Keys: key("k1")}, {Name: "a", Keys: key("k2")}}, `tenants "a" and "a" would share the NATS inbox`},
		{"bad nkey", []Tenant{{Name: "a", Keys: key("k1"), NKey: "SUAXYZ"}}, "not a public user nkey"},
		{"bad key id", []Tenant{{Name: "a", Keys: key("k.1")}}, "not a subject token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := Write(&out, tc.tenants)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %s", err, tc.want)
			}
			if out.Len() != 0 {
				t.Fatalf("wrote %q before refusing", out.String())
			}
		})
	}
}

// The finding's pairs get users, variables and inboxes of their own; and
// the inbox is the dispatchers' (schemas.TenantInbox).
func TestCollidingPairsApart(t *testing.T) {
	tenants := []Tenant{{Name: "team-x", Keys: []Key{{ID: "k1"}}}, {Name: "team.x", Keys: []Key{{ID: "k2"}}},
		{Name: "Acme", Keys: []Key{{ID: "k3"}}}, {Name: "acme", Keys: []Key{{ID: "k4"}}}}
	var out bytes.Buffer
	if err := Write(&out, tenants); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`{ user: "team-x", password: $NATS_TEAM_X_PASSWORD,`, `"_INBOX.team-x.>"`,
		`{ user: "team.x", password: $NATS_TEAMx2eX_PASSWORD,`, `"_INBOX.team~2ex.>"`,
		`{ user: "Acme", password: $NATS_x41CME_PASSWORD,`, `"_INBOX.Acme.>"`,
		`{ user: "acme", password: $NATS_ACME_PASSWORD,`, `"_INBOX.acme.>"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %s:\n%s", want, out.String())
		}
	}
	if schemas.TenantInbox("team.x") != "_INBOX.team~2ex" {
		t.Errorf("the dispatchers' inbox of team.x is %s", schemas.TenantInbox("team.x"))
	}
}
