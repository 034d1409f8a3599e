package schemas

// Reading response_format, tools and tool_choice: nested objects whose
// members' JSON types the reader checks (a wrong type or a repeated member
// is a 400 naming it, as for top-level fields) and whose schemas it keeps
// raw, aliasing the body, for the engine. Parameter names are made only for
// errors.

// members reads the object at the scanner (depth containers deep) and calls
// read(i) for each member named names[i], which must consume its value;
// other members are skipped. path(member) names a member in errors,
// path("") the object itself. A repeated member is a duplicate_parameter.
func (r *reader) members(path func(string) string, depth int, names []string, read func(i int) bool) bool {
	var seen uint32
	return r.s.object(func(key []byte) bool {
		for i, n := range names {
			if !keyIs(key, n) {
				continue
			}
			if seen&(1<<i) != 0 {
				r.fail(ErrDuplicateKey.At(path(n), n, "'"+path("")+"'"))
				return r.s.skip(depth + 1)
			}
			seen |= 1 << i
			return read(i)
		}
		return r.s.skip(depth + 1)
	})
}

// nestedStr reads a string or null member value (depth: the value's).
func (r *reader) nestedStr(param func() string, depth int, dst *string) bool {
	switch r.s.peek() {
	case 'n':
		if r.s.null() {
			return true
		}
	case '"':
		raw, ok := r.s.rawString()
		*dst = intern(raw)
		return ok
	}
	return r.mismatch(param(), "a string", depth)
}

// nestedBool reads a boolean or null member value.
func (r *reader) nestedBool(param func() string, depth int, dst *bool) bool {
	switch r.s.peek() {
	case 't', 'f', 'n':
		if r.s.null() {
			return true
		}
		if r.s.peek() == 't' && r.s.lit("true") {
			*dst = true
			return true
		}
		if r.s.peek() == 'f' && r.s.lit("false") {
			*dst = false
			return true
		}
	}
	return r.mismatch(param(), "a boolean", depth)
}

// rawObject keeps an object member value as it is (a JSON Schema), or
// nothing for null.
func (r *reader) rawObject(param func() string, depth int, dst *[]byte) bool {
	switch r.s.peek() {
	case 'n':
		if r.s.null() {
			return true
		}
	case '{':
		start := r.s.i
		if !r.s.skip(depth) {
			return false
		}
		*dst = r.s.b[start:r.s.i]
		return true
	}
	return r.mismatch(param(), "an object", depth)
}

// intern is a string's value, without allocating for the usual values of
// the members read here.
func intern(raw []byte) string {
	switch string(raw) {
	case "function":
		return "function"
	case "text":
		return "text"
	case "json_object":
		return "json_object"
	case "json_schema":
		return "json_schema"
	case "none":
		return "none"
	case "auto":
		return "auto"
	case "required":
		return "required"
	}
	return jsonString(raw)
}

func memberParam(param, name string) string {
	if name == "" {
		return param
	}
	return param + "." + name
}

// responseFormat reads {"type", "json_schema": {"name", "schema", "strict"}}.
func (r *reader) responseFormat(dst *ResponseFormat) bool {
	const param = "response_format"
	if r.null(fResponseFormat) {
		return true
	}
	if r.s.peek() != '{' {
		return r.mismatch(param, "an object", 1)
	}
	at := func(m string) string { return memberParam(param, m) }
	return r.members(at, 1, []string{"type", "json_schema"}, func(i int) bool {
		if i == 0 {
			return r.nestedStr(func() string { return at("type") }, 2, &dst.Type)
		}
		const js = param + ".json_schema"
		if r.s.null() {
			return true
		}
		if r.s.peek() != '{' {
			return r.mismatch(js, "an object", 2)
		}
		dst.HasJSONSchema = true
		jsAt := func(m string) string { return memberParam(js, m) }
		return r.members(jsAt, 2, []string{"name", "schema", "strict"}, func(i int) bool {
			switch i {
			case 0:
				return r.nestedStr(func() string { return jsAt("name") }, 3, &dst.Name)
			case 1:
				return r.rawObject(func() string { return jsAt("schema") }, 3, &dst.Schema)
			}
			return r.nestedBool(func() string { return jsAt("strict") }, 3, &dst.Strict)
		})
	})
}

// tools reads [{"type", "function": {"name", "description", "parameters", "strict"}}].
func (r *reader) tools(dst *[]Tool) bool {
	if r.null(fTools) {
		return true
	}
	if r.s.peek() != '[' {
		return r.mismatch("tools", "an array of objects", 1)
	}
	out := []Tool{}
	i := 0
	ok := r.s.array(func() bool {
		defer func() { i++ }()
		at := func(m string) string { return indexed("tools", i, m) }
		if r.s.peek() != '{' {
			return r.mismatch(at(""), "an object", 2)
		}
		var t Tool
		ok := r.members(at, 2, []string{"type", "function"}, func(k int) bool {
			if k == 0 {
				return r.nestedStr(func() string { return at("type") }, 3, &t.Type)
			}
			if r.s.null() {
				return true
			}
			if r.s.peek() != '{' {
				return r.mismatch(at("function"), "an object", 3)
			}
			t.HasFunction = true
			fnAt := func(m string) string { return memberParam(at("function"), m) }
			return r.members(fnAt, 3, []string{"name", "description", "parameters", "strict"}, func(k int) bool {
				switch k {
				case 0:
					return r.nestedStr(func() string { return fnAt("name") }, 4, &t.Name)
				case 1:
					return r.nestedStr(func() string { return fnAt("description") }, 4, &t.Description)
				case 2:
					return r.rawObject(func() string { return fnAt("parameters") }, 4, &t.Parameters)
				}
				return r.nestedBool(func() string { return fnAt("strict") }, 4, &t.Strict)
			})
		})
		out = append(out, t)
		return ok
	})
	if ok {
		*dst = out
	}
	return ok
}

// toolChoice reads "none" | "auto" | "required" | {"type", "function": {"name"}}.
func (r *reader) toolChoice(dst *ToolChoice) bool {
	const param = "tool_choice"
	switch r.s.peek() {
	case 'n':
		if r.null(fToolChoice) {
			return true
		}
	case '"':
		raw, ok := r.s.rawString()
		dst.Mode = intern(raw)
		return ok
	case '{':
		at := func(m string) string { return memberParam(param, m) }
		return r.members(at, 1, []string{"type", "function"}, func(i int) bool {
			if i == 0 {
				return r.nestedStr(func() string { return at("type") }, 2, &dst.Mode)
			}
			if r.s.null() {
				return true
			}
			if r.s.peek() != '{' {
				return r.mismatch(at("function"), "an object", 2)
			}
			fnAt := func(m string) string { return memberParam(param+".function", m) }
			return r.members(fnAt, 2, []string{"name"}, func(int) bool {
				return r.nestedStr(func() string { return fnAt("name") }, 3, &dst.Name)
			})
		})
	}
	return r.mismatch(param, "a string or an object", 1)
}
