package jsonview

import (
	"testing"

	"github.com/tidwall/gjson"
)

// TestArrayIteratesOnlyArrays ensures a list's items are iterated only when
// they are an array: "items": null (an empty metadata-only list), a missing
// field or any other value yields nothing.
func TestArrayIteratesOnlyArrays(t *testing.T) {
	tests := []struct {
		name string
		json string
		want int
	}{
		{"two items", `{"items":[{"a":1},{"a":2}]}`, 2},
		{"empty array", `{"items":[]}`, 0},
		{"null", `{"items":null}`, 0},
		{"missing", `{}`, 0},
		{"an object", `{"items":{"a":1}}`, 0},
		{"a string", `{"items":"x"}`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := 0
			Array(gjson.Get(tt.json, "items")).ForEach(func(_, _ gjson.Result) bool { n++; return true })
			if n != tt.want {
				t.Errorf("iterated %d values, want %d", n, tt.want)
			}
		})
	}
}
