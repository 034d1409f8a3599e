package httpengine

import (
	"encoding/json"
	"fmt"
)

// parseModels reads a GET /v1/models answer as servers really write it:
// only "id" is needed ("created", "owned_by", "object" may be missing or of
// another type, extra fields are ignored, "data" may be null). An entry
// whose id is not a non-empty string is skipped, not advertised as "";
// parent and root are read only when they are strings, max_model_len only
// when a positive integer; a repeated id is listed once.
func parseModels(body []byte) ([]Model, error) {
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("GET /v1/models: %v", err)
	}
	ms := make([]Model, 0, len(list.Data))
	seen := make(map[string]bool, len(list.Data))
	for _, raw := range list.Data {
		var entry map[string]json.RawMessage
		if json.Unmarshal(raw, &entry) != nil {
			continue
		}
		m := Model{ID: stringField(entry, "id"), Parent: stringField(entry, "parent"), Root: stringField(entry, "root"),
			MaxModelLen: positiveInt(entry["max_model_len"])}
		if m.ID == "" || seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		ms = append(ms, m)
	}
	return ms, nil
}

// positiveInt is r when it is a JSON integer above 0, else 0 (null, absent,
// a string, a fraction: the server's length is then unknown).
func positiveInt(r json.RawMessage) int {
	var n int
	if len(r) == 0 || json.Unmarshal(r, &n) != nil || n <= 0 {
		return 0
	}
	return n
}

// stringField is entry[key] when it is a JSON string, else "".
func stringField(entry map[string]json.RawMessage, key string) string {
	if p := rawString(entry[key]); p != nil {
		return *p
	}
	return ""
}
