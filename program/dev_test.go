package program

import "testing"

// dev's example adapter is named after the model it serves, as a path
// segment of the TorchServe routes can hold it.
func TestExampleAdapter(t *testing.T) {
	for model, want := range map[string]string{
		"llama-8b":                         "llama-8b-lora=sim://llama-8b-lora",
		"meta-llama/Llama-3.1-8B-Instruct": "Llama-3.1-8B-Instruct-lora=sim://Llama-3.1-8B-Instruct-lora",
		"/models/qwen/":                    "qwen-lora=sim://qwen-lora",
		"qwen2.5 7b:q4_K":                  "qwen2.5-7b-q4_K-lora=sim://qwen2.5-7b-q4_K-lora",
		"mödel?x=1#y":                      "m-del-x-1-y-lora=sim://m-del-x-1-y-lora",
	} {
		if got := ExampleAdapter(model); got != want {
			t.Errorf("ExampleAdapter(%q) = %q, want %q", model, got, want)
		}
	}
}
