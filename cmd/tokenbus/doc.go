// Command tokenbus is the one binary of tokenbus; the subcommand chooses the
// role. program/cli reads the flags and program runs the role, so
// tests run whole programs; internal/gctune sets the collector's GOGC.
//
// Tokenbus imports: internal/gctune, internal/sysmon, program/cli.
package main
