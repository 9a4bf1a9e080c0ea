package policy

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash"
	"slices"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/internal/jsonview"
)

// configMap is what the controller keeps of a ConfigMap: names, the two
// annotations it reads, and a digest of the data. Never the data itself.
type configMap struct {
	namespace, name, uid string
	// selector is the raw value of the selector annotation; hasSelector
	// tells an absent annotation from an empty one (which is refused).
	selector    string
	hasSelector bool
	// recorded is the restarted-for annotation, "" when absent or unusable.
	recorded string
	// hash is the digest of data + binaryData, see dataHash.
	hash string
}

func (cm configMap) key() string { return cm.namespace + "/" + cm.name }

// parseConfigMap reads the fields the controller needs from a ConfigMap's
// JSON. Strings kept are copied out of raw, which belongs to the decoder.
func parseConfigMap(raw []byte, selectorAnnotation string) (configMap, error) {
	obj := jsonview.Parse(raw)
	meta := obj.Get("metadata")
	cm := configMap{
		namespace: strings.Clone(meta.Get("namespace").String()),
		name:      strings.Clone(meta.Get("name").String()),
		uid:       strings.Clone(meta.Get("uid").String()),
	}
	if cm.name == "" || cm.namespace == "" {
		return configMap{}, errors.New("object has no metadata.name or metadata.namespace")
	}
	meta.Get("annotations").ForEach(func(k, v gjson.Result) bool {
		switch k.String() {
		case selectorAnnotation:
			cm.selector = strings.Clone(v.String())
			cm.hasSelector = true
		case RestartedForAnnotation:
			if isDigest(v.String()) {
				cm.recorded = strings.Clone(v.String())
			}
		}
		return true
	})
	cm.hash = dataHash(obj)
	return cm, nil
}

// RestartedForAnnotation holds, on each ConfigMap the controller acts for,
// the digest of the data its pods were last restarted for (or that the
// controller adopted). It is what makes restarts exactly-once across
// controller restarts and lost watch history.
const RestartedForAnnotation = "config-watcher.k8spatterns.io/restarted-for"

const digestPrefix = "sha256:"

func isDigest(s string) bool {
	if !strings.HasPrefix(s, digestPrefix) || len(s) != len(digestPrefix)+2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(s[len(digestPrefix):])
	return err == nil
}

// dataHash digests data and binaryData in an encoding where different
// content can never produce the same byte stream: every section, key and
// value is length-prefixed and keys are sorted, so the digest does not depend
// on the server's key order or JSON escaping. binaryData values are hashed as
// the base64 text the API serves, which is canonical.
func dataHash(obj gjson.Result) string {
	h := sha256.New()
	writeSection(h, "data", obj.Get("data"))
	writeSection(h, "binaryData", obj.Get("binaryData"))
	return digestPrefix + hex.EncodeToString(h.Sum(nil))
}

type entryKV struct{ key, value gjson.Result }

func writeSection(h hash.Hash, name string, section gjson.Result) {
	writeField(h, name)
	if !section.IsObject() {
		// Absent or null is an empty section. Anything else is not a
		// ConfigMap the API would serve, but must still hash apart.
		if section.Exists() && section.Type != gjson.Null {
			writeUint(h, ^uint64(0))
			writeField(h, section.Raw)
			return
		}
		writeUint(h, 0)
		return
	}
	var kvs []entryKV
	section.ForEach(func(k, v gjson.Result) bool {
		kvs = append(kvs, entryKV{k, v})
		return true
	})
	slices.SortFunc(kvs, func(a, b entryKV) int { return strings.Compare(a.key.String(), b.key.String()) })
	writeUint(h, uint64(len(kvs)))
	for _, kv := range kvs {
		writeField(h, kv.key.String())
		if kv.value.Type == gjson.String {
			h.Write([]byte{'s'})
			writeField(h, kv.value.String())
		} else {
			// Not a string: the API never serves this, but a different raw
			// value must still give a different digest.
			h.Write([]byte{'r'})
			writeField(h, kv.value.Raw)
		}
	}
}

func writeField(h hash.Hash, s string) {
	writeUint(h, uint64(len(s)))
	h.Write([]byte(s))
}

func writeUint(h hash.Hash, n uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	h.Write(b[:])
}
