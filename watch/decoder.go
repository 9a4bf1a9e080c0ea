package watch

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/tidwall/gjson"
)

// EventType is the type field of a watch event, plus Synced for objects that
// come from a list rather than from the stream.
type EventType string

const (
	Added    EventType = "ADDED"
	Modified EventType = "MODIFIED"
	Deleted  EventType = "DELETED"
	Bookmark EventType = "BOOKMARK"
	Error    EventType = "ERROR"
	// Synced marks an object read by a (re)list: its current state, with no
	// claim about what changed.
	Synced EventType = "SYNCED"
)

// streamTypes are the types a watch stream may send. Looking a type up here
// yields the constant, not a view of the decoder's buffer.
var streamTypes = map[string]EventType{
	string(Added): Added, string(Modified): Modified, string(Deleted): Deleted, string(Bookmark): Bookmark, string(Error): Error,
}

// Event is one object of a watch stream or of a list.
type Event struct {
	Type EventType
	// Object is the raw JSON of the object. It aliases the decoder's buffer
	// and is valid only until the next call to Next: copy what you keep.
	Object          []byte
	ResourceVersion string // empty for ERROR events
}

// MalformedError is a line that could not be understood; the stream can be
// read on. It never carries the object, which may hold ConfigMap data: at
// most 40 bytes of an unknown event type.
type MalformedError struct {
	Reason string
	Length int
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("malformed watch event (%d bytes): %s", e.Length, e.Reason)
}

// Decoder reads a watch stream, one JSON event per line of any size up to
// maxLine (a ConfigMap holds up to 1 MiB, several times that once escaped).
// It yields one event or an error and never retries: reconnecting is
// ListWatcher's job.
type Decoder struct {
	r    *bufio.Reader
	line []byte
}

const (
	// maxLine is above one object of the API server (1 MiB of data, a few
	// times that once JSON-escaped) and well below the controller's 64 Mi
	// memory limit: a longer line is a fault or an attack.
	maxLine = 16 << 20
	// keepLine is the largest line buffer kept between events: one grown for
	// a rare huge object is not held for days.
	keepLine = 4 << 20
)

// NewDecoder reads events from r.
func NewDecoder(r io.Reader) *Decoder { return &Decoder{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next event. At a clean end of stream it returns io.EOF; a
// line cut off by the end of the stream is io.ErrUnexpectedEOF, a disconnect
// that must not advance the resourceVersion. A line that is not a valid event
// returns a *MalformedError and the stream can be read on.
func (d *Decoder) Next() (Event, error) {
	for {
		line, err := d.readLine()
		if err != nil {
			return Event{}, err
		}
		if len(bytes.TrimSpace(line)) > 0 { // blank lines are skipped, as encoding/json would
			return decodeLine(line)
		}
	}
}

func (d *Decoder) readLine() ([]byte, error) {
	if cap(d.line) > keepLine {
		d.line = nil
	}
	d.line = d.line[:0]
	tooLong := false
	for {
		chunk, err := d.r.ReadSlice('\n')
		if err == nil && len(d.line) == 0 && !tooLong {
			// The whole line is in the reader's buffer, which stays put until
			// the next read: no copy.
			return chunk, nil
		}
		tooLong = tooLong || len(d.line)+len(chunk) > maxLine
		if tooLong {
			d.line = d.line[:0]
		} else {
			d.line = append(d.line, chunk...)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
		case err == nil && tooLong:
			return nil, &MalformedError{Reason: fmt.Sprintf("line longer than %d bytes", maxLine), Length: maxLine}
		case err == nil:
			return d.line, nil
		case errors.Is(err, io.EOF) && !tooLong && len(bytes.TrimSpace(d.line)) == 0:
			return nil, io.EOF
		case errors.Is(err, io.EOF):
			// Every event ends with a newline: what follows the last one is an
			// event cut off by a disconnect.
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

// decodeLine parses one line. Object is the slice of the line that holds
// the object (gjson's result is a copy; its Index places it in the line).
func decodeLine(line []byte) (Event, error) {
	malformed := func(reason string) (Event, error) {
		return Event{}, &MalformedError{Reason: reason, Length: len(line)}
	}
	if !gjson.ValidBytes(line) {
		return malformed("not valid JSON")
	}
	if trimmed := bytes.TrimLeft(line, " \t\r\n"); trimmed[0] != '{' {
		return malformed("not a JSON object")
	}
	typeResult := gjson.GetBytes(line, "type") // where a key repeats, the first counts
	typ, ok := streamTypes[typeResult.String()]
	if !ok || typeResult.Type != gjson.String {
		return malformed(fmt.Sprintf("unknown event type %.40q", typeResult.String()))
	}
	object := gjson.GetBytes(line, "object")
	// Index locates the object in the line; gjson leaves it 0 when it cannot.
	if !object.IsObject() || object.Index <= 0 || object.Index+len(object.Raw) > len(line) {
		return malformed("event has no object")
	}
	ev := Event{Type: typ, Object: line[object.Index : object.Index+len(object.Raw)]}
	if typ == Error {
		return ev, nil
	}
	rv := object.Get("metadata.resourceVersion")
	if rv.Type != gjson.String || rv.Str == "" {
		return malformed(string(typ) + " event without metadata.resourceVersion")
	}
	ev.ResourceVersion = strings.Clone(rv.Str) // not a view of the object's copy
	return ev, nil
}
