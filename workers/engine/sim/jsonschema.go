package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tokenbus/tokenbus/schemas"
)

// The JSON a structured answer is made of (response_format json_schema, a
// tool call's arguments): generated from the request's JSON Schema, so that
// it validates, and drawn from the sequence's seed, so that the same request
// gives the same JSON. The subset of JSON Schema it knows is the one
// pydantic's model_json_schema() and OpenAI's strict schemas use (see
// docs/engines.md, the sim engine); other keywords are ignored, and the
// output is then the best the subset allows.

// jv is a JSON value as the schema gave it, object members in order (a
// schema's properties keep their order in the answer).
type jv struct {
	kind byte // '{', '[', '"', '0' (a number), 't' (a boolean), 'n' (null)
	keys []string
	vals []*jv // object members' values, or array elements
	str  string
	b    bool
}

// parseJSON reads raw, a JSON value (the request reader checked it).
func parseJSON(raw []byte) (*jv, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	return decodeJV(d, 0)
}

func decodeJV(d *json.Decoder, depth int) (*jv, error) {
	if depth > 512 {
		return nil, fmt.Errorf("nested too deep")
	}
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		v := &jv{kind: byte(t)}
		for d.More() {
			if t == '{' {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				v.keys = append(v.keys, k.(string))
			}
			e, err := decodeJV(d, depth+1)
			if err != nil {
				return nil, err
			}
			v.vals = append(v.vals, e)
		}
		_, err := d.Token()
		return v, err
	case string:
		return &jv{kind: '"', str: t}, nil
	case json.Number:
		return &jv{kind: '0', str: string(t)}, nil
	case bool:
		return &jv{kind: 't', b: t}, nil
	}
	return &jv{kind: 'n'}, nil
}

// get is the member named key of an object (the last, as encoding/json
// reads a repeated key), or nil.
func (v *jv) get(key string) *jv {
	if v == nil || v.kind != '{' {
		return nil
	}
	for i := len(v.keys) - 1; i >= 0; i-- {
		if v.keys[i] == key {
			return v.vals[i]
		}
	}
	return nil
}

func (v *jv) num() (float64, bool) {
	if v == nil || v.kind != '0' {
		return 0, false
	}
	f, err := strconv.ParseFloat(v.str, 64)
	return f, err == nil
}

// appendJSON writes v as Python's json.dumps does (", " and ": "), the way
// vLLM writes tool call arguments.
func (v *jv) appendJSON(dst []byte) []byte {
	switch v.kind {
	case '{':
		dst = append(dst, '{')
		for i, k := range v.keys {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendString(dst, k)
			dst = append(dst, ": "...)
			dst = v.vals[i].appendJSON(dst)
		}
		return append(dst, '}')
	case '[':
		dst = append(dst, '[')
		for i, e := range v.vals {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = e.appendJSON(dst)
		}
		return append(dst, ']')
	case '"':
		return appendString(dst, v.str)
	case '0':
		return append(dst, v.str...)
	case 't':
		return strconv.AppendBool(dst, v.b)
	}
	return append(dst, "null"...)
}

// schemaNode is a compiled schema: what the generator needs of it.
type schemaNode struct {
	never    bool        // the schema false: nothing validates
	ref      *schemaNode // $ref's target (its siblings are ignored)
	types    []string    // "type", in order; nil: not given
	props    []string
	propVals []*schemaNode
	required []string
	addl     *schemaNode // additionalProperties, when a schema
	minProps int

	items    *schemaNode
	noItems  bool // items: false (a closed tuple)
	prefix   []*schemaNode
	minItems int
	maxItems int // -1: none
	unique   bool

	enum  []*jv
	konst *jv
	anyOf []*schemaNode // anyOf, or oneOf
	allOf []*schemaNode

	minLen, maxLen int // maxLen -1: none
	format         string

	lo, hi         float64
	hasLo, hasHi   bool
	exLo, exHi     bool
	multipleOf     float64
	multipleOfText string

	merged *schemaNode // allOf merged, made on first use
}

