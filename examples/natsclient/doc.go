// Command natsclient streams one chat completion over NATS, with no HTTP:
// the way a NATS-native Go program uses tokenbus.
//
//	go run ./examples/natsclient -nats nats://127.0.0.1:4222 -model llama-8b "Tell me a story"
//
// Tokenbus imports: client, schemas.
package main
