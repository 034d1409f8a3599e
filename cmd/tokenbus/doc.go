// Command tokenbus is the one binary of tokenbus; the subcommand chooses the
// role. internal/cli reads the flags and internal/program runs the role, so
// tests run whole programs; internal/gctune sets the collector's GOGC.
//
// Tokenbus imports: internal/cli, internal/gctune, internal/sysmon.
package main
