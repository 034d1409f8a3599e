package admin

import (
	"context"

	"github.com/gofiber/fiber/v2"

	"github.com/tokenbus/tokenbus/batch"
	"github.com/tokenbus/tokenbus/registry"
)

// tenantView is a tenant as the admin API shows it: its own quotas (0: the
// default, negative: none), the quotas that apply (0: none), and what it
// keeps now (with the Files and Batches APIs on).
type tenantView struct {
	Object    string           `json:"object"` // "tenant"
	Tenant    string           `json:"tenant"`
	Quotas    registry.Quotas  `json:"quotas"`
	Effective registry.Quotas  `json:"effective"`
	Use       *batch.FileUse   `json:"use"`
	Defaults  *registry.Quotas `json:"defaults,omitempty"` // in the single tenant's answer
}

// GET /tenants: every tenant tokenbus knows of (those of the API keys and
// those with quotas of their own), with quotas and use.
func (s *Server) listTenants(c *fiber.Ctx) error {
	ctx, cancel := s.ctx()
	defer cancel()
	tenants, err := s.cfg.Store.Tenants(ctx)
	if err != nil {
		return err
	}
	own, err := s.cfg.Store.AllTenantQuotas(ctx)
	if err != nil {
		return err
	}
	out := make([]tenantView, 0, len(tenants))
	for _, t := range tenants {
		v, err := s.tenant(ctx, t, own[t])
		if err != nil {
			return err
		}
		out = append(out, v)
	}
	return c.JSON(newList(out))
}

// GET /tenants/{tenant}/quotas: one tenant's (any name: a tenant without
// a record has the defaults).
func (s *Server) getTenantQuotas(c *fiber.Ctx) error {
	tenant := pathParam(c, "tenant")
	ctx, cancel := s.ctx()
	defer cancel()
	own, err := s.cfg.Store.TenantQuotas(ctx, tenant)
	if err != nil {
		return err
	}
	return s.answerTenant(c, ctx, tenant, own)
}

// PUT /tenants/{tenant}/quotas {"file_bytes","files","batches",
// "stored_responses","background","resumable"}: the tenant's own quotas, a
// field left out (or 0) the default, a negative one none. Every gateway
// applies them as soon as the event reaches it.
func (s *Server) putTenantQuotas(c *fiber.Ctx) error {
	tenant := pathParam(c, "tenant")
	var q registry.Quotas
	if err := decode(c, &q); err != nil {
		return err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	if err := s.cfg.Store.SetTenantQuotas(ctx, tenant, q); err != nil {
		return err
	}
	if err := registry.AnnounceQuotas(s.cfg.NC, tenant); err != nil {
		s.log.Warn("could not announce a quota change: gateways apply it within their cache TTL", "err", err)
	}
	s.cfg.Quotas.Forget(tenant) // this process's own cache, event or not
	return s.answerTenant(c, ctx, tenant, q)
}

func (s *Server) answerTenant(c *fiber.Ctx, ctx context.Context, tenant string, own registry.Quotas) error {
	v, err := s.tenant(ctx, tenant, own)
	if err != nil {
		return err
	}
	def := s.defaults()
	v.Defaults = &def
	return c.JSON(v)
}

// tenant is tenant's view from its own quotas.
func (s *Server) tenant(ctx context.Context, tenant string, own registry.Quotas) (tenantView, error) {
	v := tenantView{Object: "tenant", Tenant: tenant, Quotas: own, Effective: own.Resolve(s.defaults())}
	if s.cfg.Batches != nil {
		use, err := s.cfg.Batches.Use(ctx, tenant)
		if err != nil {
			return tenantView{}, err
		}
		v.Use = &use
	}
	return v, nil
}

// defaults is the gateway's default quotas (none without a cache).
func (s *Server) defaults() registry.Quotas {
	if s.cfg.Quotas == nil {
		return registry.Quotas{}
	}
	return s.cfg.Quotas.Defaults()
}
