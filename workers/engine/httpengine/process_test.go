package httpengine

import "testing"

func TestShellLine(t *testing.T) {
	for in, want := range map[string]string{
		"vllm serve m --port 8000":            "exec vllm serve m --port 8000",
		"  vllm serve m ":                     "exec vllm serve m",
		"exec vllm serve m":                   "exec vllm serve m",
		"CUDA_VISIBLE_DEVICES=0 vllm serve m": "CUDA_VISIBLE_DEVICES=0 vllm serve m",
		"cd /x && vllm serve m":               "cd /x && vllm serve m",
		"vllm serve m 2>&1 | tee log":         "vllm serve m 2>&1 | tee log",
		"vllm serve $MODEL":                   "exec vllm serve $MODEL",
	} {
		if got := shellLine(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}
