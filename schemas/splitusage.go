package schemas

// SplitUsage splits a stream chunk that carries both choices and a usage
// object into OpenAI's two: the chunk with "usage":null, and the usage
// chunk, the same with "choices":[]. Some servers (transformers serve) put
// usage on the last chunk of choices, and send it whether or not the client
// asked; clients written for OpenAI read usage from a chunk without choices
// and choices from chunks without usage. ok is false, and nothing is
// allocated, unless d is such a chunk.
func SplitUsage(d []byte) (choices, usage []byte, ok bool) {
	s := scanner{b: d}
	cs, ce, us, ue := -1, -1, -1, -1
	if !s.object(func(key []byte) bool {
		s.ws()
		start := s.i
		v, ok := s.value(1)
		if !ok {
			return false
		}
		switch {
		case keyIs(key, "choices"):
			if v[0] == '[' && !isEmptyArray(v) {
				cs, ce = start, s.i
			}
		case keyIs(key, "usage"):
			if v[0] == '{' {
				us, ue = start, s.i
			}
		}
		return true
	}) || !s.end() || cs < 0 || us < 0 {
		return nil, nil, false
	}
	return splice(d, us, ue, "null"), splice(d, cs, ce, "[]"), true
}

func isEmptyArray(v []byte) bool {
	s := scanner{b: v[1:]}
	return s.peek() == ']'
}

// splice is d with d[i:j] replaced by with, in a new slice.
func splice(d []byte, i, j int, with string) []byte {
	out := make([]byte, 0, len(d)-(j-i)+len(with))
	return append(append(append(out, d[:i]...), with...), d[j:]...)
}
