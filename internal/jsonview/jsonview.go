// Package jsonview lets gjson read a byte buffer without copying it.
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

// Valid reports whether buf is one well-formed JSON value.
func Valid(buf []byte) bool { return gjson.ValidBytes(buf) }

// Bytes returns the part of buf that r's raw text occupies. r must come from
// Parse(buf) (or a result inside it); otherwise, or for a value gjson had to
// rebuild, it returns a copy.
func Bytes(buf []byte, r gjson.Result) []byte {
	if len(buf) == 0 || r.Raw == "" {
		return nil
	}
	start := uintptr(unsafe.Pointer(unsafe.StringData(r.Raw))) - uintptr(unsafe.Pointer(&buf[0]))
	if start < uintptr(len(buf)) && start+uintptr(len(r.Raw)) <= uintptr(len(buf)) {
		return buf[start : start+uintptr(len(r.Raw)) : start+uintptr(len(r.Raw))]
	}
	return []byte(r.Raw)
}
