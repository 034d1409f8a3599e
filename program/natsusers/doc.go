// Package natsusers writes the NATS `users` entries of NATS-native tenants
// (`tokenbus nats-users`): for each tenant a user that may publish requests
// only on its own API keys' tenant request subjects
// (tokenbus.v1.treq.<key-id>.<model-token>, every model or the key's model
// list), cancels, and subscribe only under its inbox prefix
// (schemas.TenantInbox). Dispatchers trust the key id on the subject because
// of these permissions: they are the tenant's identity on the bus.
//
// A tenant's user, inbox and password variable are each an injective
// function of its name (names.go), so no two tenants share a login, a
// password or replies; the names of the deploy users, and "workers" (the
// workers' own inbox), are refused, as is input that would give two tenants
// one nkey or one API key.
//
// Tokenbus imports: schemas, registry.
package natsusers
