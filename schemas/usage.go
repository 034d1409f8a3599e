package schemas

// UsageRecord is one finished request's usage, as it travels to the usage
// log (subjects UsagePrefix + <source>, kept by JetStream until written to
// Redis). Gateways publish the records of HTTP requests; workers those of
// NATS-native requests a dispatcher admitted for a key (header HdrKeyID).
// RequestID makes a redelivered record count once.
type UsageRecord struct {
	RequestID string `json:"request_id"`
	KeyID     string `json:"key_id"` // "" when auth is off: counted as the anonymous key
	Tenant    string `json:"tenant,omitempty"`
	Model     string `json:"model"`
	Usage     Usage  `json:"usage"`
	// Estimated: the engine reported no usage and it was counted from the
	// stream's chunks.
	Estimated bool `json:"estimated,omitempty"`
	// Reserved is what admission reserved against the key's TPM limit, and
	// Window the rate-limit window it reserved in (0: nothing reserved):
	// settling adds Usage − Reserved to that window while it is current.
	Reserved int   `json:"reserved,omitempty"`
	Window   int64 `json:"window,omitempty"`
}

// UsagePrefix + <source>: UsageRecord JSON, one per finished request.
const UsagePrefix = Prefix + ".usage."
