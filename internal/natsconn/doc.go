// Package natsconn holds the NATS connection settings every subcommand shares
// and connects with them.
//
// Tokenbus imports: none.
package natsconn
