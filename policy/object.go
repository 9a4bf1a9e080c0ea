package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/internal/k8sname"
	"github.com/k8spatterns/config-watcher/internal/truncate"
	"github.com/k8spatterns/config-watcher/selector"
)

// kind is what a watched object is: it decides how its data is digested,
// where its state (R and I) lives, and how logs and Events name its data.
type kind uint8

const (
	kindConfigMap kind = iota
	// kindSecret: its state lives in a state ConfigMap (secret.go), and
	// nothing derived from its data is shown.
	kindSecret
)

// String is the kind's name in the API, as Events name it.
func (k kind) String() string {
	if k == kindSecret {
		return "Secret"
	}
	return "ConfigMap"
}

// logKey is the log attribute that names an object of the kind.
func (k kind) logKey() string {
	if k == kindSecret {
		return "secret"
	}
	return "configmap"
}

// keyOf is an object's key: a ConfigMap's "namespace/name", a Secret's
// "secret/namespace/name", so that the two never share one.
func keyOf(k kind, namespace, name string) string {
	if k == kindSecret {
		return "secret/" + namespace + "/" + name
	}
	return namespace + "/" + name
}

// object is what the controller keeps of an annotated ConfigMap or Secret:
// never the data, only its digest.
type object struct {
	kind                 kind
	namespace, name, uid string
	version              uint64 // metadata.resourceVersion, 0 if not a number
	selector             string // the selector annotation as written
	hasSelector          bool   // the annotation is present (an empty one is refused)
	// referencing is RestartReferencingAnnotation as written (refs.go).
	referencing    string
	hasReferencing bool
	hash           digest // D: dataHash, or secretHash for a Secret
	// keys are D's key digests (keys.go), for an object whose referencing
	// pods are restarted; "" for any other.
	keys   keyDigests
	stored stored // R and I as the server has them
	// stateOf names the Secret whose state this ConfigMap holds (secret.go);
	// such a ConfigMap is never acted on itself.
	stateOf string
	keyID   string // the digest key a state ConfigMap was written with
	mac     string // a state ConfigMap's StateMACAnnotation
	// ours: a state ConfigMap carries our label and its Secret as owner
	// (what writeSecretState writes); one that does not is not a state.
	// stateOwner is that Secret's uid.
	ours       bool
	stateOwner string
}

// stored is R and I as the server has them: on a ConfigMap itself, or on a
// Secret's state ConfigMap.
type stored struct {
	recorded digest // R as annotated; zero when absent or unusable
	// recordedKeys are R's key digests as annotated; "" when absent or
	// unusable.
	recordedKeys keyDigests
	intent       intent // I as annotated
	halted       halt   // HaltedAnnotation as annotated
	version      uint64 // the resourceVersion of the object that holds them
	holder       string // a Secret's: the uid of its state ConfigMap, "" if none known
	// known: the state can be told. A Secret's is not until the
	// ConfigMaps of its namespace have been listed: until then an absent
	// state ConfigMap may only not have arrived yet.
	known bool
}

func (obj object) key() string { return keyOf(obj.kind, obj.namespace, obj.name) }

// dataName names the object's data in Events: a ConfigMap's by its short
// digest, a Secret's by its resourceVersion (nothing derived from its data).
func (obj object) dataName() string {
	if obj.kind == kindSecret {
		return "resourceVersion " + strconv.FormatUint(obj.version, 10)
	}
	return "data " + truncate.String(obj.hash.text(), len(digestPrefix)+12)
}

// dataAttr names the object's data in logs, as dataName does.
func (obj object) dataAttr() slog.Attr {
	if obj.kind == kindSecret {
		return slog.Uint64("resource_version", obj.version)
	}
	return slog.Any("hash", obj.hash)
}

