// Package jsonview reads JSON in place: it lets gjson read a byte buffer
// without copying it, validates a buffer (Valid, ValidVisit), and walks an
// object's members in one pass (Members), for the hot path of every watch
// event.
//
// A watch line or a list page can be megabytes; gjson.GetBytes copies every
// result it returns, so reading a 1 MiB ConfigMap through it would allocate
// in proportion to the event. Instead the buffer is viewed as a string for
// the duration of one parse. The rule that makes this safe: the buffer is not
// modified while a view of it, or a string taken from it, is in use, and
// anything kept beyond that is copied with strings.Clone.
package jsonview

import (
	"unsafe"

	"github.com/tidwall/gjson"
)

// Parse parses buf in place. Strings in the result alias buf.
func Parse(buf []byte) gjson.Result {
	if len(buf) == 0 {
		return gjson.Result{}
	}
	return gjson.Parse(unsafe.String(&buf[0], len(buf)))
}

// View returns buf as a string without copying it. Strings taken from it
// alias buf.
func View(buf []byte) string {
	if len(buf) == 0 {
		return ""
	}
	return unsafe.String(&buf[0], len(buf))
}

// Bytes returns the part of buf that r's raw text occupies. r must come from
// Parse(buf) (or a result inside it); otherwise, or for a value gjson had to
// rebuild, it returns a copy.
func Bytes(buf []byte, r gjson.Result) []byte {
	if r.Raw == "" {
		return nil
	}
	return Part(buf, r.Raw)
}

// Part returns the part of buf that view occupies. view must be a string
// taken from View(buf); otherwise it returns a copy.
func Part(buf []byte, view string) []byte {
	if len(buf) == 0 {
		return nil
	}
	start := uintptr(unsafe.Pointer(unsafe.StringData(view))) - uintptr(unsafe.Pointer(&buf[0]))
	if start < uintptr(len(buf)) && start+uintptr(len(view)) <= uintptr(len(buf)) {
		return buf[start : start+uintptr(len(view)) : start+uintptr(len(view))]
	}
	return []byte(view)
}
