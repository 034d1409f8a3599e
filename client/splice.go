package client

import (
	"encoding/json"

	"github.com/tokenbus/tokenbus/schemas"
)

// splice rewrites a continuation's output into the stream it continues:
// each chunk gets the original id, created and model; a chat
// continuation's opening role chunk is dropped (the reader had one); usage
// (in a usage chunk, or the done frame) counts the whole completion: the
// original prompt (the continuation's prompt less the base tokens it
// repeats) and every completion token (base plus the continuation's).
// Only migrated streams pay for it.
type splice struct {
	id      string
	created int64
	model   string
	base    int // completion tokens streamed before the continuation
	chat    bool
}

// chunk rewrites a chunk frame's payload; empty: nothing left to send.
func (sp *splice) chunk(payload []byte) []byte {
	out := make([]byte, 0, len(payload)+64)
	_ = schemas.ForEachLine(payload, func(line []byte) error {
		var m map[string]json.RawMessage
		if json.Unmarshal(line, &m) != nil {
			out = append(append(out, line...), '\n')
			return nil
		}
		if sp.chat && roleOnly(m["choices"]) {
			return nil
		}
		m["id"], m["created"], m["model"] = mustJSON(sp.id), mustJSON(sp.created), mustJSON(sp.model)
		if u, ok := m["usage"]; ok && string(u) != "null" {
			m["usage"] = sp.usage(u)
		}
		b, err := json.Marshal(m)
		if err != nil {
			b = line
		}
		out = append(append(out, b...), '\n')
		return nil
	})
	return out
}

// done rewrites a done frame's usage.
func (sp *splice) done(payload []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(payload, &m) != nil {
		return payload
	}
	u, ok := m["usage"]
	if !ok || string(u) == "null" {
		return payload
	}
	m["usage"] = sp.usage(u)
	if b, err := json.Marshal(m); err == nil {
		return b
	}
	return payload
}

func (sp *splice) usage(raw json.RawMessage) json.RawMessage {
	var u schemas.Usage
	if json.Unmarshal(raw, &u) != nil {
		return raw
	}
	u.PromptTokens = max(u.PromptTokens-sp.base, 0)
	u.CompletionTokens += sp.base
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return schemas.AppendUsage(nil, &u)
}

// roleOnly reports whether a chat chunk's choices only open the assistant
// message (a role and no content, no finish).
func roleOnly(raw json.RawMessage) bool {
	var choices []struct {
		Delta struct {
			Role      string          `json:"role"`
			Content   *string         `json:"content"`
			ToolCalls json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	}
	if json.Unmarshal(raw, &choices) != nil || len(choices) == 0 {
		return false
	}
	for _, c := range choices {
		if c.Delta.Role == "" || c.Delta.Content != nil && *c.Delta.Content != "" || c.FinishReason != nil || len(c.Delta.ToolCalls) > 0 {
			return false
		}
	}
	return true
}
