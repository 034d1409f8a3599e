package flagenv

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// EnvName is the environment variable for a flag: "nats-url" -> "TOKENBUS_NATS_URL".
func EnvName(flag string) string {
	return "TOKENBUS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// NewFlagSet makes a ContinueOnError flag set whose usage names each flag's
// environment variable. Call Parse after defining the flags.
func NewFlagSet(name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	return fs
}

// Parse parses args, then sets every flag not given on the command line from
// its environment variable, if set. getenv nil means os.Getenv. Usage strings
// get " (env TOKENBUS_X)" appended so --help shows the fallback.
func Parse(fs *pflag.FlagSet, args []string, getenv func(string) string) error {
	if getenv == nil {
		getenv = os.Getenv
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(f.Usage, "(env ") {
			f.Usage += " (env " + EnvName(f.Name) + ")"
		}
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	var errs []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		if v := getenv(EnvName(f.Name)); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Sprintf("%s=%q: %v", EnvName(f.Name), v, err))
			}
		}
	})
	if len(errs) > 0 {
		return fmt.Errorf("bad environment: %s", strings.Join(errs, "; "))
	}
	return nil
}
