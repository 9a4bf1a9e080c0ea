package policy

import (
	"encoding/binary"
	"hash"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// digestWriter feeds length-prefixed fields into a hash without allocating:
// strings are written through a read-only byte view, and JSON string tokens
// are unescaped through a small fixed buffer instead of being decoded into a
// new string first. A 1 MiB multi-line value (every newline escaped) costs
// no allocation.
type digestWriter struct {
	h   hash.Hash
	buf [512]byte
	n   int
}

func (d *digestWriter) flush() {
	if d.n > 0 {
		d.h.Write(d.buf[:d.n])
		d.n = 0
	}
}

func (d *digestWriter) writeByte(c byte) {
	if d.n == len(d.buf) {
		d.flush()
	}
	d.buf[d.n] = c
	d.n++
}

func (d *digestWriter) writeUint(n uint64) {
	if d.n+8 > len(d.buf) {
		d.flush()
	}
	binary.BigEndian.PutUint64(d.buf[d.n:], n)
	d.n += 8
}

// writeString writes a length-prefixed field.
func (d *digestWriter) writeString(s string) {
	d.writeUint(uint64(len(s)))
	d.flush()
	if len(s) > 0 {
		d.h.Write(unsafe.Slice(unsafe.StringData(s), len(s))) // hash.Hash never keeps or changes its input
	}
}

// writeJSONString writes the decoded value of a JSON string token (with its
// quotes) as a length-prefixed field, exactly as writeString would write the
// decoded string, so "\u003c" and "<" give the same digest.
func (d *digestWriter) writeJSONString(token string) {
	body := token[1 : len(token)-1]
	d.writeUint(uint64(unescape(body, nil)))
	unescape(body, d)
	d.flush()
}

// unescape decodes a JSON string body (no quotes), writing the bytes to d
// when d is not nil, and returns the decoded length. Runs without escapes
// are written in one piece. Invalid escapes and lone surrogates decode to
// U+FFFD, as encoding/json does.
func unescape(s string, d *digestWriter) int {
	n := 0
	for len(s) > 0 {
		i := strings.IndexByte(s, '\\')
		if i < 0 || i == len(s)-1 {
			n += len(s)
			d.writeRaw(s)
			return n
		}
		n += i
		d.writeRaw(s[:i])
		r, size := decodeEscape(s[i:])
		var b [utf8.UTFMax]byte
		enc := b[:0]
		if r < utf8.RuneSelf {
			enc = append(enc, byte(r))
		} else {
			enc = utf8.AppendRune(enc, r)
		}
		n += len(enc)
		if d != nil {
			for _, c := range enc {
				d.writeByte(c)
			}
		}
		s = s[i+size:]
	}
	return n
}

// writeRaw writes s as is; a nil writer only counts.
func (d *digestWriter) writeRaw(s string) {
	if d == nil || len(s) == 0 {
		return
	}
	if len(s) <= len(d.buf)-d.n {
		d.n += copy(d.buf[d.n:], s)
		return
	}
	d.flush()
	d.h.Write(unsafe.Slice(unsafe.StringData(s), len(s))) // hash.Hash never keeps or changes its input
}

// decodeEscape decodes the escape sequence at the start of s (s[0] is the
// backslash) and returns the rune and the bytes consumed.
func decodeEscape(s string) (rune, int) {
	switch s[1] {
	case '"', '\\', '/':
		return rune(s[1]), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r, ok := hex4(s, 2)
		if !ok {
			return utf8.RuneError, 2
		}
		if !utf16.IsSurrogate(r) {
			return r, 6
		}
		if len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
			if r2, ok := hex4(s, 8); ok {
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					return dec, 12
				}
			}
		}
		return utf8.RuneError, 6
	}
	return utf8.RuneError, 2
}

func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s[i : i+4]) {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
