package vllm

import (
	"fmt"

	"github.com/tokenbus/tokenbus/workers/engine/httpengine"
)

// Prefill/decode disaggregation (docs/disaggregation.md): the worker sends
// vLLM the bodies of vLLM's own KV-transfer handshake (kv_transfer_params,
// schemas.PrefillBody and DecodeBody) and reads the params from its
// answer; vLLM's KV connector (e.g. NixlConnector, started with
// --kv-transfer-config) moves the KV blocks between the two instances.
// The engine passes bodies through untouched either way: all it adds is
// saying that its server has a connector.

// flagKVTransfer is vLLM's flag that names its KV connector.
const flagKVTransfer = "--kv-transfer-config"

// kvTransferConfig checks cfg for disaggregation, before the child starts:
// a command must configure a KV connector.
func kvTransferConfig(cfg *Config) error {
	if !cfg.KVTransfer || cfg.Command == "" {
		return nil // attached by URL: the operator says it has one
	}
	if httpengine.FlagValue(cfg.Command, flagKVTransfer) == "" {
		return fmt.Errorf("vllm engine: a prefill or decode worker needs vLLM's KV connector: add %s to the command (%q), e.g. %s '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'",
			flagKVTransfer, cfg.Command, flagKVTransfer)
	}
	return nil
}

// KVTransfer implements engine.KVTransferer: true when the worker was told
// its vLLM has a KV connector (Config.KVTransfer).
func (e *Engine) KVTransfer() bool { return e.cfg.KVTransfer }
