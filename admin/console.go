package admin

import (
	"embed"
	"io/fs"
	"mime"
	"path"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/schemas"
)

// console holds the web console: plain HTML, CSS and JavaScript modules, no
// build step (docs/console.md says why).
//
//go:embed console
var console embed.FS

// consoleCSP lets the page run only its own scripts and styles; it may call
// the admin API (its origin) and the OpenAI API (another port: the
// playground), and nothing may frame it.
const consoleCSP = "default-src 'self'; connect-src 'self' http: https:; img-src 'self' data: blob:; " +
	"style-src 'self'; script-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// consoleRoutes serves the console's files without the admin token: they
// hold no data.
func (s *Server) consoleRoutes() {
	s.app.Get("/console/*", s.consoleFile)
}

// consoleFile serves one embedded file; /console/ is index.html. The config
// is not a file: it falls through to the token check and consoleConfig.
func (s *Server) consoleFile(c *fiber.Ctx) error {
	if c.Path() == "/console" { // the page's relative links need the slash
		return c.Redirect("/console/", fiber.StatusMovedPermanently)
	}
	name := c.Params("*")
	if name == "config" {
		return c.Next()
	}
	if name == "" {
		name = "index.html"
	}
	if strings.Contains(name, "..") {
		return schemas.ErrUnknownURL.New(c.Method(), "/console/"+name)
	}
	b, err := fs.ReadFile(console, path.Join("console", name))
	if err != nil {
		return schemas.ErrUnknownURL.New(c.Method(), "/console/"+name)
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	c.Set(fiber.HeaderContentType, ct)
	c.Set(fiber.HeaderContentSecurityPolicy, consoleCSP)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	c.Set(fiber.HeaderReferrerPolicy, "no-referrer")
	c.Set(fiber.HeaderCacheControl, "no-cache")
	return c.Send(b)
}

// consoleConfig is what the page needs to know beyond the admin API.
type consoleConfig struct {
	// APIAddr is the OpenAI API's listen address (host:port); the page
	// uses its own host name when the host is unspecified (0.0.0.0, [::]).
	APIAddr string `json:"api_addr"`
	APIAuth bool   `json:"api_auth"` // the playground needs an API key
	Batches bool   `json:"batches"`
}

// GET /console/config (admin token required).
func (s *Server) consoleConfig(c *fiber.Ctx) error {
	return c.JSON(consoleConfig{APIAddr: s.cfg.APIAddr, APIAuth: s.cfg.APIAuth, Batches: s.cfg.Batches != nil})
}
