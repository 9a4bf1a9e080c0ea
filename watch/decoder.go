package watch

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"unsafe"

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

func parseType(s string) (EventType, bool) {
	// Return the constant, never EventType(s): s is a view of the decoder's
	// line buffer, which the next line overwrites.
	switch EventType(s) {
	case Added:
		return Added, true
	case Modified:
		return Modified, true
	case Deleted:
		return Deleted, true
	case Bookmark:
		return Bookmark, true
	case Error:
		return Error, true
	}
	return "", false
}

// Event is one object of a watch stream or of a list.
type Event struct {
	Type EventType
	// Object is the raw JSON of the object. It aliases the decoder's buffer
	// and is valid only until the next call to Next: copy what you keep.
	Object []byte
	// ResourceVersion of the object (empty for ERROR events).
	ResourceVersion string
}

// MalformedError is a line that could not be understood. The stream is still
// usable: the caller logs it and reads on. It never carries the object, which
// may hold ConfigMap data; at most 40 bytes of an unknown event type.
type MalformedError struct {
	Reason string
	Length int
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("malformed watch event (%d bytes): %s", e.Length, e.Reason)
}

// Decoder reads a watch stream: one JSON event per line. It yields one event
// or an error and never retries; reconnecting is ListWatcher's job.
//
// Lines have no size limit below maxLine: a ConfigMap holds up to 1 MiB,
// several times that once JSON-escaped (bufio.Scanner's 64 KiB default
// would fail on them).
type Decoder struct {
	r    *bufio.Reader
	line []byte
}

const (
	readBufferSize = 64 << 10
	// maxLine is far above anything the API server can send for one object
	// (its request limit is 3 MiB; escaping at most sextuples it).
	maxLine = 64 << 20
	// keepLine is the largest line buffer kept between events; a larger one,
	// grown for a rare huge object, is released so it is not held for days.
	keepLine = 4 << 20
)

// NewDecoder reads events from r.
func NewDecoder(r io.Reader) *Decoder {
	return &Decoder{r: bufio.NewReaderSize(r, readBufferSize)}
}

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
		if len(bytes.TrimSpace(line)) == 0 {
			continue // tolerate blank lines, as encoding/json would
		}
		return decodeLine(line)
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
			// The whole line is in the reader's buffer, which stays put
			// until the next read, as long as an event may be used.
			return chunk, nil
		}
		if !tooLong {
			if len(d.line)+len(chunk) > maxLine {
				tooLong = true
				d.line = d.line[:0]
			} else {
				d.line = append(d.line, chunk...)
			}
		}
		switch {
		case err == nil:
			if tooLong {
				return nil, &MalformedError{Reason: fmt.Sprintf("line longer than %d bytes", maxLine), Length: maxLine}
			}
			return d.line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if !tooLong && len(bytes.TrimSpace(d.line)) == 0 {
				return nil, io.EOF
			}
			// The server ends every event with a newline: anything after the
			// last one is an event cut off by a disconnect.
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}

// decodeLine parses one line without copying the object: gjson reads the
// line through a string view of it, and Object is the slice of the line that
// gjson's result points at.
func decodeLine(line []byte) (Event, error) {
	if !gjson.ValidBytes(line) {
		return Event{}, &MalformedError{Reason: "not valid JSON", Length: len(line)}
	}
	view := unsafe.String(unsafe.SliceData(line), len(line)) // not kept past this call
	if !gjson.Parse(view).IsObject() {
		return Event{}, &MalformedError{Reason: "not a JSON object", Length: len(line)}
	}
	// Where a key repeats, the first counts, as with gjson's Get.
	typeResult := gjson.Get(view, "type")
	typ, ok := parseType(typeResult.String())
	if !ok || typeResult.Type != gjson.String {
		return Event{}, &MalformedError{Reason: fmt.Sprintf("unknown event type %.40q", typeResult.String()), Length: len(line)}
	}
	object := gjson.Get(view, "object")
	// Index locates the object in the line; gjson leaves it 0 when it cannot.
	if !object.IsObject() || object.Index <= 0 || object.Index+len(object.Raw) > len(line) {
		return Event{}, &MalformedError{Reason: "event has no object", Length: len(line)}
	}
	ev := Event{Type: typ, Object: line[object.Index : object.Index+len(object.Raw)]}
	if typ == Error {
		return ev, nil
	}
	rv := object.Get("metadata.resourceVersion")
	if rv.Type != gjson.String || rv.Str == "" {
		return Event{}, &MalformedError{Reason: string(typ) + " event without metadata.resourceVersion", Length: len(line)}
	}
	ev.ResourceVersion = strings.Clone(rv.Str)
	return ev, nil
}
