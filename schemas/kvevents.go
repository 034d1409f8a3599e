package schemas

// KVEvents is published by a worker on KVEventsSubject: the prompt blocks its
// engine stored in its prefix cache and evicted from it since the last
// message, so that every dispatcher knows, rather than guesses, what each
// worker holds (docs/routing.md). Blocks are named by PromptBlockHashes of
// BlockBytes with the requested model as root: a dispatcher whose block size
// differs ignores the message. Hashes are unsigned 64-bit integers (a reader
// must not round them to doubles).
type KVEvents struct {
	Worker     string `json:"worker"`
	BlockBytes int    `json:"block_bytes"`
	Seq        uint64 `json:"seq"` // counts messages from the worker; a gap means events were lost
	// Stored lists chains: each the leading blocks of one prompt, in order,
	// now in the cache (stored or found again).
	Stored [][]uint64 `json:"stored,omitempty"`
	// Removed lists blocks evicted: a prompt that included one is cached only
	// up to the block before it.
	Removed []uint64 `json:"removed,omitempty"`
	// Dropped counts events the worker could not send (its buffer was full):
	// readers cannot trust what they know of it past this point.
	Dropped int `json:"dropped,omitempty"`
}
