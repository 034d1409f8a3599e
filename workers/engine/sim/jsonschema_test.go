package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tokenbus/tokenbus/schemas"
)

// Schemas as clients send them: pydantic v2's model_json_schema(), pydantic
// v1's (definitions, allOf), OpenAI's strict schemas (what the SDKs' parse
// helpers send), and the keywords of the documented subset.
var testSchemas = []struct {
	name   string
	schema string
	strict bool
}{
	{"pydantic v2 model", `{"$defs":{"Address":{"properties":{"street":{"title":"Street","type":"string"},"zip":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"title":"Zip"}},"required":["street"],"title":"Address","type":"object"},
		"Color":{"enum":["red","green","blue"],"title":"Color","type":"string"}},
		"properties":{"name":{"title":"Name","type":"string"},"age":{"exclusiveMinimum":0,"title":"Age","type":"integer"},
		"email":{"format":"email","title":"Email","type":"string"},"tags":{"items":{"type":"string"},"maxItems":3,"title":"Tags","type":"array"},
		"address":{"$ref":"#/$defs/Address"},"color":{"$ref":"#/$defs/Color","default":"red"},
		"score":{"maximum":1.0,"minimum":0.0,"title":"Score","type":"number"},"created":{"format":"date-time","title":"Created","type":"string"},
		"kind":{"const":"person","title":"Kind","type":"string"},"pair":{"maxItems":2,"minItems":2,"prefixItems":[{"type":"integer"},{"type":"string"}],"title":"Pair","type":"array"},
		"meta":{"additionalProperties":{"type":"integer"},"title":"Meta","type":"object"},"id":{"format":"uuid","title":"Id","type":"string"},
		"active":{"title":"Active","type":"boolean"},"nickname":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null,"title":"Nickname"}},
		"required":["name","age","email","tags","address","score","created","kind","pair","meta","id","active"],"title":"Person","type":"object"}`, false},
	{"pydantic v2 recursive", `{"$defs":{"Node":{"properties":{"value":{"title":"Value","type":"integer"},"children":{"items":{"$ref":"#/$defs/Node"},"title":"Children","type":"array"}},
		"required":["value","children"],"title":"Node","type":"object"}},"$ref":"#/$defs/Node"}`, false},
	{"pydantic v2 discriminated union", `{"$defs":{"Cat":{"properties":{"pet_type":{"const":"cat","title":"Pet Type","type":"string"},"meows":{"title":"Meows","type":"integer"}},"required":["pet_type","meows"],"title":"Cat","type":"object"},
		"Dog":{"properties":{"pet_type":{"const":"dog","title":"Pet Type","type":"string"},"barks":{"title":"Barks","type":"number"}},"required":["pet_type","barks"],"title":"Dog","type":"object"}},
		"properties":{"pet":{"discriminator":{"mapping":{"cat":"#/$defs/Cat","dog":"#/$defs/Dog"},"propertyName":"pet_type"},"oneOf":[{"$ref":"#/$defs/Cat"},{"$ref":"#/$defs/Dog"}],"title":"Pet"},
		"n":{"title":"N","type":"integer"}},"required":["pet","n"],"title":"Model","type":"object"}`, false},
	{"pydantic v1 definitions and allOf", `{"title":"Item","type":"object","properties":{"size":{"$ref":"#/definitions/Size"},"owner":{"title":"Owner","allOf":[{"$ref":"#/definitions/User"}]},
		"count":{"title":"Count","type":"integer","minimum":10,"maximum":20,"multipleOf":5}},"required":["size","owner","count"],
		"definitions":{"Size":{"title":"Size","description":"An enumeration.","enum":["S","M","L"]},"User":{"title":"User","type":"object","properties":{"id":{"title":"Id","type":"integer"}},"required":["id"]}}}`, false},
	{"OpenAI strict", `{"type":"object","properties":{"steps":{"type":"array","items":{"type":"object","properties":{"explanation":{"type":"string"},"output":{"type":"string"}},
		"required":["explanation","output"],"additionalProperties":false}},"final_answer":{"type":"string"},"confidence":{"type":["number","null"]}},
		"required":["steps","final_answer","confidence"],"additionalProperties":false}`, true},
	{"strict, all properties", `{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"},"c":{"type":"object","properties":{"d":{"type":"boolean"}}}},"required":["a"]}`, true},
	{"arrays and strings", `{"type":"object","properties":{"ids":{"type":"array","items":{"type":"integer","minimum":-5,"maximum":-1},"minItems":4,"maxItems":6},
		"tags":{"type":"array","items":{"enum":["x","y","z"]},"uniqueItems":true,"minItems":2},"code":{"type":"string","minLength":12,"maxLength":14},
		"short":{"type":"string","maxLength":3},"none":{"type":"array","maxItems":0},"tuple":{"type":"array","prefixItems":[{"type":"boolean"},{"type":"null"}],"items":false},
		"ip":{"type":"string","format":"ipv4"},"day":{"type":"string","format":"date"},"site":{"type":"string","format":"uri"},
		"price":{"type":"number","exclusiveMinimum":0.5,"exclusiveMaximum":0.52},"step":{"type":"number","multipleOf":0.25,"minimum":1,"maximum":2}},
		"required":["ids","tags","code","short","none","tuple","ip","day","site","price","step"]}`, false},
	{"no type, inferred", `{"properties":{"x":{"items":{"minimum":3}},"y":{}},"required":["x","y","z"]}`, false},
	{"top-level array", `{"type":"array","items":{"type":"string"},"minItems":1}`, false},
	{"boolean schemas", `{"type":"object","properties":{"any":true},"required":["any"]}`, false},
	{"minProperties", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"minProperties":2}`, false},
}

func compileTestSchema(t testing.TB, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("the test's schema: %v", err)
	}
	return sch
}

func validate(t testing.TB, sch *jsonschema.Schema, text string) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("not JSON: %s: %v", text, err)
	}
	if err := sch.Validate(inst); err != nil {
		t.Fatalf("%s does not validate: %v", text, err)
	}
}

// Generated JSON validates (a JSON Schema library says so) for many seeds.
func TestJSONSchemaGenerate(t *testing.T) {
	for _, tc := range testSchemas {
		t.Run(tc.name, func(t *testing.T) {
			sch := compileTestSchema(t, tc.schema)
			n, err := compileSchema([]byte(tc.schema), "schema")
			if err != nil {
				t.Fatal(err.JSON())
			}
			distinct := map[string]bool{}
			for seed := range uint64(200) {
				out := generateJSON(n, seed, tc.strict)
				validate(t, sch, string(out))
				distinct[string(out)] = true
				if again := generateJSON(n, seed, tc.strict); !bytes.Equal(again, out) {
					t.Fatalf("seed %d: %s, then %s", seed, out, again)
				}
			}
			if len(distinct) < 2 {
				t.Errorf("one answer for every seed: %v", distinct)
			}
		})
	}
}

// Strict: every property; else the required ones.
func TestJSONSchemaStrictProperties(t *testing.T) {
	n, err := compileSchema([]byte(`{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer"}},"required":["b"]}`), "s")
	if err != nil {
		t.Fatal(err.JSON())
	}
	for strict, want := range map[bool][]string{false: {"b"}, true: {"a", "b"}} {
		var m map[string]any
		if err := json.Unmarshal(generateJSON(n, 1, strict), &m); err != nil {
			t.Fatal(err)
		}
		if len(m) != len(want) {
			t.Errorf("strict %v: %v, want the properties %v", strict, m, want)
		}
	}
}

func TestJSONSchemaErrors(t *testing.T) {
	for _, tc := range []struct{ schema, says string }{
		{`{"$ref":"#/$defs/Missing"}`, "does not resolve"},
		{`{"$ref":"https://example.com/s.json"}`, "not a local reference"},
		{`{"type":"strnig"}`, `unknown type "strnig"`},
		{`{"type":"object","properties":[]}`, "properties must be an object"},
		{`{"type":"object","properties":{"a":5}}`, "at #/properties/a: a schema must be an object or a boolean"},
		{`{"type":"array","minItems":3,"maxItems":2}`, "minItems 3 > maxItems 2"},
		{`{"enum":[]}`, "enum must be a non-empty array"},
		{`{"required":"a"}`, "required must be an array of strings"},
		{`{"type":"integer","minimum":5,"maximum":1}`, "no number is within its bounds"},
		{`{"type":"string","minLength":100000}`, "more than the sim generates"},
	} {
		_, err := compileSchema([]byte(tc.schema), "response_format.json_schema.schema")
		if err == nil {
			t.Errorf("%s: compiled", tc.schema)
			continue
		}
		if err.Status != 400 || *err.Body.Param != "response_format.json_schema.schema" || *err.Body.Code != "invalid_value" ||
			!strings.Contains(err.Body.Message, tc.says) {
			t.Errorf("%s: %s, want a 400 invalid_value saying %q", tc.schema, err.JSON(), tc.says)
		}
	}
}

func TestSplitTokens(t *testing.T) {
	for _, s := range []string{`{"a": "the sea", "b": [1, 2.5, null]}`, `{"name": "Zoë 😀 日本"}`, "{}"} {
		pieces := splitTokens([]byte(s))
		if strings.Join(pieces, "") != s {
			t.Errorf("%q: pieces %q", s, pieces)
		}
		ascii := true
		for _, c := range s {
			ascii = ascii && c < 128
		}
		if ascii && len(pieces) != countTokens(t, s) {
			t.Errorf("%q: %d pieces, %d tokens", s, len(pieces), countTokens(t, s))
		}
	}
}

// The engine's answers validate, streamed or not, the same for the same
// request; a short max_tokens cuts the JSON (finish_reason length).
func TestResponseFormatJSONSchema(t *testing.T) {
	e := newEngine(t, fastConfig())
	for _, tc := range testSchemas {
		t.Run(tc.name, func(t *testing.T) {
			sch := compileTestSchema(t, tc.schema)
			for seed := range 3 {
				body := fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":"Fill it in"}],"seed":%d,`+
					`"response_format":{"type":"json_schema","json_schema":{"name":"out","strict":%v,"schema":%s}}`, seed, tc.strict, tc.schema)
				whole := chatAnswer(t, e, body+`}`)
				validate(t, sch, whole.content)
				if whole.finish != "stop" || whole.usage.CompletionTokens != len(splitTokens([]byte(whole.content))) {
					t.Errorf("finish %q, usage %+v for %q", whole.finish, whole.usage, whole.content)
				}
				streamed := chatStream(t, e, body+`,"stream":true,"stream_options":{"include_usage":true}}`)
				if streamed.content != whole.content || streamed.finish != "stop" || streamed.usage.CompletionTokens != whole.usage.CompletionTokens {
					t.Errorf("streamed %+v, whole %+v", streamed, whole)
				}
				if streamed.deltas < 2 {
					t.Errorf("the JSON came in %d deltas", streamed.deltas)
				}
			}
		})
	}
	body := `{"model":"sim","messages":[{"role":"user","content":"x"}],"max_tokens":4,"response_format":{"type":"json_schema","json_schema":{"name":"o","schema":` +
		testSchemas[0].schema + `}}`
	cut := chatAnswer(t, e, body+`}`)
	full := chatAnswer(t, e, strings.Replace(body, `"max_tokens":4,`, "", 1)+`}`)
	if cut.finish != "length" || cut.usage.CompletionTokens != 4 || !strings.HasPrefix(full.content, cut.content) || json.Valid([]byte(cut.content)) {
		t.Errorf("cut %+v of %q", cut, full.content)
	}
	if s := chatStream(t, e, body+`,"stream":true}`); s.finish != "length" || s.content != cut.content {
		t.Errorf("cut stream %+v", s)
	}
}

