package batch

import "encoding/json"

// File is OpenAI's file object.
type File struct {
	ID        string `json:"id"`
	Object    string `json:"object"` // "file"
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	ExpiresAt *int64 `json:"expires_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	// Status and StatusDetails are deprecated in OpenAI's API and still sent.
	Status        string  `json:"status"`
	StatusDetails *string `json:"status_details"`

	tenant string // whose it is; kept in the object's metadata, never sent
}

// List is OpenAI's paged list body.
type List[T any] struct {
	Object  string  `json:"object"` // "list"
	Data    []T     `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

// FileList is the body of GET /v1/files.
type FileList = List[File]

// FileDeleted is the body of DELETE /v1/files/{id}.
type FileDeleted struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "file"
	Deleted bool   `json:"deleted"`
}

// The statuses of a batch, as OpenAI names them.
const (
	StatusValidating = "validating"
	StatusFailed     = "failed"
	StatusInProgress = "in_progress"
	StatusFinalizing = "finalizing"
	StatusCompleted  = "completed"
	StatusExpired    = "expired"
	StatusCancelling = "cancelling"
	StatusCancelled  = "cancelled"
)

// terminal reports whether a batch in status s changes no more.
func terminal(s string) bool {
	return s == StatusFailed || s == StatusCompleted || s == StatusExpired || s == StatusCancelled
}

// Batch is OpenAI's batch object.
type Batch struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"` // "batch"
	Endpoint         string            `json:"endpoint"`
	Errors           *BatchErrors      `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        *int64            `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    RequestCounts     `json:"request_counts"`
	Metadata         map[string]string `json:"metadata"`
}

// RequestCounts are a batch's lines: all, answered with a 2xx, and the rest
// answered (an error status, or not run: cancelled or expired).
type RequestCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// BatchErrors is why a batch failed validation: OpenAI's errors object.
type BatchErrors struct {
	Object string       `json:"object"` // "list"
	Data   []BatchError `json:"data"`
}

// BatchError is one reason a batch's input file was refused.
type BatchError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"` // 1-based
}

// BatchList is the body of GET /v1/batches.
type BatchList = List[Batch]

// record is what the batches bucket keeps per batch: OpenAI's object and
// what the runners need besides.
type record struct {
	Batch
	Tenant string `json:"tenant,omitempty"`
	KeyID  string `json:"key_id,omitempty"`
	Model  string `json:"model,omitempty"` // every line's (one model per batch, as OpenAI has it); set by validation
	// Lease: the runner holding a validating or finalizing batch, until
	// LeaseUntil (unix ms); another runner takes the batch over after it.
	Leaser     string `json:"leaser,omitempty"`
	LeaseUntil int64  `json:"lease_until,omitempty"`
}

// OutputLine is one line of a batch's output or error file, in OpenAI's
// format.
type OutputLine struct {
	ID       string        `json:"id"` // batch_req_...
	CustomID string        `json:"custom_id"`
	Response *LineResponse `json:"response"`
	Error    *LineError    `json:"error"`
}

// LineResponse is what the endpoint answered for a line.
type LineResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

// LineError is why a line got no response (cancelled, expired).
type LineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// InputLine is one line of a batch input file.
type InputLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}
