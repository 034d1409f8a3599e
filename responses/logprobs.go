package responses

import "encoding/json"

// Logprobs (include message.output_text.logprobs): the chat chunks'
// choices[].logprobs.content, one entry per token, become the
// output_text.delta events' logprobs ({token, logprob, top_logprobs}) and,
// whole, the output_text part's ({token, bytes, logprob, top_logprobs},
// bytes required there), as the SDKs' types define them.

// tokenLogprob is one token's logprob, as chat sends it and as the
// output_text part keeps it.
type tokenLogprob struct {
	Token       string       `json:"token"`
	Bytes       []int        `json:"bytes"`
	Logprob     float64      `json:"logprob"`
	TopLogprobs []topLogprob `json:"top_logprobs"`
}

type topLogprob struct {
	Token   string  `json:"token"`
	Bytes   []int   `json:"bytes"`
	Logprob float64 `json:"logprob"`
}

// deltaLogprob is an output_text.delta event's form: no bytes.
type deltaLogprob struct {
	Token       string     `json:"token"`
	Logprob     float64    `json:"logprob"`
	TopLogprobs []deltaTop `json:"top_logprobs"`
}

type deltaTop struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
}

// deltaLogprobs is the events' logprobs of lps: [] when there are none
// (the field is required).
func deltaLogprobs(lps []tokenLogprob) json.RawMessage {
	if len(lps) == 0 {
		return json.RawMessage("[]")
	}
	out := make([]deltaLogprob, len(lps))
	for i, lp := range lps {
		out[i] = deltaLogprob{Token: lp.Token, Logprob: lp.Logprob, TopLogprobs: make([]deltaTop, len(lp.TopLogprobs))}
		for j, t := range lp.TopLogprobs {
			out[i].TopLogprobs[j] = deltaTop{Token: t.Token, Logprob: t.Logprob}
		}
	}
	b, _ := json.Marshal(out)
	return b
}

// readLogprobs reads logprobs of a chunk or an event, filling bytes (from
// the token's UTF-8) and top_logprobs where they are missing.
func readLogprobs(raw json.RawMessage) []tokenLogprob {
	if len(raw) == 0 {
		return nil
	}
	var lps []tokenLogprob
	if json.Unmarshal(raw, &lps) != nil {
		return nil
	}
	return fillLogprobs(lps)
}

func fillLogprobs(lps []tokenLogprob) []tokenLogprob {
	for i := range lps {
		lp := &lps[i]
		if lp.Bytes == nil {
			lp.Bytes = utf8Bytes(lp.Token)
		}
		if lp.TopLogprobs == nil {
			lp.TopLogprobs = []topLogprob{}
		}
		for j := range lp.TopLogprobs {
			if lp.TopLogprobs[j].Bytes == nil {
				lp.TopLogprobs[j].Bytes = utf8Bytes(lp.TopLogprobs[j].Token)
			}
		}
	}
	return lps
}

func utf8Bytes(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}
