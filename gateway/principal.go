package gateway

// Principal is whom Config.Authorize admitted a request as; the gateway
// hands it back to Config.OnUsage when the request ends.
type Principal struct {
	Tenant string // sent on the bus as Tb-Tenant ("" for none)
	KeyID  string // the API key's id, for usage accounting ("" without keys)
}
