package bench

import (
	"strconv"

	"github.com/tokenbus/tokenbus/schemas"
)

// Chunks are read with schemas.ReadChunk, the one JSON reader; what the
// benchmark adds is the check that a stream is well formed.

// streamCheck verifies the chunks of one response (n = 1: one choice, index 0).
type streamCheck struct {
	object   string // expected "object"
	id       string
	finished bool
}

// check verifies one parsed chunk and returns the failure kind and detail, or "".
func (sc *streamCheck) check(p *schemas.Chunk) (kind, msg string) {
	if p.Error != nil {
		if string(p.Error) == "null" {
			return "protocol_error_key", `chunk has "error": null`
		}
		return "stream_error", errorMessage(append(append([]byte(`{"error":`), p.Error...), '}'))
	}
	if len(p.ID) == 0 {
		return "protocol_missing_id", "chunk without id"
	}
	if sc.id == "" {
		sc.id = schemas.String(p.ID)
	} else if string(p.ID) != sc.id {
		if id := schemas.String(p.ID); id != sc.id {
			return "protocol_id_changed", "id " + strconv.Quote(id) + " after " + strconv.Quote(sc.id)
		}
	}
	if string(p.Object) != sc.object {
		if obj := schemas.String(p.Object); obj != sc.object {
			return "protocol_object", "object " + strconv.Quote(obj) + ", want " + strconv.Quote(sc.object)
		}
	}
	for i := range p.Choices {
		ch := &p.Choices[i]
		if !ch.HasIndex {
			return "protocol_choice_index", "choice without index"
		}
		if ch.Index != 0 {
			return "protocol_choice_index", "choice index " + strconv.Itoa(ch.Index) + " with n=1"
		}
		if sc.finished && (len(ch.Content) > 0 || ch.HasFinish) {
			return "protocol_chunk_after_finish", "choice continues after its finish_reason"
		}
		if ch.HasFinish {
			if len(ch.Finish) == 0 {
				return "protocol_finish_reason", "empty finish_reason"
			}
			sc.finished = true
		}
	}
	return "", ""
}
