// Command record prints a ConfigMap for hack/record.sh, which records the MODIFIED
// event of its change (testdata/recorded/modified-*.ndjson): about SIZE bytes of data in
// keys part-NNN.txt of at most 64 KiB, annotated to select app=webapp.
//
//	go run ./hack/record NAME SEED SIZE
//
// The data is pseudo-random text, the same for the same SEED, with quotes, backslashes,
// tabs and non-ASCII so that JSON escaping is exercised. It is made here rather than in
// the script because it must be the same on every recording (policy's
// TestDigestOfRecordedEventsIsPinned pins its digest), which takes a seeded generator
// that a shell does not have.
package main

import (
	"encoding/json"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("record: ")
	if len(os.Args) != 4 {
		log.Fatal("usage: record NAME SEED SIZE")
	}
	seed, err := strconv.ParseUint(os.Args[2], 10, 64)
	if err != nil {
		log.Fatalf("SEED: %v", err)
	}
	size, err := strconv.Atoi(os.Args[3])
	if err != nil || size <= 0 {
		log.Fatalf("SIZE must be a positive number of bytes, not %q", os.Args[3])
	}
	b, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": os.Args[1],
			"annotations": map[string]string{"k8spatterns.io/podDeleteSelector": "app=webapp"}},
		"data": payload(seed, size),
	})
	if err != nil {
		log.Fatal(err)
	}
	os.Stdout.Write(append(b, '\n'))
}

// text returns n bytes of random-looking but harmless English-ish text, the same for
// the same seed: lines of words with the odd quote, backslash and tab.
func text(seed uint64, n int) string {
	words := strings.Fields(`lorem ipsum config watcher pod deployment replica label selector annotation
		namespace ambassador proxy stream bookmark event resource version restart rollout sidecar
		kubernetes pattern immutable declarative health probe quota limit node cluster volume mount
		"quoted" back\slash tab	stop über café naïve 東京 data binary hash digest`)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var b strings.Builder
	col := 0
	for b.Len() < n {
		w := words[rng.IntN(len(words))]
		if col+len(w) > 72 {
			b.WriteByte('\n')
			col = 0
		} else if col > 0 {
			b.WriteByte(' ')
			col++
		}
		b.WriteString(w)
		col += len(w)
	}
	return b.String()[:n]
}

// payload splits about size bytes of text into keys of at most 64 KiB, counting keys
// too, as the API server does when it enforces the 1 MiB limit.
func payload(seed uint64, size int) map[string]string {
	const chunk = 64 << 10
	data := map[string]string{}
	for i := 0; size > 0; i++ {
		key := fmt.Sprintf("part-%03d.txt", i)
		n := min(chunk, size-len(key))
		// Cut on a rune boundary: the text has multi-byte runes.
		v := []rune(text(seed+uint64(i), n))
		s := string(v)
		for len(s) > n {
			v = v[:len(v)-1]
			s = string(v)
		}
		data[key] = s
		size -= len(key) + len(s)
		if n < 1 {
			break
		}
	}
	return data
}
