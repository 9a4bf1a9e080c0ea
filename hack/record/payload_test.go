package main

import (
	"testing"
	"unicode/utf8"
)

// TestPayloadSize ensures payload stays within the size asked for (keys counted, as the
// API server counts them against its 1 MiB limit), comes close to it, and is valid UTF-8.
func TestPayloadSize(t *testing.T) {
	for _, size := range []int{1 << 10, 100 << 10, 1<<20 - 1<<10} {
		total := 0
		for k, v := range payload(uint64(size), size) {
			total += len(k) + len(v)
			if !utf8.ValidString(v) {
				t.Errorf("size %d: key %s is not valid UTF-8", size, k)
			}
		}
		if total > size || total < size-16 {
			t.Errorf("payload(%d) holds %d bytes", size, total)
		}
	}
}

// TestTextIsDeterministic ensures a recording can be reproduced: same seed, same text.
func TestTextIsDeterministic(t *testing.T) {
	if text(7, 500) != text(7, 500) {
		t.Error("text(7, 500) differs between calls")
	}
	if text(7, 500) == text(8, 500) {
		t.Error("text ignores its seed")
	}
}

// TestBinaryIsNotUTF8 ensures the Secret's binary value is bytes no string
// conversion survives, and the same on every recording.
func TestBinaryIsNotUTF8(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		if utf8.Valid(binary(seed, 32)) {
			t.Errorf("binary(%d, 32) is valid UTF-8", seed)
		}
		if string(binary(seed, 32)) != string(binary(seed, 32)) {
			t.Errorf("binary(%d, 32) differs between calls", seed)
		}
	}
	if string(binary(1, 32)) == string(binary(2, 32)) {
		t.Error("binary ignores its seed")
	}
}
