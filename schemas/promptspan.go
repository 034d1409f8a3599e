package schemas

// PromptSpan returns the raw JSON text of a request body's "messages" value
// (chat), else its "prompt" value (completions), aliasing body; nil when the
// body has neither or is not a JSON object. It reads only the top level and
// skips the rest without allocating: a dispatcher uses it to key prefix-aware
// routing on what the engine will prefill, without parsing the request.
// Requests from one client serialise a conversation's earlier messages the
// same way each turn, so a shared system prompt or history is a shared prefix
// of this text.
func PromptSpan(body []byte) []byte {
	s := scanner{b: body}
	var messages, prompt []byte
	ok := s.object(func(key []byte) bool {
		switch {
		case messages == nil && keyIs(key, "messages"):
			v, ok := s.value(0)
			messages = v
			return ok
		case prompt == nil && keyIs(key, "prompt"):
			v, ok := s.value(0)
			prompt = v
			return ok
		}
		return s.skip(0)
	})
	switch {
	case !ok:
		return nil
	case messages != nil:
		return messages
	}
	return prompt
}