// compiler turns a schema document into schemaNodes; $ref targets are
// compiled once (by pointer), so recursive schemas compile.
type compiler struct {
	root  *jv
	param string
	refs  map[string]*schemaNode
	err   error
}

// compileSchema compiles raw, the schema at param (for a 400 naming it).
func compileSchema(raw []byte, param string) (*schemaNode, *schemas.Error) {
	root, err := parseJSON(raw)
	if err != nil {
		return nil, schemas.ErrInvalidValue.At(param, param, "it is not JSON: "+err.Error())
	}
	c := &compiler{root: root, param: param, refs: map[string]*schemaNode{}}
	n := c.node(root, "")
	if c.err != nil {
		return nil, schemas.ErrInvalidValue.At(param, param, c.err.Error())
	}
	return n, nil
}

func (c *compiler) fail(at, format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("at #%s: %s", at, fmt.Sprintf(format, args...)) // at: a JSON pointer
	}
}

var knownTypes = map[string]bool{"string": true, "number": true, "integer": true, "boolean": true,
	"object": true, "array": true, "null": true}

// node compiles the schema v found at JSON pointer at.
func (c *compiler) node(v *jv, at string) *schemaNode {
	n := &schemaNode{maxItems: -1, maxLen: -1}
	c.fill(n, v, at)
	return n
}

