package cli

import (
	"github.com/spf13/pflag"

	"github.com/tokenbus/tokenbus/program"
	"github.com/tokenbus/tokenbus/workers/engine/sim"
)

// registerEngine defines the flags that choose and configure a worker's
// engine on c, c's values as defaults.
func registerEngine(fs *pflag.FlagSet, c *program.EngineConfig) {
	fs.StringVar(&c.Kind, "engine", c.Kind, "engine: sim (built in, no GPU), vllm (a vLLM server) or openai (any OpenAI-compatible server)")
	fs.StringVar(&c.Model, "model", c.Model, "sim: the model name it serves")
	fs.StringSliceVar(&c.Sim.Models, "sim-models", c.Sim.Models, "sim: models it can serve, one loaded at a time (the first at start; --model is then ignored): dispatchers switch it to a model requests wait for (docs/capacity.md)")
	fs.DurationVar(&c.Sim.SwitchTime, "sim-switch-time", c.Sim.SwitchTime, "sim: time a switch to another of --sim-models takes to load it")
	fs.StringVar(&c.URL, "engine-url", c.URL, "vllm/openai: the server's URL, e.g. http://127.0.0.1:8000 (vllm: default from --vllm-cmd's --port, else :8000)")
	fs.StringVar(&c.VLLMCmd, "vllm-cmd", c.VLLMCmd, `vllm: start vLLM as a child process with this command line, e.g. "vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000 --enable-lora --max-loras 4"; it is restarted if it dies`)
	fs.StringArrayVar(&c.VLLMModels, "vllm-model", c.VLLMModels, `vllm, instead of --vllm-cmd: name=COMMAND, once per model the worker can serve, one vLLM at a time (GPU memory holds one), e.g. "llama=vllm serve meta-llama/Llama-3.1-8B-Instruct --served-model-name llama --port 8000"; the first starts with the worker, dispatchers switch it to another that requests wait for (docs/capacity.md); in the environment, one a line`)
	fs.StringVar(&c.APIKey, "engine-api-key", c.APIKey, "vllm/openai: API key sent to the engine as a Bearer token")
	fs.StringVar(&c.RequestID, "engine-request-id", c.RequestID, "vllm/openai: how the request id goes to the engine in X-Request-Id: raw, uuid (made from the id; strict servers refuse other ids) or off (default: vllm raw, openai uuid)")
	fs.StringSliceVar(&c.Models, "engine-models", c.Models, "openai: model names the server serves (default: read from its /v1/models)")
	fs.BoolVar(&c.PriorityBands, "vllm-priority-bands", c.PriorityBands, "vllm: the engine runs with --scheduling-policy priority: each request's priority is set from its flow-control band (docs/scheduling.md); on by itself when --vllm-cmd has that flag")
	fs.IntVar(&c.MaxLoras, "max-loras", c.MaxLoras, "vllm: LoRA adapters kept loaded, the one asked for least (decayed request rate) evicted first (default: --vllm-cmd's --max-loras, else vLLM's own)")
	fs.StringVar(&c.HealthPath, "engine-health-path", c.HealthPath, `vllm/openai: GET path probed for health when the engine is idle (default: vllm "/health", openai "/v1/models"); a 404 there stops the start at once`)
	fs.DurationVar(&c.HealthInterval, "engine-health-interval", c.HealthInterval, "vllm/openai: how often health is judged, from the requests' outcomes first and a probe only when idle; 0: never probe (healthy while the engine process runs)")
	fs.DurationVar(&c.StartTimeout, "engine-start-timeout", c.StartTimeout, "vllm/openai: how long to wait for the engine's first good health check")
	fs.StringVar(&c.KVEvents, "engine-kv-events", c.KVEvents, `vllm: the ZMQ endpoint of vLLM's KV cache events (its --kv-events-config publisher), e.g. tcp://127.0.0.1:5557, so that dispatchers learn what its prefix cache holds; "auto" with --vllm-cmd adds --kv-events-config to the command on a free port`)
	fs.StringVar(&c.KVEventsTopic, "engine-kv-events-topic", c.KVEventsTopic, `vllm: the topic of vLLM's KV cache events (its --kv-events-config "topic"); default any ("kv-events" with --engine-kv-events auto)`)
	registerSimFlags(fs, &c.Sim)
}

