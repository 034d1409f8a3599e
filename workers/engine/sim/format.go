package sim

import (
	"fmt"
	"strings"

	"github.com/tokenbus/tokenbus/schemas"
)

// response_format: {"type": "json_schema", "json_schema": {"name", "schema",
// "strict"}} makes the answer JSON valid against the schema (jsonschema.go);
// {"type": "json_object"} makes it a JSON object, {"answer": "<words>"};
// "text" (or none) leaves it text.

// formatPlan is a structured answer's shape.
type formatPlan struct {
	schema *schemaNode // nil for json_object
	strict bool
}

// planFormat reads response_format: nil for text.
func planFormat(rf *schemas.ResponseFormat) (*formatPlan, *schemas.Error) {
	switch rf.Type {
	case "", "text":
		return nil, nil
	case "json_object":
		return &formatPlan{}, nil
	case "json_schema":
		if !rf.HasJSONSchema {
			return nil, schemas.ErrMissingParam.At("response_format.json_schema", "response_format.json_schema")
		}
		if rf.Schema == nil { // no schema: any object, as json_object
			return &formatPlan{strict: rf.Strict}, nil
		}
		n, err := compileSchema(rf.Schema, "response_format.json_schema.schema")
		if err != nil {
			return nil, err
		}
		return &formatPlan{schema: n, strict: rf.Strict}, nil
	}
	return nil, schemas.ErrInvalidValue.At("response_format.type", "response_format.type",
		fmt.Sprintf("expected 'text', 'json_object' or 'json_schema', but got '%s'", rf.Type))
}

// generate is the answer's JSON, drawn from seed.
func (f *formatPlan) generate(seed uint64) []byte {
	if f.schema != nil {
		return generateJSON(f.schema, seed, f.strict)
	}
	g := &jsonGen{rng: schemas.Mix64(seed^0x6a09e667f3bcc909) | 1}
	var b strings.Builder
	b.WriteString(starters[g.intn(len(starters))])
	for range 4 + g.intn(12) {
		b.WriteString(words[g.intn(len(words))])
	}
	b.WriteByte('.')
	return append(appendString([]byte(`{"answer": `), b.String()), '}')
}
