// Package admin is tokenbus's management API: models and LoRA adapters, the
// live workers (a fleet.View), API keys and usage. It listens on its own address (like
// TorchServe's management port), apart from the OpenAI API, and every request
// needs "Authorization: Bearer <admin token>". JSON in and out; every error
// is OpenAI's {"error":{"message","type","param","code"}} with its status:
// 400 bad JSON or fields, 401 bad token, 429 too many bad tokens from the
// client's address (gateway.Throttle), 404 unknown, 409 conflicts, 503 when
// Redis cannot be reached (Retry-After: 1). docs/admin-api.md has the routes.
//
// It also serves the web console (/console/, console.go: embedded static
// files, no token needed for them), the console's config, live traffic as
// Server-Sent Events (traffic.go, read from the process's metrics registry)
// and batch cancel and download for any tenant (batches.go), and tenants
// with their quotas and use (tenants.go). docs/console.md.
//
// Every registry change is announced on tokenbus.v1.events.* before the
// response is sent, so gateway and dispatcher caches follow at once.
//
// Tokenbus imports: batch, fleet, gateway, registry, schemas.
package admin
