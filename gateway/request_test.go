package gateway

import (
	"testing"

	"github.com/tokenbus/tokenbus/schemas"
)

// The reading itself is schemas.ReadRequest's (tested and fuzzed there);
// the gateway's one edit of a body is inserting the TorchServe path's model.
func TestPayloadInsertsPathModel(t *testing.T) {
	for body, want := range map[string]string{
		`{"prompt":"p"}`:          `{"model":"a/b","prompt":"p"}`,
		" \n{ \"prompt\":\"p\" }": " \n{\"model\":\"a/b\", \"prompt\":\"p\" }",
	} {
		r, err := schemas.ReadRequest(schemas.KindCompletion, []byte(body), "a/b")
		if err != nil {
			t.Fatal(err)
		}
		if got := string(payload(r)); got != want {
			t.Errorf("payload %q, want %q", got, want)
		}
		// what the engine reads of the edited body is what the gateway read
		again, err := schemas.ReadRequest(schemas.KindCompletion, []byte(want), "")
		if err != nil || again.Model != r.Model {
			t.Errorf("%s read back as %v, %v", want, again, err)
		}
	}
	body := []byte(`{"prompt":"p","model":"x"}`)
	r, _ := schemas.ReadRequest(schemas.KindCompletion, body, "a/b")
	out := payload(r)
	if string(out) != string(body) || &out[0] == &body[0] {
		t.Error("payload must be an exact copy")
	}
}
