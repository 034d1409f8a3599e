package gateway

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
)

// CORSConfig lets pages of other origins call the API from a browser
// (the Fetch standard's CORS protocol). The defaults of `tokenbus gateway`
// are vLLM's: any origin, any method, any header, no credentials.
//
// Not Fiber's cors middleware (v2.52): it panics on credentials with "*" (the
// spec's answer is to echo the request's Origin, as Starlette in front of
// vLLM does), panics on a malformed origin in its configuration, lower-cases
// the origin it echoes and answers a disallowed origin's preflight with the
// allow-lists all the same.
type CORSConfig struct {
	// Origins that may call the API, as browsers send them
	// (scheme://host[:port]); "*" is any. Empty: CORS is off (no
	// Access-Control-* headers; a preflight is a 405 like any OPTIONS).
	Origins []string
	// Methods a preflight allows; "*" (or empty) allows the method asked for.
	Methods []string
	// Headers a request may carry; "*" (or empty) allows the headers asked
	// for (Authorization included, which a literal "*" does not cover).
	Headers []string
	// Credentials: cookies and HTTP authentication may be sent
	// (Access-Control-Allow-Credentials: true). The spec forbids "*" as the
	// allowed origin then, so an allowed Origin is echoed, with Vary: Origin.
	Credentials bool
	// MaxAge is how long a browser may reuse a preflight answer; 0 is
	// Starlette's 600 s, negative sends none.
	MaxAge time.Duration
}

// Enabled reports whether any origin is allowed.
func (c CORSConfig) Enabled() bool { return len(c.Origins) > 0 }

// Check reports an origin that no browser would send (a path, no scheme,
// no host), so that a typo fails at start rather than blocking every page.
func (c CORSConfig) Check() error {
	for _, o := range c.Origins {
		if o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || u.Scheme == "" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return fmt.Errorf("CORS origin %q: want scheme://host[:port] (or *)", o)
		}
	}
	return nil
}

// corsExposed are the response headers a page's script may read besides
// the CORS-safelisted ones: what the OpenAI SDKs read (request id, retry
// and rate-limit headers).
const corsExposed = "X-Request-Id, Retry-After, X-Tokenbus-Queue-Position, X-Tokenbus-Queue-Wait-Ms, x-ratelimit-limit-requests, x-ratelimit-limit-tokens, " +
	"x-ratelimit-remaining-requests, x-ratelimit-remaining-tokens, x-ratelimit-reset-requests, x-ratelimit-reset-tokens"

// cors is CORSConfig compiled for the middleware.
type cors struct {
	anyOrigin   bool
	origins     map[string]bool // normalised: lower case, no trailing '/'
	credentials bool
	methods     string // "" : echo the requested method
	headers     string // "" : echo the requested headers
	maxAge      string // "" : no Access-Control-Max-Age
	// vary: the answer depends on the request's Origin (a list, or
	// credentials), so caches must key on it.
	vary bool
}

// newCORS compiles cfg; nil when CORS is off. Origins Check refuses are
// kept as given (they never match).
func newCORS(cfg CORSConfig) *cors {
	if !cfg.Enabled() {
		return nil
	}
	x := &cors{origins: map[string]bool{}, credentials: cfg.Credentials}
	for _, o := range cfg.Origins {
		if o = strings.TrimSpace(o); o == "*" {
			x.anyOrigin = true
		} else if o != "" {
			x.origins[normOrigin(o)] = true
		}
	}
	x.vary = !x.anyOrigin || x.credentials
	x.methods = corsList(cfg.Methods, strings.ToUpper)
	x.headers = corsList(cfg.Headers, strings.ToLower)
	switch {
	case cfg.MaxAge == 0:
		x.maxAge = "600"
	case cfg.MaxAge > 0:
		x.maxAge = strconv.Itoa(int(cfg.MaxAge / time.Second))
	}
	return x
}

// corsList joins a configured list; "" when it is empty or has "*".
func corsList(l []string, norm func(string) string) string {
	var out []string
	for _, v := range l {
		switch v = strings.TrimSpace(v); v {
		case "*":
			return ""
		case "":
		default:
			out = append(out, norm(v))
		}
	}
	return strings.Join(out, ", ")
}

func normOrigin(o string) string { return strings.TrimSuffix(strings.ToLower(o), "/") }

// allowed is the Access-Control-Allow-Origin to send for origin: "*", the
// origin itself, or "" (not allowed: no CORS headers at all).
func (x *cors) allowed(origin string) string {
	switch {
	case x.anyOrigin && !x.credentials:
		return "*"
	case x.anyOrigin || x.origins[normOrigin(origin)]:
		return origin // echoed as sent: browsers compare it byte for byte
	}
	return ""
}

// handle is the middleware: a preflight (OPTIONS with Origin and
// Access-Control-Request-Method) is answered here, 204, before routing and
// authentication (a preflight carries no credentials, so it must not be
// 401'd); any other request with an allowed Origin gets Allow-Origin (and
// Expose-Headers) before its handler runs, so errors and streams (whose
// head httpstream builds from the response headers set by then) carry it.
func (x *cors) handle(c *fiber.Ctx) error {
	if x.vary {
		c.Vary(fiber.HeaderOrigin)
	}
	origin := c.Get(fiber.HeaderOrigin)
	if origin == "" {
		return c.Next()
	}
	method := c.Get(fiber.HeaderAccessControlRequestMethod)
	if c.Method() != fiber.MethodOptions || method == "" {
		x.setSimple(c, origin)
		return c.Next()
	}
	c.Locals(localPreflight, true)
	c.Vary(fiber.HeaderAccessControlRequestMethod, fiber.HeaderAccessControlRequestHeaders)
	if allow := x.allowed(origin); allow != "" {
		c.Set(fiber.HeaderAccessControlAllowOrigin, allow)
		if x.credentials {
			c.Set(fiber.HeaderAccessControlAllowCredentials, "true")
		}
		if x.methods != "" {
			method = x.methods
		}
		c.Set(fiber.HeaderAccessControlAllowMethods, method)
		headers := x.headers
		if headers == "" {
			headers = c.Get(fiber.HeaderAccessControlRequestHeaders)
		}
		if headers != "" {
			c.Set(fiber.HeaderAccessControlAllowHeaders, headers)
		}
		if x.maxAge != "" {
			c.Set(fiber.HeaderAccessControlMaxAge, x.maxAge)
		}
	}
	return c.SendStatus(fiber.StatusNoContent)
}

// setSimple sets the headers of an actual (not preflight) response.
func (x *cors) setSimple(c *fiber.Ctx, origin string) {
	allow := x.allowed(origin)
	if allow == "" {
		return
	}
	c.Set(fiber.HeaderAccessControlAllowOrigin, allow)
	if x.credentials {
		c.Set(fiber.HeaderAccessControlAllowCredentials, "true")
	}
	c.Set(fiber.HeaderAccessControlExposeHeaders, corsExposed)
}