func (c *compiler) fill(n *schemaNode, v *jv, at string) {
	n.maxItems, n.maxLen = -1, -1
	switch v.kind {
	case 't':
		n.never = !v.b
		return
	case '{':
	default:
		c.fail(at, "a schema must be an object or a boolean")
		return
	}
	if r := v.get("$ref"); r != nil {
		if r.kind != '"' {
			c.fail(at, "$ref must be a string")
			return
		}
		n.ref = c.resolve(r.str, at)
		return
	}
	switch t := v.get("type"); {
	case t == nil:
	case t.kind == '"':
		n.types = []string{t.str}
	case t.kind == '[':
		for _, e := range t.vals {
			if e.kind != '"' {
				c.fail(at, "type must be a string or an array of strings")
				return
			}
			n.types = append(n.types, e.str)
		}
	default:
		c.fail(at, "type must be a string or an array of strings")
		return
	}
	for _, t := range n.types {
		if !knownTypes[t] {
			c.fail(at, "unknown type %q", t)
			return
		}
	}
	if p := v.get("properties"); p != nil {
		if p.kind != '{' {
			c.fail(at, "properties must be an object")
			return
		}
		for i, k := range p.keys {
			n.props = append(n.props, k)
			n.propVals = append(n.propVals, c.node(p.vals[i], at+"/properties/"+escapePointer(k)))
		}
	}
	if r := v.get("required"); r != nil {
		if r.kind != '[' {
			c.fail(at, "required must be an array of strings")
			return
		}
		for _, e := range r.vals {
			if e.kind != '"' {
				c.fail(at, "required must be an array of strings")
				return
			}
			n.required = append(n.required, e.str)
		}
	}
	if a := v.get("additionalProperties"); a != nil && a.kind == '{' {
		n.addl = c.node(a, at+"/additionalProperties")
	}
	switch it := v.get("items"); {
	case it == nil:
	case it.kind == 't' && !it.b:
		n.noItems = true
	case it.kind == '[': // draft 4's tuples
		for i, e := range it.vals {
			n.prefix = append(n.prefix, c.node(e, at+"/items/"+strconv.Itoa(i)))
		}
	default:
		n.items = c.node(it, at+"/items")
	}
	if p := v.get("prefixItems"); p != nil {
		if p.kind != '[' {
			c.fail(at, "prefixItems must be an array")
			return
		}
		n.prefix = n.prefix[:0]
		for i, e := range p.vals {
			n.prefix = append(n.prefix, c.node(e, at+"/prefixItems/"+strconv.Itoa(i)))
		}
	}
	if u := v.get("uniqueItems"); u != nil && u.kind == 't' {
		n.unique = u.b
	}
	if e := v.get("enum"); e != nil {
		if e.kind != '[' || len(e.vals) == 0 {
			c.fail(at, "enum must be a non-empty array")
			return
		}
		n.enum = e.vals
	}
	n.konst = v.get("const")
	for _, kw := range []string{"anyOf", "oneOf"} {
		if a := v.get(kw); a != nil && n.anyOf == nil {
			if a.kind != '[' || len(a.vals) == 0 {
				c.fail(at, "%s must be a non-empty array", kw)
				return
			}
			for i, e := range a.vals {
				n.anyOf = append(n.anyOf, c.node(e, at+"/"+kw+"/"+strconv.Itoa(i)))
			}
		}
	}
	if a := v.get("allOf"); a != nil {
		if a.kind != '[' || len(a.vals) == 0 {
			c.fail(at, "allOf must be a non-empty array")
			return
		}
		for i, e := range a.vals {
			n.allOf = append(n.allOf, c.node(e, at+"/allOf/"+strconv.Itoa(i)))
		}
	}
	if f := v.get("format"); f != nil && f.kind == '"' {
		n.format = f.str
	}
	ints := []struct {
		key string
		dst *int
	}{{"minLength", &n.minLen}, {"maxLength", &n.maxLen}, {"minItems", &n.minItems}, {"maxItems", &n.maxItems},
		{"minProperties", &n.minProps}}
	for _, f := range ints {
		if x := v.get(f.key); x != nil {
			val, ok := x.num()
			if !ok || val < 0 || val != math.Trunc(val) {
				c.fail(at, "%s must be a non-negative integer", f.key)
				return
			}
			if val > maxMinimum && f.key[:3] == "min" {
				c.fail(at, "%s %v is more than the sim generates (%d)", f.key, val, maxMinimum)
				return
			}
			val = min(val, 1<<30)
			*f.dst = int(val)
		}
	}
	if n.maxItems >= 0 && n.minItems > n.maxItems {
		c.fail(at, "minItems %d > maxItems %d", n.minItems, n.maxItems)
		return
	}
	if n.maxLen >= 0 && n.minLen > n.maxLen {
		c.fail(at, "minLength %d > maxLength %d", n.minLen, n.maxLen)
		return
	}
	bound := func(key string, dst *float64, has *bool) bool {
		x := v.get(key)
		if x == nil {
			return true
		}
		f, ok := x.num()
		if !ok {
			if x.kind == 't' { // draft 4: exclusiveMinimum: true
				return true
			}
			c.fail(at, "%s must be a number", key)
			return false
		}
		*dst, *has = f, true
		return true
	}
	if !bound("minimum", &n.lo, &n.hasLo) || !bound("maximum", &n.hi, &n.hasHi) {
		return
	}
	var exLo, exHi float64
	var hasExLo, hasExHi bool
	if !bound("exclusiveMinimum", &exLo, &hasExLo) || !bound("exclusiveMaximum", &exHi, &hasExHi) {
		return
	}
	if hasExLo && (!n.hasLo || exLo >= n.lo) {
		n.lo, n.hasLo, n.exLo = exLo, true, true
	} else if x := v.get("exclusiveMinimum"); x != nil && x.kind == 't' && x.b {
		n.exLo = true
	}
	if hasExHi && (!n.hasHi || exHi <= n.hi) {
		n.hi, n.hasHi, n.exHi = exHi, true, true
	} else if x := v.get("exclusiveMaximum"); x != nil && x.kind == 't' && x.b {
		n.exHi = true
	}
	if n.hasLo && n.hasHi && (n.lo > n.hi || n.lo == n.hi && (n.exLo || n.exHi)) {
		c.fail(at, "no number is within its bounds")
		return
	}
	if m := v.get("multipleOf"); m != nil {
		f, ok := m.num()
		if !ok || f <= 0 {
			c.fail(at, "multipleOf must be a positive number")
			return
		}
		n.multipleOf, n.multipleOfText = f, m.str
	}
}

