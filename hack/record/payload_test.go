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
