package jsonview

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestBytesAliasesBuffer ensures Bytes returns the object's own bytes without
// a copy, so a handler reads a large object in place.
func TestBytesAliasesBuffer(t *testing.T) {
	buf := []byte(`{"type":"ADDED","object":{"a":[1,2]}}`)
	obj := Bytes(buf, Parse(buf).Get("object"))
	assert.Equal(t, `{"a":[1,2]}`, string(obj))
	buf[len(buf)-4] = '3' // visible through obj only if it aliases buf
	assert.Equal(t, `{"a":[1,3]}`, string(obj))
}

// TestBytesOfForeignResultCopies ensures a result that does not come from the
// buffer is copied rather than sliced out of unrelated memory.
func TestBytesOfForeignResultCopies(t *testing.T) {
	buf := []byte(`{"a":1}`)
	other := Parse([]byte(`{"b":2}`)).Get("b")
	assert.Equal(t, "2", string(Bytes(buf, other)))
	assert.Nil(t, Bytes(nil, other))
	assert.False(t, Parse(nil).Exists())
}