func escapePointer(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// resolve compiles a $ref: a JSON pointer into the same document ("#",
// "#/$defs/Name", "#/definitions/Name" as pydantic writes them).
func (c *compiler) resolve(ref, at string) *schemaNode {
	if n := c.refs[ref]; n != nil {
		return n
	}
	if ref != "#" && !strings.HasPrefix(ref, "#/") {
		c.fail(at, "$ref %q is not a local reference (#/...)", ref)
		return nil
	}
	v := c.root
	if ref != "#" {
		for _, tok := range strings.Split(ref[2:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			switch v.kind {
			case '{':
				v = v.get(tok)
			case '[':
				i, err := strconv.Atoi(tok)
				if err != nil || i < 0 || i >= len(v.vals) {
					v = nil
				} else {
					v = v.vals[i]
				}
			default:
				v = nil
			}
			if v == nil {
				c.fail(at, "$ref %q does not resolve", ref)
				return nil
			}
		}
	}
	n := &schemaNode{}
	c.refs[ref] = n // before filling it: a recursive schema finds it
	c.fill(n, v, ref[1:])
	return n
}

// deref follows $refs (a chain of them ends: a loop of refs alone is cut).
func (n *schemaNode) deref() *schemaNode {
	for range 64 {
		if n == nil || n.ref == nil {
			return n
		}
		n = n.ref
	}
	return &schemaNode{never: true}
}

// mergedAllOf is n with its allOf branches merged into it: properties and
// required joined, the first type, enum, items and format kept, the
// tightest bounds.
func (n *schemaNode) mergedAllOf() *schemaNode {
	if n.merged != nil {
		return n.merged
	}
	m := *n
	m.allOf, m.merged = nil, nil
	n.merged = &m // a branch that refers back to n sees this
	for _, b := range n.allOf {
		b = b.deref()
		if b == nil {
			continue
		}
		if len(b.allOf) > 0 {
			b = b.mergedAllOf()
		}
		m.never = m.never || b.never
		if m.types == nil {
			m.types = b.types
		}
		for i, p := range b.props {
			if !contains(m.props, p) {
				m.props = append(m.props, p)
				m.propVals = append(m.propVals, b.propVals[i])
			}
		}
		for _, r := range b.required {
			if !contains(m.required, r) {
				m.required = append(m.required, r)
			}
		}
		if m.addl == nil {
			m.addl = b.addl
		}
		m.minProps = max(m.minProps, b.minProps)
		if m.items == nil && m.prefix == nil {
			m.items, m.prefix, m.noItems = b.items, b.prefix, b.noItems
		}
		m.minItems = max(m.minItems, b.minItems)
		if b.maxItems >= 0 && (m.maxItems < 0 || b.maxItems < m.maxItems) {
			m.maxItems = b.maxItems
		}
		m.unique = m.unique || b.unique
		if m.enum == nil {
			m.enum = b.enum
		}
		if m.konst == nil {
			m.konst = b.konst
		}
		if m.anyOf == nil {
			m.anyOf = b.anyOf
		}
		m.minLen = max(m.minLen, b.minLen)
		if b.maxLen >= 0 && (m.maxLen < 0 || b.maxLen < m.maxLen) {
			m.maxLen = b.maxLen
		}
		if m.format == "" {
			m.format = b.format
		}
		if b.hasLo && (!m.hasLo || b.lo > m.lo) {
			m.lo, m.hasLo, m.exLo = b.lo, true, b.exLo
		}
		if b.hasHi && (!m.hasHi || b.hi < m.hi) {
			m.hi, m.hasHi, m.exHi = b.hi, true, b.exHi
		}
		if m.multipleOf == 0 {
			m.multipleOf, m.multipleOfText = b.multipleOf, b.multipleOfText
		}
	}
	return &m
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Beyond shallowDepth, or once it has written sizeBudget bytes, the
// generator makes the smallest values it can (no optional property, the
// fewest items, a non-recursive anyOf branch), so that a recursive schema
// ends and an answer stays a few hundred tokens; beyond maxDepth it writes
// null.
const (
	shallowDepth = 6
	maxDepth     = 24
	sizeBudget   = 1024
)

// maxMinimum bounds minItems, minLength and minProperties: the whole answer
// is made when the request arrives.
const maxMinimum = 4096

// maxAnswerBytes bounds what the generator writes: minimums multiply
// through nesting (three nested arrays of minItems 4096 are 7·10^10
// values), and no answer longer than a context window (MaxModelLen
// tokens) is ever delivered; past the bound it stops, as max_tokens would
// cut the answer anyway.
const maxAnswerBytes = 256 << 10

// jsonGen writes JSON valid against schemas, from its own seed.
type jsonGen struct {
	rng    uint64
	strict bool // every property, not only the required ones (OpenAI's strict mode)
	dst    []byte
}

func (g *jsonGen) rand() uint64 {
	g.rng ^= g.rng >> 12
	g.rng ^= g.rng << 25
	g.rng ^= g.rng >> 27
	return g.rng * 2685821657736338717
}

// intn is a draw in [0, n).
func (g *jsonGen) intn(n int) int {
	if n <= 1 {
		return 0
	}
	return int((g.rand() >> 11) % uint64(n))
}

func (g *jsonGen) word() string {
	return words[g.intn(len(words))][1:]
}

// generateJSON is JSON valid against n, drawn from seed.
func generateJSON(n *schemaNode, seed uint64, strict bool) []byte {
	g := &jsonGen{rng: schemas.Mix64(seed^0x6a09e667f3bcc909) | 1, strict: strict}
	g.value(n, 0)
	return g.dst
}

// shallow reports whether values at depth are to be the smallest.
func (g *jsonGen) shallow(depth int) bool { return depth >= shallowDepth || len(g.dst) > sizeBudget }

func (g *jsonGen) value(n *schemaNode, depth int) {
	if len(g.dst) > maxAnswerBytes {
		return
	}
	n = n.deref()
	if depth > maxDepth || n == nil && depth > shallowDepth {
		g.dst = append(g.dst, "null"...)
		return
	}
	if n == nil { // no schema: anything
		g.dst = appendString(g.dst, g.sentence(1+g.intn(4)))
		return
	}
	if len(n.allOf) > 0 {
		n = n.mergedAllOf()
	}
	switch {
	case n.never:
		g.dst = append(g.dst, "null"...) // nothing is valid; null is as good as anything
		return
	case n.konst != nil:
		g.dst = n.konst.appendJSON(g.dst)
		return
	case n.enum != nil:
		g.dst = n.enum[g.intn(len(n.enum))].appendJSON(g.dst)
		return
	case len(n.anyOf) > 0:
		g.value(n.branch(g.shallow(depth)), depth)
		return
	}
	switch n.typ() {
	case "object":
		g.object(n, depth)
	case "array":
		g.array(n, depth)
	case "integer":
		g.integer(n)
	case "number":
		g.number(n)
	case "boolean":
		g.dst = strconv.AppendBool(g.dst, g.rand()&(1<<20) != 0)
	case "null":
		g.dst = append(g.dst, "null"...)
	default:
		g.str(n)
	}
}

// branch is the anyOf branch to generate: the first, or deep in a recursive
// schema the first that does not recurse (null, a scalar).
func (n *schemaNode) branch(shallow bool) *schemaNode {
	if !shallow {
		return n.anyOf[0]
	}
	for _, b := range n.anyOf {
		if d := b.deref(); d != nil && d.ref == nil && d.props == nil && d.items == nil && d.anyOf == nil && d.allOf == nil {
			return b
		}
	}
	return n.anyOf[0]
}

// typ is the type to generate: the first non-null one given ("null" if
// that is all), else the one its keywords imply.
func (n *schemaNode) typ() string {
	for _, t := range n.types {
		if t != "null" {
			return t
		}
	}
	switch {
	case len(n.types) > 0:
		return "null"
	case n.props != nil || n.required != nil || n.addl != nil || n.minProps > 0:
		return "object"
	case n.items != nil || n.prefix != nil || n.minItems > 0 || n.maxItems >= 0:
		return "array"
	case n.hasLo || n.hasHi || n.multipleOf > 0:
		return "number"
	}
	return "string"
}

func (g *jsonGen) object(n *schemaNode, depth int) {
	shallow := g.shallow(depth)
	type member struct {
		name string
		s    *schemaNode
	}
	var ms []member
	for i, p := range n.props {
		if contains(n.required, p) || g.strict && !shallow {
			ms = append(ms, member{p, n.propVals[i]})
		}
	}
	for i, p := range n.props { // minProperties: optional ones too
		if len(ms) >= n.minProps {
			break
		}
		if !contains(n.required, p) && !(g.strict && !shallow) {
			ms = append(ms, member{p, n.propVals[i]})
		}
	}
	for _, r := range n.required { // required but not described
		if !contains(n.props, r) {
			ms = append(ms, member{r, n.addl})
		}
	}
	for i := 0; len(ms) < n.minProps; i++ {
		ms = append(ms, member{"field_" + strconv.Itoa(i), n.addl})
	}
	g.dst = append(g.dst, '{')
	for i, m := range ms {
		if len(g.dst) > maxAnswerBytes {
			break
		}
		if i > 0 {
			g.dst = append(g.dst, ", "...)
		}
		g.dst = appendString(g.dst, m.name)
		g.dst = append(g.dst, ": "...)
		g.value(m.s, depth+1)
	}
	g.dst = append(g.dst, '}')
}

func (g *jsonGen) array(n *schemaNode, depth int) {
	count := n.minItems
	if !g.shallow(depth) {
		lo := n.minItems
		if lo == 0 && n.maxItems != 0 {
			lo = 1
		}
		hi := lo + 2
		if n.maxItems >= 0 {
			hi = min(hi, n.maxItems)
		}
		count = lo + g.intn(hi-lo+1)
	}
	if len(n.prefix) > 0 {
		count = max(count, len(n.prefix))
		if n.maxItems >= 0 {
			count = min(count, n.maxItems)
		}
	}
	if n.noItems {
		count = min(count, len(n.prefix))
	}
	g.dst = append(g.dst, '[')
	var seen []string // uniqueItems: the items so far, as written
	for i := 0; i < count && len(g.dst) <= maxAnswerBytes; i++ {
		s := n.items
		if i < len(n.prefix) {
			s = n.prefix[i]
		}
		mark := len(g.dst)
		if i > 0 {
			g.dst = append(g.dst, ", "...)
		}
		start := len(g.dst)
		g.value(s, depth+1)
		if n.unique {
			tries := 0
			for contains(seen, string(g.dst[start:])) && tries < 8 {
				g.dst = g.dst[:start]
				g.value(s, depth+1)
				tries++
			}
			if contains(seen, string(g.dst[start:])) { // cannot find another: stop here
				g.dst = g.dst[:mark]
				break
			}
			seen = append(seen, string(g.dst[start:]))
		}
	}
	g.dst = append(g.dst, ']')
}

// bounds is the closed range to draw a number from: the schema's, else 0 to
// 100 (or 100 wide from the one bound given).
func (n *schemaNode) bounds() (lo, hi float64) {
	lo, hi = n.lo, n.hi
	switch {
	case n.hasLo && n.hasHi:
	case n.hasLo:
		hi = lo + 100
	case n.hasHi:
		lo = hi - 100
	default:
		lo, hi = 0, 100
	}
	if hi-lo > 1e12 {
		hi = lo + 1e12
	}
	return lo, hi
}

func (g *jsonGen) integer(n *schemaNode) {
	flo, fhi := n.bounds()
	lo, hi := math.Ceil(flo), math.Floor(fhi)
	if n.exLo && lo == flo {
		lo++
	}
	if n.exHi && hi == fhi {
		hi--
	}
	if m := n.multipleOf; m > 0 && m == math.Trunc(m) {
		klo, khi := math.Ceil(lo/m), math.Floor(hi/m)
		k := klo
		if khi > klo {
			k += float64(g.intn(int(min(khi-klo, 1e9)) + 1))
		}
		g.dst = strconv.AppendInt(g.dst, int64(k*m), 10)
		return
	}
	v := lo
	if hi > lo {
		v += float64(g.intn(int(min(hi-lo, 1e9)) + 1))
	}
	g.dst = strconv.AppendInt(g.dst, int64(v), 10)
}

func (g *jsonGen) number(n *schemaNode) {
	lo, hi := n.bounds()
	if m := n.multipleOf; m > 0 {
		klo, khi := math.Ceil(lo/m), math.Floor(hi/m)
		if n.exLo && klo*m == lo {
			klo++
		}
		if n.exHi && khi*m == hi {
			khi--
		}
		k := klo
		if khi > klo {
			k += float64(g.intn(int(min(khi-klo, 1e9)) + 1))
		}
		decimals := 0
		if i := strings.IndexByte(n.multipleOfText, '.'); i >= 0 && !strings.ContainsAny(n.multipleOfText, "eE") {
			decimals = len(n.multipleOfText) - i - 1
		}
		g.dst = strconv.AppendFloat(g.dst, k*m, 'f', decimals, 64)
		return
	}
	// Hundredths within the bounds, away from an exclusive one.
	clo, chi := math.Ceil(lo*100), math.Floor(hi*100)
	if n.exLo && clo == lo*100 {
		clo++
	}
	if n.exHi && chi == hi*100 {
		chi--
	}
	v := clo
	if chi > clo {
		v += float64(g.intn(int(min(chi-clo, 1e9)) + 1))
	}
	g.dst = strconv.AppendFloat(g.dst, v/100, 'f', -1, 64)
}

// sentence is k of the sim's words.
func (g *jsonGen) sentence(k int) string {
	var b strings.Builder
	for i := range k {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(g.word())
	}
	return b.String()
}

func (g *jsonGen) str(n *schemaNode) {
	var s string
	switch n.format {
	case "date-time":
		s = fmt.Sprintf("2024-%02d-%02dT%02d:%02d:00Z", 1+g.intn(12), 1+g.intn(28), g.intn(24), g.intn(60))
	case "date":
		s = fmt.Sprintf("2024-%02d-%02d", 1+g.intn(12), 1+g.intn(28))
	case "time":
		s = fmt.Sprintf("%02d:%02d:00Z", g.intn(24), g.intn(60))
	case "email":
		s = g.word() + "@example.com"
	case "uri", "url", "iri":
		s = "https://example.com/" + g.word()
	case "hostname":
		s = g.word() + ".example.com"
	case "ipv4":
		s = fmt.Sprintf("192.0.2.%d", 1+g.intn(254))
	case "ipv6":
		s = fmt.Sprintf("2001:db8::%x", 1+g.intn(0xfffe))
	case "uuid":
		a, b := g.rand(), g.rand()
		s = fmt.Sprintf("%08x-%04x-4%03x-%x%03x-%012x", a>>32, a>>16&0xffff, a&0xfff, 8+b>>62, b>>48&0xfff, b&0xffffffffffff)
	case "duration":
		s = fmt.Sprintf("PT%dM", 1+g.intn(59))
	default:
		s = g.sentence(1 + g.intn(3))
		for utf8.RuneCountInString(s) < n.minLen {
			s += " " + g.word()
		}
	}
	if n.maxLen >= 0 && utf8.RuneCountInString(s) > n.maxLen {
		s = strings.TrimRight(string([]rune(s)[:n.maxLen]), " ")
		for utf8.RuneCountInString(s) < n.minLen { // trimmed below minLength
			s += "x"
		}
	}
	g.dst = appendString(g.dst, s)
}
