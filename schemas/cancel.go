package schemas

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"strings"
)

// A cancel (CancelPrefix + <worker-id>, QueueCancel) names a request and
// proves it comes from the request's owner: its body is
//
//	<request-id> SP <cancel-token>
//
// where the token is the request's HdrCancelToken, which only the requester
// learns (from its queued and accepted frames, on its own inbox). A cancel
// with a wrong or missing token is ignored, so knowing a request id is not
// enough to cancel someone else's request.

// CancelTokenBytes is the entropy of a cancel token: 128 bits.
const CancelTokenBytes = 16

// NewCancelToken makes a cancel token: 128 random bits, hex.
func NewCancelToken() string {
	var b [CancelTokenBytes]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// CancelBody is the body of a cancel of request id with token.
func CancelBody(id, token string) []byte {
	b := make([]byte, 0, len(id)+1+len(token))
	b = append(b, id...)
	b = append(b, ' ')
	return append(b, token...)
}

// ParseCancel splits a cancel body into the request id and the token ("" when
// the body has none).
func ParseCancel(body []byte) (id, token string) {
	id, token, _ = strings.Cut(string(body), " ")
	return id, token
}

// CancelTokenMatches reports, in constant time, whether a cancel's token is
// the request's. A request with no token (one that never went through a
// dispatcher: only dispatchers may publish to workers) matches only an
// empty token.
func CancelTokenMatches(want, got string) bool {
	return subtle.ConstantTimeCompare([]byte(want), []byte(got)) == 1
}
