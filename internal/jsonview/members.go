package jsonview

import (
	"math/bits"
	"strings"

	"github.com/tidwall/gjson"
)

// Members walks the members of one JSON object once, handing out each key
// and value as raw text, without decoding or validating them. It is for
// bytes already validated (a watch line, a list page): one pass over an
// object then replaces a gjson Get per field, each of which would skip
// everything before its field again (managedFields above all).
//
// On text that is not well-formed it stops early or yields nonsense, but it
// never reads out of bounds and always ends.
type Members struct {
	s string
	i int // where the next member, or the value of the current one, starts
	// end is the index after the object's closing brace, once the walk
	// has reached it; 0 before, or if the walk stopped at anything else.
	end int
}

// ObjectMembers returns the members of the object obj, or none if obj is
// not an object.
func ObjectMembers(obj string) Members {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return Members{s: obj, i: len(obj)}
	}
	return Members{s: obj, i: i + 1}
}

// Next returns the next member: its key token (quotes and escapes as sent)
// and its value token. ok is false after the last member.
func (m *Members) Next() (key, value string, ok bool) {
	if key, ok = m.NextKey(); !ok {
		return "", "", false
	}
	if value = m.Value(); value == "" {
		return "", "", false
	}
	return key, value, true
}

// NextKey returns the next member's key token; Value or Enter must follow.
func (m *Members) NextKey() (key string, ok bool) {
	s := m.s
	i := skipSpace(s, m.i)
	if i < len(s) && s[i] == ',' {
		i = skipSpace(s, i+1)
	}
	m.i = len(s) // unless a key is found below
	if i < len(s) && s[i] == '}' {
		m.end = i + 1
		return "", false
	}
	if i >= len(s) || s[i] != '"' {
		return "", false
	}
	keyEnd := StringEnd(s, i)
	if keyEnd < 0 {
		return "", false
	}
	colon := skipSpace(s, keyEnd)
	if colon >= len(s) || s[colon] != ':' {
		return "", false
	}
	m.i = skipSpace(s, colon+1)
	return s[i:keyEnd], true
}

// Value returns the value token of the member whose key NextKey returned,
// or "" if it is not complete (which ends the walk).
func (m *Members) Value() string {
	start := m.i
	end := valueEnd(m.s, start)
	if end <= start {
		m.i = len(m.s)
		return ""
	}
	m.i = end
	return m.s[start:end]
}

// Enter returns the members of the value of the member whose key NextKey
// returned, if it is an object, to be walked in place of Value: the value
// is read once instead of being skipped first. After walking inner to its
// end, Leave(inner) goes on after the value.
func (m *Members) Enter() (inner Members, ok bool) {
	if m.i >= len(m.s) || m.s[m.i] != '{' {
		return Members{}, false
	}
	return Members{s: m.s[m.i:], i: 1}, true
}

// Leave goes on after the value walked with inner; if inner did not reach
// the value's end, the walk ends.
func (m *Members) Leave(inner Members) {
	if inner.end == 0 {
		m.i = len(m.s)
		return
	}
	m.i += inner.end
}

// Token returns the text of a value walked with inner, once inner has
// reached its end (and "" before).
func (inner *Members) Token() string {
	return inner.s[:inner.end]
}

// Seek moves to the first remaining member named key and returns the text
// from its value to the end of the object, without finding where the value
// ends: enough to walk into it with ObjectMembers, and cheaper where the
// value is large. The walk ends there.
func (m *Members) Seek(key string) (rest string, ok bool) {
	for {
		k, ok := m.NextKey()
		if !ok {
			return "", false
		}
		if Key(k) == key {
			rest = m.s[m.i:]
			m.i = len(m.s)
			return rest, true
		}
		if m.Value() == "" {
			return "", false
		}
	}
}

// Key returns the text of a key token; only a key written with escapes,
// which the API server never sends, costs an allocation.
func Key(token string) string {
	if len(token) < 2 {
		return ""
	}
	if !hasBackslash(token) {
		return token[1 : len(token)-1]
	}
	return gjson.Parse(token).String()
}

// hasBackslash is strings.IndexByte(s, '\\') >= 0, without the cost of a
// call for the short strings that keys and names are.
func hasBackslash(s string) bool {
	if len(s) > 32 {
		return strings.IndexByte(s, '\\') >= 0
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			return true
		}
	}
	return false
}

// String returns a value token as gjson's Result.String does: a string
// decoded, null as "", anything else as its text. Only a string with
// escapes, or a number that is not a plain integer, costs an allocation.
func String(token string) string {
	if len(token) >= 2 && token[0] == '"' && !hasBackslash(token) {
		return token[1 : len(token)-1]
	}
	return gjson.Parse(token).String()
}

// StringEnd returns the index after the closing quote of the string token
// that starts at s[i] (a quote), or -1 if it is not closed.
func StringEnd(s string, i int) int {
	j := i + 1
	// Keys, names and uids end within a few words: look at eight bytes at
	// a time, as a call to IndexByte costs more than that.
	for words := 0; j+8 <= len(s); {
		m := quotesOrBackslashes(load64(s, j))
		if m == 0 {
			if words++; words == 8 {
				return longStringEnd(s, i, j+8)
			}
			j += 8
			continue
		}
		j += bits.TrailingZeros64(m) / 8
		if s[j] == '"' {
			return j + 1
		}
		j += 2 // a backslash and the byte it escapes
	}
	for ; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// longStringEnd goes on from s[j], not inside an escape, where StringEnd
// found a long string: IndexByte is fastest there. A quote closes the
// string unless an odd number of backslashes escapes it.
func longStringEnd(s string, i, j int) int {
	for {
		k := strings.IndexByte(s[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		escapes := 0
		for b := j - 1; b > i && s[b] == '\\'; b-- {
			escapes++
		}
		if escapes%2 == 0 {
			return j + 1
		}
		j++
	}
}

// quotesOrBackslashes marks them in eight bytes, as special does.
func quotesOrBackslashes(x uint64) uint64 {
	return hasZero(x^(ones*'"')) | hasZero(x^(ones*'\\'))
}

// load64 reads s[j:j+8] little-endian; the compiler makes it one load.
func load64(s string, j int) uint64 {
	b := s[j : j+8]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// valueEnd returns the index after the value token starting at s[i], or
// -1 if it is not complete.
func valueEnd(s string, i int) int {
	if i >= len(s) {
		return -1
	}
	switch s[i] {
	case '"':
		return StringEnd(s, i)
	case '{', '[':
		return containerEnd(s, i)
	}
	// A number, true, false or null: up to the next delimiter.
	j := i
	for j < len(s) && !isDelimiter(s[j]) {
		j++
	}
	return j
}

// structural marks the bytes that matter when skipping a container.
var structural = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// containerEnd returns the index after the object or array starting at
// s[i], or -1.
func containerEnd(s string, i int) int {
	depth := 0
	for j := i; j < len(s); j++ {
		c := s[j]
		if !structural[c] {
			continue
		}
		switch c {
		case '"':
			end := StringEnd(s, j)
			if end < 0 {
				return -1
			}
			j = end - 1
		case '{', '[':
			depth++
		default:
			depth--
			if depth == 0 {
				return j + 1
			}
		}
	}
	return -1
}

func isDelimiter(c byte) bool {
	return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}
