package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// configMap is what the controller keeps of a ConfigMap: never the data,
// only its digest.
type configMap struct {
	namespace, name, uid string
	version              uint64 // metadata.resourceVersion, 0 if not a number
	selector             string // the selector annotation as written
	hasSelector          bool   // the annotation is present (an empty one is refused)
	recorded             digest // R as annotated; zero when absent or unusable
	intent               intent // I as annotated
	hash                 digest // D: dataHash of data and binaryData
}

func (cm configMap) key() string { return cm.namespace + "/" + cm.name }

// parseConfigMap reads a ConfigMap's JSON; nothing it returns aliases raw.
// Where a key repeats, the first occurrence counts, in annotations the last.
func parseConfigMap(raw []byte, selectorAnnotation string) (configMap, error) {
	// In place: gjson's []byte functions copy what they return, and a value
	// may be 1 MiB. What is kept is cloned.
	obj := gjson.Parse(unsafe.String(unsafe.SliceData(raw), len(raw)))
	meta := obj.Get("metadata")
	cm := configMap{
		namespace: strings.Clone(meta.Get("namespace").String()),
		name:      strings.Clone(meta.Get("name").String()),
		uid:       strings.Clone(meta.Get("uid").String()),
	}
	if cm.name == "" || cm.namespace == "" {
		return configMap{}, errors.New("object has no metadata.name or metadata.namespace")
	}
	// Opaque to clients, but etcd's revision, a number that only grows;
	// where it is not a number, ordering is not checked.
	cm.version, _ = strconv.ParseUint(meta.Get("resourceVersion").String(), 10, 64)
	meta.Get("annotations").ForEach(func(k, v gjson.Result) bool {
		switch k.String() {
		case selectorAnnotation:
			cm.selector, cm.hasSelector = strings.Clone(v.String()), true
		case RestartedForAnnotation:
			cm.recorded, _ = parseDigest(v.String())
		case RestartingAnnotation:
			cm.intent = parseIntent(strings.Clone(v.String()))
		}
		return true
	})
	cm.hash = dataHash(obj.Get("data"), obj.Get("binaryData"))
	return cm, nil
}

// dataHash digests data and binaryData length-prefixed with sorted keys, so
// that different content never gives the same stream and the server's key
// order and escaping do not matter (binaryData as its canonical base64).
// Keys and values are read as the server serves them (served).
// TestDigestIsPinned pins it: records written earlier must keep matching.
func dataHash(data, binaryData gjson.Result) digest {
	h := sha256.New()
	writeSection(h, "data", data)
	writeSection(h, "binaryData", binaryData)
	return digest(h.Sum(nil))
}

func writeSection(h hash.Hash, name string, s gjson.Result) {
	writeString(h, name)
	switch {
	case !s.Exists() || s.Type == gjson.Null:
		writeUint(h, 0)
	case !s.IsObject():
		// Not a ConfigMap the API would serve, but it must still hash apart.
		writeUint(h, ^uint64(0))
		writeValue(h, s)
	default:
		type member struct {
			key   string
			value gjson.Result
		}
		var members []member
		s.ForEach(func(k, v gjson.Result) bool {
			members = append(members, member{served(k.String()), v})
			return true
		})
		slices.SortStableFunc(members, func(a, b member) int { return cmp.Compare(a.key, b.key) })
		writeUint(h, uint64(len(members)))
		for _, m := range members {
			writeString(h, m.key)
			writeValue(h, m.value)
		}
	}
}

// writeValue writes a string decoded; anything else (the API never serves
// it) as raw text, tagged apart.
func writeValue(h hash.Hash, v gjson.Result) {
	if v.Type == gjson.String {
		h.Write([]byte{'s'})
		writeString(h, served(v.String()))
		return
	}
	h.Write([]byte{'r'})
	writeString(h, v.Raw)
}

// served returns s as the API server would serve it: each byte that is not
// part of valid UTF-8 as one U+FFFD, as encoding/json decodes and encodes
// it (strings.ToValidUTF8 would make a whole run of them one U+FFFD). A
// server never sends invalid UTF-8, but the same content must have one
// digest however it was encoded; gjson passes such bytes through.
func served(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

func writeString(h hash.Hash, s string) {
	writeUint(h, uint64(len(s)))
	h.Write(unsafe.Slice(unsafe.StringData(s), len(s))) // not a copy of a value of up to 1 MiB; Write keeps nothing
}

func writeUint(h hash.Hash, n uint64) { h.Write(binary.BigEndian.AppendUint64(nil, n)) }
