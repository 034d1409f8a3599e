package schemas

import (
	"fmt"
	"unicode/utf8"
)

// OpenAI's limits on the metadata of a batch or a response: 16 pairs, keys
// of at most 64 characters, values of at most 512. Stored with the object,
// in a record that must fit one NATS message.
const (
	MaxMetadataPairs    = 16
	MaxMetadataKeyLen   = 64
	MaxMetadataValueLen = 512
)

// CheckMetadata refuses metadata past OpenAI's limits, naming the param.
func CheckMetadata(m map[string]string) error {
	if len(m) > MaxMetadataPairs {
		return ErrInvalidValue.At("metadata", "metadata", fmt.Sprintf("at most %d keys", MaxMetadataPairs))
	}
	for k, v := range m {
		if utf8.RuneCountInString(k) > MaxMetadataKeyLen {
			return ErrInvalidValue.At("metadata", "metadata", fmt.Sprintf("keys of at most %d characters", MaxMetadataKeyLen))
		}
		if utf8.RuneCountInString(v) > MaxMetadataValueLen {
			return ErrInvalidValue.At("metadata", "metadata", fmt.Sprintf("values of at most %d characters", MaxMetadataValueLen))
		}
	}
	return nil
}
