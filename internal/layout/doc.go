// Package layout holds no code: its test keeps the import graph as
// docs/architecture.md draws it. Packages sit in layers (programs, roles,
// shared state and helpers, the protocol) and import only downwards; within a
// layer, only the edges listed in allowed. Every package's doc.go ends with
// the tokenbus packages it imports ("Tokenbus imports: ..."), and the test
// checks that the sentence is true.
//
// Tokenbus imports: none.
package layout
