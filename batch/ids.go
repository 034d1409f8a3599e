package batch

// validFileID reports whether id has the shape of a file id this store
// makes: "file-" and letters, digits, '-' or '_' (uploads are "file-" and a
// NUID; a batch's output and error files "file-<batch suffix>-output" and
// "-errors"), at most maxFileIDLen bytes. Anything else is refused before it
// reaches the object store: a name becomes part of a NATS subject there, and
// a subject longer than the server's control line makes it close the
// connection.
func validFileID(id string) bool {
	if len(id) <= len("file-") || len(id) > maxFileIDLen || id[:len("file-")] != "file-" {
		return false
	}
	for i := len("file-"); i < len(id); i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// maxFileIDLen bounds a file id: ours are under 50 bytes.
const maxFileIDLen = 64
