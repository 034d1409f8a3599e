// Package freeport picks TCP ports at run time, for child processes and
// listeners that must be told a port before they bind it (nothing in
// tokenbus or its tests uses a fixed port: the machine may be shared).
//
// Tokenbus imports: none.
package freeport
