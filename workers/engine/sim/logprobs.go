package sim

import (
	"math"
	"strconv"

	"github.com/tokenbus/tokenbus/schemas"
)

// Logprobs: chat's logprobs: true (with top_logprobs: k) and completions'
// logprobs: k give every generated token a log probability and its k best
// alternatives, in OpenAI's shapes, streamed with the chunk that carries the
// token. The values are made up but deterministic (a hash of the sequence's
// seed, the token's position and text): the token drawn is always the most
// likely, its alternatives are other words of the sim's, each less likely.

// maxLogprobs is vLLM's default --max-logprobs.
const maxLogprobs = 20

func checkLogprobs(b *schemas.Request, chat bool) *schemas.Error {
	param := "top_logprobs"
	if !chat {
		param = "logprobs"
	}
	switch {
	case b.TopLogprobs < 0:
		return schemas.ErrBelowMin.At(param, param, 0, b.TopLogprobs)
	case b.TopLogprobs > maxLogprobs:
		return schemas.ErrAboveMax.At(param, param, maxLogprobs, b.TopLogprobs)
	case chat && b.TopLogprobs > 0 && !b.Logprobs:
		return schemas.ErrInvalidValue.At(param, param, "when using `top_logprobs`, `logprobs` must be set to true")
	}
	return nil
}

// tokenLogprob is the log probability of the i-th most likely token (0:
// the one drawn) at a position.
func tokenLogprob(h uint64, i int) float64 {
	lp := -float64(1+h%2500) / 10000
	for j := 1; j <= i; j++ {
		lp -= 0.5 + float64(schemas.Mix64(h+uint64(j))%1000)/1000
	}
	return math.Round(lp*10000) / 10000
}

// alternative is the i-th most likely token (i ≥ 1) where tok was drawn:
// the i-th word of the sim's after a start drawn from h, tok skipped (the
// words are distinct, so the alternatives are too).
func alternative(h uint64, tok string, i int) string {
	start := int((h >> 20) % uint64(len(words)))
	for j := 1; ; j++ {
		w := words[(start+j)%len(words)]
		if w == tok {
			continue
		}
		if i--; i == 0 {
			return w
		}
	}
}

func appendBytes(dst []byte, s string) []byte {
	dst = append(dst, '[')
	for i := 0; i < len(s); i++ {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(s[i]), 10)
	}
	return append(dst, ']')
}

func appendLogprob(dst []byte, lp float64) []byte {
	return strconv.AppendFloat(dst, lp, 'f', -1, 64)
}

// appendLogprobs writes the logprobs of s's tokens not yet reported, or
// null, and marks them reported.
func (r *request) appendLogprobs(dst []byte, s *seq) []byte {
	if !r.logprobs || len(s.lpToks) == 0 {
		return append(dst, "null"...)
	}
	hashes := make([]uint64, len(s.lpToks))
	for i, tok := range s.lpToks {
		hashes[i] = schemas.Mix64(s.lpSeed ^ uint64(s.lpPos+i)*0x9e3779b97f4a7c15 ^ schemas.StringHash(tok))
	}
	if r.chat {
		dst = append(dst, `{"content":[`...)
		for i, tok := range s.lpToks {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"token":`...)
			dst = appendString(dst, tok)
			dst = append(dst, `,"logprob":`...)
			dst = appendLogprob(dst, tokenLogprob(hashes[i], 0))
			dst = append(dst, `,"bytes":`...)
			dst = appendBytes(dst, tok)
			dst = append(dst, `,"top_logprobs":[`...)
			for k := 0; k < r.topLogprobs; k++ {
				alt := tok
				if k > 0 {
					alt = alternative(hashes[i], tok, k)
					dst = append(dst, ',')
				}
				dst = append(dst, `{"token":`...)
				dst = appendString(dst, alt)
				dst = append(dst, `,"logprob":`...)
				dst = appendLogprob(dst, tokenLogprob(hashes[i], k))
				dst = append(dst, `,"bytes":`...)
				dst = appendBytes(dst, alt)
				dst = append(dst, '}')
			}
			dst = append(dst, "]}"...)
		}
		dst = append(dst, "]}"...)
	} else {
		dst = append(dst, `{"text_offset":[`...)
		off := s.lpOffset
		for i, tok := range s.lpToks {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(off), 10)
			off += len(tok)
		}
		dst = append(dst, `],"token_logprobs":[`...)
		for i := range s.lpToks {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendLogprob(dst, tokenLogprob(hashes[i], 0))
		}
		dst = append(dst, `],"tokens":[`...)
		for i, tok := range s.lpToks {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, tok)
		}
		dst = append(dst, `],"top_logprobs":[`...)
		for i, tok := range s.lpToks {
			if i > 0 {
				dst = append(dst, ',')
			}
			// vLLM's: the token drawn and the k best, as a map (the drawn one is the best).
			dst = append(dst, '{')
			for k := 0; k < max(r.topLogprobs, 1); k++ {
				alt := tok
				if k > 0 {
					alt = alternative(hashes[i], tok, k)
					dst = append(dst, ',')
				}
				dst = appendString(dst, alt)
				dst = append(dst, ':')
				dst = appendLogprob(dst, tokenLogprob(hashes[i], k))
			}
			dst = append(dst, '}')
		}
		dst = append(dst, "]}"...)
		s.lpOffset = off
	}
	s.lpPos += len(s.lpToks)
	s.lpToks = s.lpToks[:0]
	return dst
}