// parseObject reads a ConfigMap's or a Secret's JSON; nothing it returns
// aliases raw. Where a key repeats, the first occurrence counts, in
// annotations the last. key is the digest key of Secret data.
func parseObject(raw []byte, k kind, selectorAnnotation string, key []byte) (object, error) {
	// Read in place, through a string view of raw that does not outlive
	// this call; what is kept is cloned (TestParsedConfigMapOutlivesTheEvent).
	// A copy of the object (gjson.ParseBytes), and of each value to hash it,
	// raised the peak RSS at start with 900 KB ConfigMaps (the measurement:
	// bench/results/history.md).
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(raw), len(raw)))
	meta := doc.Get("metadata")
	obj := object{
		kind:      k,
		namespace: strings.Clone(meta.Get("namespace").String()),
		name:      strings.Clone(meta.Get("name").String()),
		uid:       strings.Clone(meta.Get("uid").String()),
	}
	if obj.name == "" || obj.namespace == "" {
		return object{}, errors.New("object has no metadata.name or metadata.namespace")
	}
	// Opaque to clients, but etcd's revision, a number that only grows;
	// where it is not a number, ordering is not checked.
	obj.version, _ = strconv.ParseUint(meta.Get("resourceVersion").String(), 10, 64)
	meta.Get("annotations").ForEach(func(a, v gjson.Result) bool {
		switch a.String() {
		// What is kept is bounded, whatever an annotation holds (up to
		// 256 KiB): a selector past selector.MaxLength is refused, and
		// the others' longer forms are never ours.
		case selectorAnnotation:
			obj.selector, obj.hasSelector = cloneAtMost(v.String(), selector.MaxLength+1), true
		case RestartReferencingAnnotation:
			obj.referencing, obj.hasReferencing = cloneAtMost(v.String(), maxReferencingText), true
		case RestartedForAnnotation:
			obj.stored.recorded, _ = parseDigest(v.String())
		case RestartedForKeysAnnotation:
			obj.stored.recordedKeys = parseKeyDigests(v.String())
		case RestartingAnnotation:
			obj.stored.intent = parseIntent(cloneAtMost(v.String(), maxIntentText+1))
		case HaltedAnnotation:
			obj.stored.halted = parseHalt(v.String())
		case StateOfSecretAnnotation:
			if len(v.String()) <= k8sname.MaxSubdomain {
				obj.stateOf = strings.Clone(v.String())
			}
		case DigestKeyIDAnnotation:
			obj.keyID = cloneAtMost(v.String(), 2*keyIDBytes+1)
		case StateMACAnnotation:
			obj.mac = cloneAtMost(v.String(), 2*sha256.Size+1)
		}
		return true
	})
	if k == kindSecret {
		// Its state is never read from it: it lives apart (secret.go).
		obj.stored, obj.stateOf, obj.keyID, obj.mac = stored{}, "", "", ""
		obj.hash = secretHash(key, obj.namespace, obj.name, doc.Get("data"))
		if obj.readsKeys() {
			obj.keys = secretKeys(key, obj.namespace, obj.name, doc.Get("data"))
		}
		return obj, nil
	}
	if obj.stateOf != "" {
		ownedBySecret := false
		meta.Get("ownerReferences").ForEach(func(_, o gjson.Result) bool {
			ownedBySecret = o.Get("kind").String() == "Secret" && o.Get("name").String() == obj.stateOf
			if ownedBySecret {
				obj.stateOwner = o.Get("uid").String()
			}
			return !ownedBySecret
		})
		obj.ours = ownedBySecret && meta.Get("labels").Get(gjson.Escape(managedByLabel)).String() == "config-watcher"
	}
	obj.stored.version, obj.stored.known = obj.version, true
	obj.hash = dataHash(doc.Get("data"), doc.Get("binaryData"))
	if obj.readsKeys() {
		obj.keys = configMapKeys(doc.Get("data"), doc.Get("binaryData"))
		if obj.stored.recordedKeys == obj.keys {
			obj.stored.recordedKeys = obj.keys // one copy, not two
		}
	}
	return obj, nil
}

// cloneAtMost clones at most n bytes of s: enough to tell that it is too
// long, without keeping it.
func cloneAtMost(s string, n int) string { return strings.Clone(s[:min(len(s), n)]) }

// dataHash digests data and binaryData length-prefixed with sorted keys, so
// that different content never gives the same stream and the server's key
// order and escaping do not matter (binaryData as its canonical base64).
// Keys and values are read as the server serves them (served).
// TestDigestIsPinned pins it: records written earlier must keep matching.
func dataHash(data, binaryData gjson.Result) digest {
	h := sha256.New()
	writeSection(h, "data", data, writeValue)
	writeSection(h, "binaryData", binaryData, writeValue)
	return digest{sum: [sha256.Size]byte(h.Sum(nil))}
}

// writeSection writes one map of the object's data, each value with
// writeValue.
func writeSection(h hash.Hash, name string, s gjson.Result, writeValue func(hash.Hash, gjson.Result)) {
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
