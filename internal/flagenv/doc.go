// Package flagenv gives every command-line flag an environment fallback:
// flag > TOKENBUS_<FLAG> > default, parsed by pflag's own parsers.
//
// Tokenbus imports: none.
package flagenv
