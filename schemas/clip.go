package schemas

import (
	"strconv"
	"unicode/utf8"
)

// MaxQuoted bounds what an error message or a log line quotes of a client's
// string (a model name, an id, a value): a client may send megabytes, and
// each quote of them would be copied into every error body, log line and
// failure record that names it.
const MaxQuoted = 256

// Clip is s if it has at most max bytes; otherwise its first max bytes (cut
// at a character boundary) and how long it was: "abc…(+1234 bytes)".
func Clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(+" + strconv.Itoa(len(s)-cut) + " bytes)"
}
