// Command tokenbus is the one binary of tokenbus; the subcommand chooses the
// role. internal/cli reads the flags and internal/program runs the role, so
// tests run whole programs.
//
// Tokenbus imports: internal/cli.
package main
