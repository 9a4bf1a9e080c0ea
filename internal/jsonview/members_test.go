package jsonview

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/tidwall/gjson"
)

// TestValidAgreesWithGJSON ensures the validator accepts exactly what
// gjson's, which it replaces, accepts, on the shapes most likely to differ.
func TestValidAgreesWithGJSON(t *testing.T) {
	for _, tt := range []struct{ name, in string }{
		{"Empty", ``},
		{"Space", " \n"},
		{"EmptyObject", `{}`},
		{"EmptyArray", ` [ ] `},
		{"Nested", `{"a":[1,{"b":null},[],{}],"c":{"d":"e"}}`},
		{"TrailingNewline", "{\"type\":\"ADDED\"}\n"},
		{"TrailingGarbage", `{} x`},
		{"TwoValues", `{} {}`},
		{"TrailingComma", `{"a":1,}`},
		{"TrailingCommaArray", `[1,]`},
		{"MissingColon", `{"a" 1}`},
		{"KeyNotString", `{a:1}`},
		{"Unclosed", `{"a":[1,2}`},
		{"MismatchedClose", `[1}`},
		{"LeadingZero", `01`},
		{"Numbers", `[0,-0,1.5,-1e10,2E+3,3e-2,12345678901234567890]`},
		{"BadFraction", `1.`},
		{"BadExponent", `1e`},
		{"LoneMinus", `-`},
		{"PlusSign", `+1`},
		{"Literals", `[true,false,null]`},
		{"BadLiteral", `[tru]`},
		{"LiteralPrefix", `nulll`},
		{"Escapes", `"\"\\\/\b\f\n\r\t\u00e9\uD83D"`},
		{"BadEscape", `"\x"`},
		{"ShortUnicodeEscape", `"\u12"`},
		{"BadHexEscape", `"\u12g4"`},
		{"ControlCharacter", "\"a\tb\""},
		{"DeleteCharacter", "\"a\x7fb\""},
		{"InvalidUTF8", "\"\xff\xfe\""},
		{"UnclosedString", `"abc`},
		{"BackslashAtEnd", `"abc\`},
		{"LongString", `"` + strings.Repeat(`abcdefgh\n`, 100) + `"`},
		{"QuoteAfterEightBytes", `"abcdefgh"`},
		{"ControlAfterEightBytes", "\"abcdefgh\x01\""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, gjson.Valid(tt.in), Valid([]byte(tt.in)))
		})
	}
}

// TestValidDeepNesting ensures no nesting depth exhausts the stack.
func TestValidDeepNesting(t *testing.T) {
	const depth = 1 << 20
	assert.True(t, Valid([]byte(strings.Repeat("[", depth)+strings.Repeat("]", depth))))
	assert.False(t, Valid([]byte(strings.Repeat(`{"a":`, depth))))
}

// FuzzValid ensures the validator agrees with gjson's and encoding/json's.
func FuzzValid(f *testing.F) {
	for _, s := range []string{`{"a":[1,"b\n",{"c":null}]}`, `"\u00e9"`, `-1.5e+3`, `[tru]`, "\"\x01\"", `{"a":1,}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got := Valid(in)
		if want := gjson.ValidBytes(in); got != want {
			t.Fatalf("Valid(%q) = %v, gjson says %v", in, got, want)
		}
		if want := json.Valid(in); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", in, got, want)
		}
	})
}

// TestMembersYieldsTopLevelOnly ensures one pass hands out each member of
// the object, nested values whole, with keys as sent.
func TestMembersYieldsTopLevelOnly(t *testing.T) {
	obj := ` { "a" : 1 , "b":{"x":[1,"}"]},"c\"d":"e\\\"","f":[],"g":null,"h":true}`
	var got []string
	m := ObjectMembers(obj)
	for k, v, ok := m.Next(); ok; k, v, ok = m.Next() {
		got = append(got, k+"="+v)
	}
	assert.Equal(t, []string{`"a"=1`, `"b"={"x":[1,"}"]}`, `"c\"d"="e\\\""`, `"f"=[]`, `"g"=null`, `"h"=true`}, got)
}

// TestMembersOfNonObjectIsEmpty ensures anything but an object has no
// members, and a cut-off object ends the walk without reading beyond it.
func TestMembersOfNonObjectIsEmpty(t *testing.T) {
	for _, in := range []string{``, `[1,2]`, `"a"`, `null`, `{"a":`, `{"a":"b`, `{"a" 1}`, `{"a":[1,2`} {
		m := ObjectMembers(in)
		var n int
		for _, _, ok := m.Next(); ok; _, _, ok = m.Next() {
			n++
		}
		assert.Zero(t, n, "%q", in)
	}
}

// TestKeyAndStringReadLikeGJSON ensures tokens read as gjson's
// Result.String reads them, escapes and non-strings included.
func TestKeyAndStringReadLikeGJSON(t *testing.T) {
	for _, token := range []string{`"plain"`, `"n\u0061me"`, `"a\"b"`, `""`, `null`, `true`, `false`, `42`, `-1.5e3`, `{"a":1}`, `[1]`} {
		assert.Equal(t, gjson.Parse(token).String(), String(token), token)
	}
	assert.Equal(t, "name", Key(`"n\u0061me"`))
	assert.Equal(t, "name", Key(`"name"`))
	assert.Equal(t, "", Key(`"`))
}

// FuzzMembers ensures the walk sees, on any valid object, the members
// gjson's ForEach sees, as the same raw text, and never panics on anything.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":{"c":[1,2,"]"]},"d":"e\"f"}`, `{}`, `{"a":"\\"}`, `[1]`, `{"a":`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		m := ObjectMembers(in)
		var got []string
		for k, v, ok := m.Next(); ok; k, v, ok = m.Next() {
			got = append(got, k, v)
		}
		if !gjson.Valid(in) || !gjson.Parse(in).IsObject() {
			return
		}
		var want []string
		gjson.Parse(in).ForEach(func(k, v gjson.Result) bool {
			want = append(want, k.Raw, v.Raw)
			return true
		})
		assert.Equal(t, want, got)
	})
}

// FuzzStringEnd ensures the quote search ends a string exactly where a
// byte-by-byte scan does.
func FuzzStringEnd(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\"b"`, `"a\\"b"`, `"a\\\"b"`, `"abc`, `"\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) == 0 || s[0] != '"' {
			return
		}
		want := -1
		for j := 1; j < len(s); j++ {
			if s[j] == '\\' {
				j++
			} else if s[j] == '"' {
				want = j + 1
				break
			}
		}
		if got := StringEnd(s, 0); got != want {
			t.Fatalf("StringEnd(%q) = %d, want %d", s, got, want)
		}
	})
}
