// Command chaos runs the reliability scenarios of program/chaos and prints
// a markdown table (and JSON with -json). scripts/chaos is its entry point.
//
// Tokenbus imports: program/chaos.
package main
