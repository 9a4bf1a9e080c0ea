// Package truncate bounds text that a server or a user wrote (an error, a
// selector, a container's reason) before it goes into a log line or an
// Event, which have limits of their own and must stay readable.
package truncate

import "unicode/utf8"

// String returns s if it has at most n bytes, else its first n bytes or
// fewer, marked "…". The cut falls on a rune boundary, so that a cut text is
// still valid UTF-8: an Event's message must be.
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
