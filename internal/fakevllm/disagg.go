package fakevllm

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/tokenbus/tokenbus/schemas"
)

// vLLM's KV-transfer handshake (the NixlConnector's, as its
// disaggregated-serving proxy drives it; docs/disaggregation.md), as far as
// a client sees it:
//
//   - a prefill, a stream:false request whose kv_transfer_params have
//     "do_remote_decode": true, answers as usual with, at the top level,
//     "kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode":
//     false, "remote_block_ids": [...], "remote_engine_id": EngineID,
//     "remote_request_id": "<the answer's id>", "remote_host": and
//     "remote_port": the address the request came to, "tp_size": 1}, one
//     block id per 16 prompt tokens, counted on from the server's last;
//   - a decode, a request whose params have "do_remote_prefill": true, is
//     recorded (TransferParams, RemotePrefills) and answered as usual, or
//     with SetRefuseTransfer(true) refused with a 503 kv_transfer_failed
//     before any chunk, as a decode engine that cannot take the blocks.
//
// Nothing is held and nothing pulled: the fake only speaks the fields.

// kvBlockSize is the tokens a block id stands for.
const kvBlockSize = 16

// SetRefuseTransfer makes the decodes (do_remote_prefill) fail with a 503
// kv_transfer_failed from now on, or not.
func (s *Server) SetRefuseTransfer(refuse bool) { s.refuseKV.Store(refuse) }

// Prefills counts the prefills answered with kv_transfer_params.
func (s *Server) Prefills() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prefills
}

// RemotePrefills counts the decodes received (refused ones included).
func (s *Server) RemotePrefills() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.transfers)
}

// TransferParams is the kv_transfer_params of every decode received, in
// order, as the requests carried them.
func (s *Server) TransferParams() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.transfers)
}

// LastTransferParams is the kv_transfer_params of the last decode
// received; nil if none came.
func (s *Server) LastTransferParams() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.transfers) == 0 {
		return nil
	}
	return s.transfers[len(s.transfers)-1]
}

// transferRole reads a request's kv_transfer_params: a prefill for a
// remote decode, a decode of a remote prefill, or neither.
func transferRole(params []byte) (prefill, decode bool) {
	if params == nil {
		return false, false
	}
	var p struct {
		DoRemoteDecode  bool `json:"do_remote_decode"`
		DoRemotePrefill bool `json:"do_remote_prefill"`
	}
	_ = json.Unmarshal(params, &p)
	return p.DoRemoteDecode, p.DoRemotePrefill
}

// takeTransfer records a decode's params; false (and a 503 written) when
// the fake refuses it.
func (s *Server) takeTransfer(w http.ResponseWriter, params []byte) bool {
	s.mu.Lock()
	s.transfers = append(s.transfers, slices.Clone(params))
	s.mu.Unlock()
	if !s.refuseKV.Load() {
		return true
	}
	e := schemas.ErrKVTransferFailed.New("vllm", schemas.TransferParamString(params, "remote_engine_id"),
		"refused by the fake (SetRefuseTransfer)")
	w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	writeJSON(w, e.Status, string(e.JSON()))
	return false
}

// prefillParams is a prefill's answer's kv_transfer_params.
func (s *Server) prefillParams(r *http.Request, requestID string, promptTokens int) string {
	host, port := "127.0.0.1", "0"
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if h, p, err := net.SplitHostPort(a.String()); err == nil {
			host, port = h, p
		}
	}
	n := max((promptTokens+kvBlockSize-1)/kvBlockSize, 1)
	s.mu.Lock()
	first := s.nextBlock
	s.nextBlock += n
	s.prefills++
	s.mu.Unlock()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(first + i)
	}
	engineID, _ := json.Marshal(s.EngineID)
	reqID, _ := json.Marshal(requestID)
	hostJSON, _ := json.Marshal(host)
	return fmt.Sprintf(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[%s],"remote_engine_id":%s,`+
		`"remote_request_id":%s,"remote_host":%s,"remote_port":%s,"tp_size":1}`,
		strings.Join(ids, ","), engineID, reqID, hostJSON, port)
}