// registerSimFlags defines the sim's latency and capacity flags on c, c's
// values as defaults.
func registerSimFlags(fs *pflag.FlagSet, c *sim.Config) {
	fs.DurationVar(&c.PrefillBase, "sim-prefill-base", c.PrefillBase, "sim: fixed cost of a step that prefills")
	fs.DurationVar(&c.PrefillPerToken, "sim-prefill-per-token", c.PrefillPerToken, "sim: prefill cost per uncached prompt token")
	fs.DurationVar(&c.DecodeBase, "sim-decode-base", c.DecodeBase, "sim: fixed cost of a decode step (about the time per output token)")
	fs.DurationVar(&c.DecodePerSeq, "sim-decode-per-seq", c.DecodePerSeq, "sim: decode step cost per running sequence")
	fs.IntVar(&c.MaxNumSeqs, "sim-max-num-seqs", c.MaxNumSeqs, "sim: max sequences decoded together (vLLM's --max-num-seqs)")
	fs.IntVar(&c.NumBlocks, "sim-kv-blocks", c.NumBlocks, "sim: KV cache size in blocks")
	fs.IntVar(&c.BlockSize, "sim-block-size", c.BlockSize, "sim: tokens per KV cache block")
	fs.IntVar(&c.MaxModelLen, "sim-max-model-len", c.MaxModelLen, "sim: context length")
	fs.IntVar(&c.MaxLoras, "sim-max-loras", c.MaxLoras, "sim: LoRA adapter slots")
	fs.DurationVar(&c.AdapterLoadTime, "sim-lora-load-time", c.AdapterLoadTime, "sim: time to load a LoRA adapter")
	fs.DurationVar(&c.SleepTime, "sim-sleep-time", c.SleepTime, "sim: time to fall asleep (sleep mode, as vLLM's /sleep: see --sleep-after)")
	fs.DurationVar(&c.WakeTime, "sim-wake-time", c.WakeTime, "sim: time to wake up from sleep mode (vLLM's /wake_up)")
	fs.IntVar(&c.EmbeddingDims, "sim-embedding-dims", c.EmbeddingDims, "sim: size of the embeddings it serves on /v1/embeddings (dimensions may ask for fewer)")
	fs.IntVar(&c.ReasoningTokens, "sim-reasoning", c.ReasoningTokens, "sim: a reasoning model: chat answers begin with this many tokens of reasoning_content (reasoning_effort scales it); 0: off")
	fs.DurationVar(&c.KVHoldTime, "sim-kv-hold", c.KVHoldTime, "sim: how long a prefill for a remote decode (kv_transfer_params, docs/disaggregation.md) holds its KV blocks for the decode engine to take them; then they are freed (vLLM: VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
	fs.DurationVar(&c.KVTransferBase, "sim-kv-transfer-base", c.KVTransferBase, "sim: fixed time a decode takes to transfer a remote prefill's KV blocks")
	fs.DurationVar(&c.KVTransferPerToken, "sim-kv-transfer-per-token", c.KVTransferPerToken, "sim: transfer time per prompt token of a remote prefill's KV blocks (0.5µs: an 8B model's 128 KiB a token at about 260 GB/s, NVLink; about 2.6µs over 400 Gb/s RDMA)")
	fs.StringSliceVar(&c.KVPeers, "sim-kv-transfer-peers", c.KVPeers, "sim: hosts besides loopback and this host's name (as prefills' remote_host names them) that a decode may pull KV blocks from; the params come in request bodies, so no other host is ever contacted")
	fs.StringVar(&c.KVTransferAddr, "sim-kv-transfer-addr", c.KVTransferAddr, "sim: TCP address where the sim serves its held KV blocks to decode engines (the remote_host and remote_port of its prefills' kv_transfer_params); an unspecified host (0.0.0.0) is advertised by the host's name")
}
