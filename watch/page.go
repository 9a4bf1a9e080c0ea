package watch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// listMeta is what a list page says of itself.
type listMeta struct {
	ResourceVersion string `json:"resourceVersion"`
	Continue        string `json:"continue"`
}

// errNotAList is a page that is not a JSON object with an items array.
var errNotAList = errors.New("not a list")

// readPage decodes one list page from r as it arrives and calls item for each
// element of its items array, one at a time. Only one item is held at a
// time (item's argument is reused for the next one: copy what you keep), so
// a page of hundreds of large ConfigMaps costs the largest of them, not
// their sum. It returns the page's metadata once the whole page has been
// read; a page cut short is an error wrapping io.ErrUnexpectedEOF, and the
// items already handed over belong to an incomplete list.
func readPage(r io.Reader, item func(raw []byte)) (listMeta, error) {
	dec := json.NewDecoder(r)
	var meta listMeta
	if err := expectDelim(dec, '{'); err != nil {
		return meta, err
	}
	var raw json.RawMessage // reused: its buffer grows to the largest item
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return meta, eofIsUnexpected(err)
		}
		key, _ := tok.(string)
		switch key {
		case "metadata":
			if err := dec.Decode(&meta); err != nil {
				return meta, fmt.Errorf("metadata: %w", eofIsUnexpected(err))
			}
		case "items":
			if err := readItems(dec, &raw, item); err != nil {
				return meta, err
			}
		default:
			if err := dec.Decode(&raw); err != nil { // kind, apiVersion: read past
				return meta, eofIsUnexpected(err)
			}
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return meta, err
	}
	return meta, nil
}

// readItems reads the value of "items": an array, or null as in an empty
// metadata-only list.
func readItems(dec *json.Decoder, raw *json.RawMessage, item func([]byte)) error {
	tok, err := dec.Token()
	if err != nil {
		return eofIsUnexpected(err)
	}
	if tok == nil {
		return nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return fmt.Errorf("%w: items is not an array", errNotAList)
	}
	for dec.More() {
		if err := dec.Decode(raw); err != nil {
			return fmt.Errorf("item: %w", eofIsUnexpected(err))
		}
		item(*raw)
	}
	return expectDelim(dec, ']')
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return eofIsUnexpected(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("%w: want %q, got %T", errNotAList, want, tok)
	}
	return nil
}

// eofIsUnexpected: a page ends with its closing brace; io.EOF before it is a
// page cut short. A syntax error is reworded without the character it quotes,
// which may be ConfigMap data.
func eofIsUnexpected(err error) error {
	var syntax *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF):
		return io.ErrUnexpectedEOF
	case errors.As(err, &syntax):
		return fmt.Errorf("%w: not valid JSON at byte %d", errNotAList, syntax.Offset)
	}
	return err
}
