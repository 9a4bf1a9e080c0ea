package apiclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ListMeta is what a list page says of itself.
type ListMeta struct {
	ResourceVersion string `json:"resourceVersion"`
	Continue        string `json:"continue"`
}

// errNotAList is a page that is JSON, but not an object with an items
// array; errInvalidJSON one that is not JSON.
var (
	errNotAList    = errors.New("not a list")
	errInvalidJSON = errors.New("not valid JSON")
)

// ReadPage decodes one list page from r as it arrives and calls item for each
// element of its items array: the one reader of every list page. item's argument is reused for the next one
// (copy what you keep), so a page costs its largest item, not their sum. A
// page cut short is an error wrapping io.ErrUnexpectedEOF, and the items
// handed over by then belong to an incomplete list.
func ReadPage(r io.Reader, item func(raw []byte)) (ListMeta, error) {
	dec := json.NewDecoder(r)
	var meta ListMeta
	if err := expectDelim(dec, '{'); err != nil {
		return meta, err
	}
	var raw json.RawMessage // reused: its buffer grows to the largest item
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return meta, pageError(err)
		}
		switch key {
		case "metadata":
			if err := dec.Decode(&meta); err != nil {
				return meta, fmt.Errorf("metadata: %w", pageError(err))
			}
		case "items":
			if err := readItems(dec, &raw, item); err != nil {
				return meta, err
			}
		default: // kind, apiVersion: read past
			if err := dec.Decode(&raw); err != nil {
				return meta, pageError(err)
			}
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return meta, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return meta, fmt.Errorf("%w: more after the list", errNotAList)
	}
	return meta, nil
}

func readItems(dec *json.Decoder, raw *json.RawMessage, item func([]byte)) error {
	tok, err := dec.Token()
	switch {
	case err != nil:
		return pageError(err)
	case tok == nil: // null, as in an empty metadata-only list
		return nil
	case tok != json.Delim('['):
		return fmt.Errorf("%w: items is not an array", errNotAList)
	}
	for dec.More() {
		if err := dec.Decode(raw); err != nil {
			return fmt.Errorf("item: %w", pageError(err))
		}
		item(*raw)
	}
	return expectDelim(dec, ']')
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return pageError(err)
	}
	if tok != want {
		return fmt.Errorf("%w: want %q, got %T", errNotAList, want, tok)
	}
	return nil
}

// pageError: a page ends with its closing brace, so io.EOF before it is a
// page cut short. A syntax error is reworded without the character it
// quotes, which may be ConfigMap data.
func pageError(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	if syntax, ok := errors.AsType[*json.SyntaxError](err); ok {
		return fmt.Errorf("%w at byte %d", errInvalidJSON, syntax.Offset)
	}
	return err
}
