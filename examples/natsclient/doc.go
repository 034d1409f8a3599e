// Command natsclient streams one chat completion over NATS, with no HTTP:
// the way a NATS-native Go program uses tokenbus.
//
//	go run ./examples/natsclient -nats nats://127.0.0.1:4222 -model llama-8b "Tell me a story"
//
// As a tenant of a deployment whose NATS users tokenbus generated
// (tokenbus nats-users; docs/security.md), with the user, the API key id and
// the tenant the generated entry names:
//
//	NATS_PASSWORD=… go run ./examples/natsclient -user tenant-a -key-id key_… -tenant tenant-a "Hi"
//
// Tokenbus imports: client, schemas.
package main
