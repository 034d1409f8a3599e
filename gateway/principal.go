package gateway

// Principal is whom Config.Authorize admitted a request as, and what it
// reserved; the gateway puts it in the UsageRecord it hands to
// Config.OnUsage when the request ends.
type Principal struct {
	Tenant string // sent on the bus as Tb-Tenant ("" for none)
	KeyID  string // the API key's id, for usage accounting ("" without keys)
	// Reserved tokens against the key's TPM limit in rate-limit window
	// Window (0: none), settled when the usage is recorded.
	Reserved int
	Window   int64
}
