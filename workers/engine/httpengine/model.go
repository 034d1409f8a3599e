package httpengine

import (
	"bytes"
	"encoding/json"
)

// modelName makes every answer name the model the client asked for. Some
// servers answer with a name of their own for the model they serve
// (transformers serve: "tb-llama@main" for "tb-llama"); clients, usage
// records and /v1/models know only the name tokenbus routed by. vLLM
// answers with the requested name, so the common case costs one comparison
// on the first chunk and nothing after.
type modelName struct {
	want    []byte // the requested name, JSON-quoted
	checked bool   // the first chunk has been looked at
	from    []byte // the engine's name, JSON-quoted as it sends it; nil: no rewrite
	buf     []byte // the last rewritten chunk
}

func newModelName(model string) modelName {
	q, _ := json.Marshal(model)
	return modelName{want: q}
}

// fix returns d with its top-level "model" value rewritten to the requested
// name when the engine uses another; d itself otherwise. The result is valid
// until the next call.
func (m *modelName) fix(d []byte) []byte {
	if m.want == nil || m.checked && m.from == nil {
		return d
	}
	start, end := modelValue(d)
	if !m.checked {
		m.checked = true
		if start < 0 || bytes.Equal(d[start:end], m.want) {
			return d // vLLM, and servers that send no model
		}
		m.from = bytes.Clone(d[start:end])
	}
	if start < 0 || !bytes.Equal(d[start:end], m.from) {
		return d
	}
	m.buf = append(append(append(m.buf[:0], d[:start]...), m.want...), d[end:]...)
	return m.buf
}

// modelValue finds the first "model" member whose value is a string and
// returns the value's bounds, quotes included; -1, -1 if none. In an
// OpenAI chunk or response it is the top-level one: it comes before the
// choices, and text inside strings has its quotes escaped, so it cannot
// match.
func modelValue(d []byte) (int, int) {
	off := 0
	for {
		i := quoted(d[off:], []byte(`model"`))
		if i < 0 {
			return -1, -1
		}
		off += i + len(`model"`)
		r := off
		for r < len(d) && (d[r] == ' ' || d[r] == '\t') {
			r++
		}
		if r >= len(d) || d[r] != ':' {
			continue
		}
		r++
		for r < len(d) && (d[r] == ' ' || d[r] == '\t') {
			r++
		}
		if r >= len(d) || d[r] != '"' {
			continue
		}
		for j := r + 1; j < len(d); j++ {
			switch d[j] {
			case '\\':
				j++
			case '"':
				return r, j + 1
			}
		}
		return -1, -1
	}
}
