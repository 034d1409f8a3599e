package cli

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from the commands' --help")

// docs/configuration.md is generated from --help, so it cannot drift from
// the flags: `go test ./program/cli -run TestConfigurationDoc -update`.
func TestConfigurationDoc(t *testing.T) {
	var doc bytes.Buffer
	doc.WriteString("# Configuration\n\n")
	doc.WriteString("Generated from `tokenbus <command> --help` by `go test ./program/cli -run TestConfigurationDoc -update`; do not edit by hand.\n\n")
	doc.WriteString("Every flag can also be set in the environment: `--nats-url` is `TOKENBUS_NATS_URL`, and so on. A flag given on the\n")
	doc.WriteString("command line wins over the environment, which wins over the default.\n")
	for _, c := range commands() {
		if c.name == "version" {
			continue
		}
		var out bytes.Buffer
		if err := Run(context.Background(), []string{c.name, "--help"}, &out, &out); err != nil {
			t.Fatalf("%s --help: %v", c.name, err)
		}
		fmt.Fprintf(&doc, "\n## tokenbus %s\n\n%s.\n\n```\n%s```\n", c.name, upperFirst(c.summary), out.String())
	}
	const path = "../../docs/configuration.md"
	if *update {
		if err := os.WriteFile(path, doc.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(have, doc.Bytes()) {
		t.Fatalf("docs/configuration.md is out of date: run go test ./program/cli -run TestConfigurationDoc -update")
	}
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func TestEveryFlagHasAnEnvFallback(t *testing.T) {
	for _, c := range commands() {
		if c.name == "version" {
			continue
		}
		var out bytes.Buffer
		_ = Run(context.Background(), []string{c.name, "--help"}, &out, &out)
		flags := 0
		for _, line := range strings.Split(out.String(), "\n") {
			if !flagLine.MatchString(line) {
				continue
			}
			flags++
			if !strings.Contains(line, "(env TOKENBUS_") {
				t.Errorf("%s: flag without an environment fallback: %s", c.name, strings.TrimSpace(line))
			}
		}
		if flags == 0 {
			t.Errorf("%s --help lists no flags", c.name)
		}
	}
}

// flagLine matches pflag's indented "  -x, --name type   usage" lines.
var flagLine = regexp.MustCompile(`^ {2,}(-\w, )?--[a-z0-9-]+`)

// docs/security.md names, in its heading, the subcommands that take the
// NATS credential flags: exactly those have them.
func TestNATSFlagsWhereSecurityDocSays(t *testing.T) {
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## NATS credentials \(([^)]*)\)$`).FindSubmatch(doc)
	if m == nil {
		t.Fatal(`docs/security.md has no "## NATS credentials (commands)" heading`)
	}
	named := map[string]bool{}
	for _, c := range strings.Split(string(m[1]), ",") {
		named[strings.TrimSpace(c)] = true
	}
	for _, c := range commands() {
		var out bytes.Buffer
		_ = Run(context.Background(), []string{c.name, "--help"}, &out, &out)
		for _, flag := range []string{"--nats-url", "--nats-user", "--nats-password", "--nats-token", "--nats-nkey", "--nats-creds",
			"--nats-tls-ca", "--nats-tls-cert", "--nats-tls-key", "--nats-inbox-prefix"} {
			if has := strings.Contains(out.String(), "  "+flag+" "); has != named[c.name] {
				t.Errorf("%s has %s: %v; docs/security.md says %v", c.name, flag, has, named[c.name])
			}
		}
		delete(named, c.name)
	}
	for c := range named {
		t.Errorf("docs/security.md names %q, which is no command", c)
	}
}
