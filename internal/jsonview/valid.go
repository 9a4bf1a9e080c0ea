package jsonview

import (
	"encoding/binary"
	"math/bits"
)

// Valid reports whether buf is one well-formed JSON value (RFC 8259; like
// encoding/json, it does not check that strings are valid UTF-8). It is the
// first pass over every watch line, so strings, most of a ConfigMap, are
// scanned eight bytes at a time. It keeps the nesting on a stack of its
// own rather than recursing, so no depth exhausts the goroutine's stack.
func Valid(buf []byte) bool { return ValidVisit(buf, nil) }

// ValidVisit is Valid, and if buf is an object, it also calls visit with
// the key token and value token of each of its members, views of buf: the
// caller finds what it needs of a line without a second pass over it.
// visit may be nil.
func ValidVisit(buf []byte, visit func(key, value string)) bool {
	var nestingBuf [64]byte
	nesting := nestingBuf[:0] // '{' or '[' for each open container
	view := View(buf)
	var key string // of the root object's member being read
	var start int  // of its value
	i := skipSpaceBytes(buf, 0)
	for {
		// A value starts at i.
		if i >= len(buf) {
			return false
		}
		switch c := buf[i]; {
		case c == '{' || c == '[':
			closing := byte('}')
			if c == '[' {
				closing = ']'
			}
			i = skipSpaceBytes(buf, i+1)
			if i < len(buf) && buf[i] == closing {
				i++
				break
			}
			nesting = append(nesting, c)
			if c == '{' {
				keyStart := i
				keyEnd, next := validKey(buf, i)
				if next < 0 {
					return false
				}
				if len(nesting) == 1 {
					key, start = view[keyStart:keyEnd], next
				}
				i = next
			}
			continue
		case c == '"':
			if i = validString(buf, i+1); i < 0 {
				return false
			}
		case c == 't':
			if i = validLiteral(buf, i, "true"); i < 0 {
				return false
			}
		case c == 'f':
			if i = validLiteral(buf, i, "false"); i < 0 {
				return false
			}
		case c == 'n':
			if i = validLiteral(buf, i, "null"); i < 0 {
				return false
			}
		default:
			if i = validNumber(buf, i); i < 0 {
				return false
			}
		}
		// A value ended at i: close containers, or go on to the next
		// element or member.
		for {
			if len(nesting) == 1 && nesting[0] == '{' && visit != nil {
				visit(key, view[start:i])
			}
			i = skipSpaceBytes(buf, i)
			if len(nesting) == 0 {
				return i == len(buf)
			}
			if i >= len(buf) {
				return false
			}
			open := nesting[len(nesting)-1]
			switch {
			case buf[i] == ',':
				i = skipSpaceBytes(buf, i+1)
				if open == '{' {
					keyStart := i
					keyEnd, next := validKey(buf, i)
					if next < 0 {
						return false
					}
					if len(nesting) == 1 {
						key, start = view[keyStart:keyEnd], next
					}
					i = next
				}
			case open == '{' && buf[i] == '}', open == '[' && buf[i] == ']':
				nesting = nesting[:len(nesting)-1]
				i++
				continue
			default:
				return false
			}
			break
		}
	}
}

// validKey checks `"key" :` at i and returns the index after the key's
// closing quote and the index after the colon and any space (next), or
// next = -1.
func validKey(buf []byte, i int) (keyEnd, next int) {
	if i >= len(buf) || buf[i] != '"' {
		return 0, -1
	}
	if keyEnd = validString(buf, i+1); keyEnd < 0 {
		return 0, -1
	}
	i = skipSpaceBytes(buf, keyEnd)
	if i >= len(buf) || buf[i] != ':' {
		return 0, -1
	}
	return keyEnd, skipSpaceBytes(buf, i+1)
}

// Masks for finding a byte in eight at once: a byte's high bit is set in
// hasZero(x) exactly when some byte of x is zero (bits above the first
// zero byte may be set too, which is why a hit is looked at byte by byte).
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

func hasZero(x uint64) uint64 { return (x - ones) & ^x & highs }

// special marks the bytes of eight string bytes that need a look: quotes,
// backslashes and control characters (below 0x20). The lowest mark is
// always a true one, so the first such byte is at TrailingZeros64/8.
func special(x uint64) uint64 {
	// Flipping bit 1 moves the quote (0x22) to 0x20 and keeps control
	// characters below it, so one comparison finds both.
	return hasLess(x^(ones*0x02), 0x21) | hasZero(x^(ones*'\\'))
}

// hasLess marks the bytes of x below n (n <= 0x80), as hasZero does zeros.
func hasLess(x uint64, n uint64) uint64 { return (x - ones*n) & ^x & highs }

// nextSpecial returns the index of the first byte from i on that special
// marks, or len(buf).
func nextSpecial(buf []byte, i int) int {
	for ; i+16 <= len(buf); i += 16 {
		w := buf[i : i+16 : i+16]
		if m := special(binary.LittleEndian.Uint64(w[:8])); m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
		if m := special(binary.LittleEndian.Uint64(w[8:])); m != 0 {
			return i + 8 + bits.TrailingZeros64(m)/8
		}
	}
	for ; i < len(buf); i++ {
		if c := buf[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
	}
	return i
}

// validString checks a string whose opening quote is before i and returns
// the index after its closing quote, or -1.
func validString(buf []byte, i int) int {
	for {
		i = nextSpecial(buf, i)
		if i >= len(buf) {
			return -1
		}
		switch c := buf[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			if i+1 >= len(buf) {
				return -1
			}
			switch buf[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(buf) {
					return -1
				}
				for _, h := range buf[i+2 : i+6] {
					if _, ok := hexValue(h); !ok {
						return -1
					}
				}
				i += 6
			default:
				return -1
			}
		default:
			i++
		}
	}
}

func hexValue(c byte) (byte, bool) {
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

func validLiteral(buf []byte, i int, lit string) int {
	if len(buf)-i < len(lit) || string(buf[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// validNumber checks -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at i
// and returns the index after it, or -1.
func validNumber(buf []byte, i int) int {
	if i < len(buf) && buf[i] == '-' {
		i++
	}
	switch {
	case i < len(buf) && buf[i] == '0':
		i++
	case i < len(buf) && buf[i] >= '1' && buf[i] <= '9':
		i = skipDigits(buf, i+1)
	default:
		return -1
	}
	if i < len(buf) && buf[i] == '.' {
		if i+1 >= len(buf) || !isDigit(buf[i+1]) {
			return -1
		}
		i = skipDigits(buf, i+1)
	}
	if i < len(buf) && (buf[i] == 'e' || buf[i] == 'E') {
		i++
		if i < len(buf) && (buf[i] == '+' || buf[i] == '-') {
			i++
		}
		if i >= len(buf) || !isDigit(buf[i]) {
			return -1
		}
		i = skipDigits(buf, i)
	}
	return i
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func skipDigits(buf []byte, i int) int {
	for i < len(buf) && isDigit(buf[i]) {
		i++
	}
	return i
}

func skipSpaceBytes(buf []byte, i int) int {
	for i < len(buf) && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r') {
		i++
	}
	return i
}