func TestResponseFormatJSONObject(t *testing.T) {
	e := newEngine(t, fastConfig())
	a := chatAnswer(t, e, `{"model":"sim","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}`)
	var m map[string]string
	if err := json.Unmarshal([]byte(a.content), &m); err != nil || len(strings.Fields(m["answer"])) < 5 || a.finish != "stop" {
		t.Fatalf("%+v: %v", a, err)
	}
	// no schema: an object too; "text" is text; completions take it too
	a = chatAnswer(t, e, `{"model":"sim","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"any"}}}`)
	if !json.Valid([]byte(a.content)) || a.content[0] != '{' {
		t.Errorf("no schema: %q", a.content)
	}
	a = chatAnswer(t, e, `{"model":"sim","messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}}`)
	if json.Valid([]byte(a.content)) {
		t.Errorf("text: %q", a.content)
	}
	res := mustGen(t, e, schemas.KindCompletion, `{"model":"sim","prompt":"x","max_tokens":100,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}}}}`, nil)
	var c textCompletion
	decodeStrict(t, res.Response, &c)
	if err := json.Unmarshal([]byte(c.Choices[0].Text), new(struct{ N int })); err != nil || c.Choices[0].FinishReason != "stop" {
		t.Errorf("completion %q: %v", c.Choices[0].Text, err)
	}
}

