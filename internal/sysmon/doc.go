// Package sysmon keeps the Go runtime's monitor thread (sysmon) from polling
// every 20 µs after each idle spell of a server process.
//
// sysmon sleeps while every P is idle and is woken by the next system call;
// waking that way it starts over at its shortest period, 20 µs, for at least
// a millisecond. A streaming server under a model's pace is idle between
// engine steps (every 10-30 ms) and makes a system call at the start of each,
// so sysmon wakes some fifty times a step: with 16 streams that was a fifth of
// tokenbus dev's CPU and half of its context switches (perf). With GODEBUG
// schedtrace set, sysmon never takes that deep sleep, so nothing resets its
// period: it backs off to 10 ms as the runtime intends for a quiet process
// and comes back to 20 µs only when it has work (a P to retake from a long
// system call). The trace itself is asked for every 2^31 ms (24.8 days), so
// it is never printed in practice (schedtrace also adds a scheduler dump to a
// fatal error's output).
//
// GODEBUG is read once, at the start of the process, so Exec re-executes the
// program with it set. A GODEBUG that already names schedtrace is left alone:
// GODEBUG=schedtrace=0 restores the runtime's default.
//
// Tokenbus imports: none.
package sysmon
