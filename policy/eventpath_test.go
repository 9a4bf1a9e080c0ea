package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/k8spatterns/config-watcher/watch"
)

// eventLoop yields one recorded event line over and over, so one decoder
// can read b.N events without the benchmark re-creating it.
type eventLoop struct {
	data []byte
	off  int
}

func (r *eventLoop) Read(p []byte) (int, error) {
	n := copy(p, r.data[r.off:])
	r.off = (r.off + n) % len(r.data)
	return n, nil
}

// recordedEvent returns the first line of a recorded watch stream.
func recordedEvent(b *testing.B, file string) []byte {
	raw, err := os.ReadFile("../testdata/recorded/" + file)
	if err != nil {
		b.Fatal(err)
	}
	i := bytes.IndexByte(raw, '\n')
	if i < 0 {
		b.Fatalf("%s: no complete line", file)
	}
	return raw[:i+1]
}

// BenchmarkEventPath measures what the controller does with every watch
// event, end to end in one process: watch.Decoder.Next on a recorded real
// MODIFIED event, then parseConfigMap (names, annotations, data digest).
// The same run decodes the same bytes with encoding/json into structs, both
// alone (the baseline) and followed by the same kind of digest (the
// like-for-like comparison), so the ratios come from one machine state.
func BenchmarkEventPath(b *testing.B) {
	sizes := []struct{ name, file string }{
		{"1KiB", "modified-1kib.ndjson"},
		{"100KiB", "modified-100kib.ndjson"},
		{"1MiB", "modified-1mib.ndjson"},
	}
	b.Run("config-watcher", func(b *testing.B) {
		for _, s := range sizes {
			line := recordedEvent(b, s.file)
			b.Run(s.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(line)))
				dec := watch.NewDecoder(&eventLoop{data: line})
				for b.Loop() {
					ev, err := dec.Next()
					if err != nil {
						b.Fatal(err)
					}
					cm, err := parseObject(ev.Object, kindConfigMap, DefaultSelectorAnnotation, nil)
					if err != nil || cm.hash.isZero() || !cm.hasSelector {
						b.Fatalf("parse: %v %+v", err, cm)
					}
				}
			})
		}
	})
	type jsonEvent struct {
		Type   string `json:"type"`
		Object struct {
			Metadata struct {
				Name            string            `json:"name"`
				Namespace       string            `json:"namespace"`
				UID             string            `json:"uid"`
				ResourceVersion string            `json:"resourceVersion"`
				Annotations     map[string]string `json:"annotations"`
			} `json:"metadata"`
			Data       map[string]string `json:"data"`
			BinaryData map[string][]byte `json:"binaryData"`
		} `json:"object"`
	}
	for _, variant := range []string{"encoding_json", "encoding_json+digest"} {
		b.Run(variant, func(b *testing.B) {
			for _, s := range sizes {
				line := recordedEvent(b, s.file)
				b.Run(s.name, func(b *testing.B) {
					b.ReportAllocs()
					b.SetBytes(int64(len(line)))
					dec := json.NewDecoder(&eventLoop{data: line})
					for b.Loop() {
						var ev jsonEvent
						if err := dec.Decode(&ev); err != nil {
							b.Fatal(err)
						}
						if ev.Object.Metadata.Annotations[DefaultSelectorAnnotation] == "" {
							b.Fatal("no selector")
						}
						if variant == "encoding_json+digest" {
							h := sha256.New()
							keys := make([]string, 0, len(ev.Object.Data))
							for k := range ev.Object.Data {
								keys = append(keys, k)
							}
							slices.Sort(keys)
							var n [8]byte
							for _, k := range keys {
								binary.BigEndian.PutUint64(n[:], uint64(len(k)))
								h.Write(n[:])
								h.Write([]byte(k))
								v := ev.Object.Data[k]
								binary.BigEndian.PutUint64(n[:], uint64(len(v)))
								h.Write(n[:])
								h.Write([]byte(v))
							}
							_ = h.Sum(nil)
						}
					}
				})
			}
		})
	}
}