func TestResponseFormatErrors(t *testing.T) {
	e := newEngine(t, fastConfig())
	for _, tc := range []struct{ format, param string }{
		{`{"type":"xml"}`, "response_format.type"},
		{`{"type":"json_schema"}`, "response_format.json_schema"},
		{`{"type":"json_schema","json_schema":{"name":"x","schema":{"$ref":"#/nope"}}}`, "response_format.json_schema.schema"},
		{`{"type":"json_schema","json_schema":{"name":"x","schema":[]}}`, "response_format.json_schema.schema"},
	} {
		_, err := gen(t, e, schemas.KindChat, `{"model":"sim","messages":[{"role":"user","content":"x"}],"response_format":`+tc.format+`}`, nil)
		if err == nil {
			t.Errorf("%s: accepted", tc.format)
			continue
		}
		if se := asError(t, err); se.Status != 400 || *se.Body.Param != tc.param {
			t.Errorf("%s: %s, want a 400 about %s", tc.format, se.JSON(), tc.param)
		}
	}
}

// Minimums multiply through nesting: three nested arrays of minItems 4096
// would be 7·10^10 values. The generator stops at maxAnswerBytes (no
// answer longer than a context window is ever delivered).
func TestJSONSchemaNestedMinimumsBounded(t *testing.T) {
	n, err := compileSchema([]byte(`{"type":"array","minItems":4096,"items":{"type":"array","minItems":4096,
		"items":{"type":"array","minItems":4096,"items":{"type":"string","minLength":64}}}}`), "s")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out := generateJSON(n, 1, false)
	if len(out) > maxAnswerBytes+4096 || time.Since(start) > 5*time.Second {
		t.Fatalf("%d bytes in %v", len(out), time.Since(start))
	}
}
