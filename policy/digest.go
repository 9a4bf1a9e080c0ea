package policy

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// digest is the SHA-256 of a ConfigMap's data (see dataHash), kept as its
// 32 bytes: the text form, 71 bytes and an allocation, exists only at the
// edges, in annotations and logs. The zero value stands for no digest.
type digest [sha256.Size]byte

const digestPrefix = "sha256:"

// String is the annotation's form, "sha256:<64 hex digits>", or "" for none.
func (d digest) String() string {
	if d.isZero() {
		return ""
	}
	return string(d.appendText(nil))
}

// MarshalText gives the annotation's form to encoding/json (patches) and
// log/slog (both handlers).
func (d digest) MarshalText() ([]byte, error) {
	if d.isZero() {
		return []byte{}, nil
	}
	return d.appendText(nil), nil
}

func (d digest) appendText(b []byte) []byte {
	b = append(b, digestPrefix...)
	return hex.AppendEncode(b, d[:])
}

func (d digest) isZero() bool { return d == digest{} }

// parseDigest reads the annotation's form. A string that is not one, or is
// the all-zero digest (no SHA-256 of anything), is not a digest.
func parseDigest(s string) (digest, bool) {
	var d digest
	if len(s) != len(digestPrefix)+2*len(d) || !strings.HasPrefix(s, digestPrefix) {
		return digest{}, false
	}
	text := s[len(digestPrefix):]
	for i := range d {
		hi, ok1 := hexDigit(text[2*i])
		lo, ok2 := hexDigit(text[2*i+1])
		if !ok1 || !ok2 {
			return digest{}, false
		}
		d[i] = hi<<4 | lo
	}
	return d, !d.isZero()
}

// digestWriters are reused: a writer's hash state and buffer would
// otherwise be allocated for every event, as the hash.Hash interface makes
// them escape.
var digestWriters = sync.Pool{New: func() any { return &digestWriter{h: sha256.New()} }}

// release resets d and returns it to digestWriters.
func (d *digestWriter) release() {
	d.h.Reset()
	d.n = 0
	clear(d.members) // holds views of the last object
	if cap(d.members) > maxPooledMembers {
		d.members = nil
	}
	d.members = d.members[:0]
	digestWriters.Put(d)
}

// maxPooledMembers bounds the sort buffer a pooled writer keeps.
const maxPooledMembers = 1024

// digestWriter feeds length-prefixed fields into a hash without allocating:
// strings are written through a read-only byte view, and JSON string tokens
// are unescaped through a small fixed buffer instead of being decoded into a
// new string first. A 1 MiB multi-line value (every newline escaped) costs
// no allocation.
type digestWriter struct {
	h   hash.Hash
	buf [512]byte
	n   int
	// sum receives the hash; members is the sort buffer of writeSection.
	sum     digest
	members []member
	// text receives a decoded value, if it fits: most values do.
	text [4096]byte
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
	d.writeRaw(s)
}

// writeJSONString writes the decoded value of a JSON string token (with its
// quotes) as a length-prefixed field, exactly as writeString would write the
// decoded string, so "\u003c" and "<" give the same digest.
func (d *digestWriter) writeJSONString(token string) {
	body := token[1 : len(token)-1]
	if len(body) <= len(d.text) {
		// One pass instead of two (length, then text). append grows past
		// the array only for invalid escapes, which decode longer.
		text := appendUnescaped(d.text[:0], body)
		d.writeUint(uint64(len(text)))
		if len(text) > 0 {
			d.writeRaw(unsafe.String(&text[0], len(text)))
		}
		return
	}
	d.writeUint(uint64(unescape(body, nil)))
	unescape(body, d)
}

// appendUnescaped appends the decoded JSON string body s to dst, exactly as
// unescape decodes it.
func appendUnescaped(dst []byte, s string) []byte {
	for {
		i := strings.IndexByte(s, '\\')
		if i < 0 || i == len(s)-1 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		r, size := decodeEscape(s[i:])
		dst = utf8.AppendRune(dst, r)
		s = s[i+size:]
	}
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
		v, ok := hexDigit(c)
		if !ok {
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	return r, true
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
