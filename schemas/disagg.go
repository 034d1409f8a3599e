package schemas

// Prefill/decode disaggregation (docs/disaggregation.md) speaks vLLM's
// KV-transfer handshake, the one its disaggregated-serving proxy uses with
// the NixlConnector: the prefill instance gets the client's request with
// PrefillTransferParams, "stream": false, "max_tokens": 1 (and
// "max_completion_tokens": 1 when the request had it) and no
// "stream_options"; its answer's "kv_transfer_params" go, untouched, with the
// client's original request to the decode instance.

// PrefillTransferParams is what the prefill instance is sent: it is to keep
// the prompt's KV blocks for a remote decode, and say where they are.
const PrefillTransferParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,` +
	`"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// PrefillBody is the prefill instance's request for a chat or completion
// body: the body with the members above replaced, every other member as it
// was. The body must be one JSON object (ReadRequest read it).
func PrefillBody(body []byte) ([]byte, bool) {
	hasMCT := false
	out, ok := rewriteObject(body, func(key []byte) bool {
		switch {
		case keyIs(key, "max_completion_tokens"):
			hasMCT = true
			return false
		case keyIs(key, "kv_transfer_params"), keyIs(key, "stream"), keyIs(key, "max_tokens"),
			keyIs(key, "stream_options"):
			return false
		}
		return true
	}, func(b []byte) []byte {
		b = append(b, `"kv_transfer_params":`...)
		b = append(b, PrefillTransferParams...)
		b = append(b, `,"stream":false,"max_tokens":1`...)
		if hasMCT {
			b = append(b, `,"max_completion_tokens":1`...)
		}
		return b
	})
	return out, ok
}

// DecodeBody is the decode instance's request: the client's body with
// "kv_transfer_params" set to params (a JSON object, the prefill answer's,
// passed on byte for byte).
func DecodeBody(body, params []byte) ([]byte, bool) {
	return rewriteObject(body, func(key []byte) bool { return !keyIs(key, "kv_transfer_params") },
		func(b []byte) []byte {
			b = append(b, `"kv_transfer_params":`...)
			return append(b, params...)
		})
}

// WithoutTransferParams is body without "kv_transfer_params": an aggregated
// run of a request whose transfer failed.
func WithoutTransferParams(body []byte) ([]byte, bool) {
	return rewriteObject(body, func(key []byte) bool { return !keyIs(key, "kv_transfer_params") }, nil)
}

// TransferParamsOf returns the "kv_transfer_params" object of an engine's
// answer (a chat or completion response), or nil when it has none (an
// engine without a KV connector answers without it, or with null).
func TransferParamsOf(response []byte) []byte {
	s := scanner{b: response}
	s.ws()
	var params []byte
	ok := s.object(func(key []byte) bool {
		if !keyIs(key, "kv_transfer_params") || s.peek() != '{' {
			return s.skip(1)
		}
		v, ok := s.value(1)
		params = v
		return ok
	})
	if !ok {
		return nil
	}
	return params
}

// TransferParamString reads a string member of transfer params (for logs
// and traces: remote_engine_id, remote_host), "" when absent or not a string.
func TransferParamString(params []byte, name string) string {
	s := scanner{b: params}
	s.ws()
	out := ""
	s.object(func(key []byte) bool {
		if !keyIs(key, name) {
			return s.skip(2)
		}
		switch s.peek() {
		case '"':
			raw, ok := s.rawString()
			out = jsonString(raw)
			return ok
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			n, ok := s.number()
			out = string(n)
			return ok
		}
		return s.skip(2)
	})
	return out
}

// rewriteObject copies the top-level members of the JSON object body for
// which keep returns true, then the members add appends (with add nil:
// none), as one object. False if body is not an object.
func rewriteObject(body []byte, keep func(key []byte) bool, add func([]byte) []byte) ([]byte, bool) {
	out := make([]byte, 0, len(body)+len(PrefillTransferParams)+64)
	out = append(out, '{')
	n := 0
	s := scanner{b: body}
	s.ws()
	ok := s.object(func(key []byte) bool {
		start := s.i
		if !s.skip(1) {
			return false
		}
		if keep(key) {
			if n > 0 {
				out = append(out, ',')
			}
			out = append(out, '"')
			out = append(out, key...)
			out = append(out, '"', ':')
			out = append(out, body[start:s.i]...)
			n++
		}
		return true
	})
	s.ws()
	if !ok || !s.end() {
		return nil, false
	}
	if add != nil {
		if n > 0 {
			out = append(out, ',')
		}
		out = add(out)
	}
	return append(out, '}'), true
}
