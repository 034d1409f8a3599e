// Command chaos runs the reliability scenarios of internal/chaos and prints
// a markdown table (and JSON with -json). scripts/chaos is its entry point.
//
// Tokenbus imports: internal/chaos.
package main
