package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// ParseJSONLog reads a JSON log (slog's JSONHandler, one object per line) as
// a strict log store does: every non-empty line must be one JSON object, and
// no object, at any depth, may have a key twice. encoding/json keeps the last
// of two equal keys without a word; Elasticsearch rejects the document.
func ParseJSONLog(log []byte) ([]map[string]any, error) {
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if err := uniqueKeys(line); err != nil {
			return out, fmt.Errorf("log line %d: %v: %s", n, err, line)
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			return out, fmt.Errorf("log line %d: not a JSON object: %v: %s", n, err, line)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

// uniqueKeys reports the first key that an object of the JSON value b has
// twice.
func uniqueKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := checkValue(dec); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("more than one JSON value on the line")
	}
	return nil
}

// checkValue reads one value from dec, checking the objects in it.
func checkValue(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar
	}
	switch d {
	case '{':
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := k.(string)
			if seen[key] {
				return fmt.Errorf("key %q twice", key)
			}
			seen[key] = true
			if err := checkValue(dec); err != nil {
				return err
			}
		}
	case '[':
		for dec.More() {
			if err := checkValue(dec); err != nil {
				return err
			}
		}
	}
	_, err = dec.Token() // the closing delimiter
	return err
}
