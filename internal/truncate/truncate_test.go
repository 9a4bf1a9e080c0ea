package truncate

import (
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// TestString ensures short text is kept as it is and longer text is cut to
// at most n bytes, marked, never inside a rune.
func TestString(t *testing.T) {
	tests := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{name: "ShortKept", s: "abc", n: 3, want: "abc"},
		{name: "LongCutAndMarked", s: "abcdef", n: 3, want: "abc…"},
		{name: "CutInsideRuneBacksOff", s: "aé", n: 2, want: "a…"}, // é is 2 bytes
		{name: "CutAfterRuneKeepsIt", s: "éab", n: 2, want: "é…"},
		{name: "CutInsideFirstRuneLeavesMarker", s: "日本", n: 2, want: "…"}, // 3 bytes each
		{name: "ZeroLeavesMarker", s: "abc", n: 0, want: "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := String(tt.s, tt.n)
			assert.Equal(t, tt.want, got)
			assert.True(t, utf8.ValidString(got))
		})
	}
}
