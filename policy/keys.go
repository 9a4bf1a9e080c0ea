package policy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"slices"
	"strings"

	"github.com/tidwall/gjson"
)

// RestartedForKeysAnnotation is beside R (on a ConfigMap, or in a Secret's
// state ConfigMap) for an object with RestartReferencingAnnotation: a short
// digest of each key of the data R was recorded for, so that a later round
// restarts, of the pods that read keys by name, only those that read a key
// added, removed or changed (docs/design.md#pods-that-reference-the-object).
// A ConfigMap's: "sha256:" and "key=<16 hex digits>" for each key, joined
// by ","; a Secret's: "hmac-sha256:" and, for each key, 16 hex digits of a
// keyed digest of its name and 16 of its value (nothing of a Secret's keys
// or data is shown, and apiclient hides the whole text in refusals).
const RestartedForKeysAnnotation = "config-watcher.k8spatterns.io/restarted-for-keys"

// keyDigests is the text of RestartedForKeysAnnotation: a short digest of
// each key of an object's data. "" is none (not computed, unreadable, or
// more than maxKeyDigestsText would hold): every reader is restarted.
type keyDigests string

const (
	// keyDigestBytes is the length of a short digest: 64 bits make a
	// collision between a key's old and new value (a change not seen)
	// a matter of 2^-64.
	keyDigestBytes = 8
	keyDigestHex   = 2 * keyDigestBytes
	// maxKeyDigestsText bounds the annotation, and what an entry keeps of
	// it (annotations total 256 KiB): an object with more keys than fit
	// records none, and each of its changes restarts every reader.
	maxKeyDigestsText = 16 << 10
)

// configMapKeys digests each key of a ConfigMap's data and binaryData
// (the section, the key and its value, as dataHash reads them); "" if a
// key could not be written in the annotation's form (only a server that
// does not validate keys serves one).
func configMapKeys(data, binaryData gjson.Result) keyDigests {
	var entries []string
	ok := true
	for _, s := range []struct {
		name string
		m    gjson.Result
	}{{"data", data}, {"binaryData", binaryData}} {
		if s.m.Exists() && s.m.Type != gjson.Null && !s.m.IsObject() {
			return ""
		}
		s.m.ForEach(func(k, v gjson.Result) bool {
			key := served(k.String())
			if key == "" || strings.ContainsAny(key, ",=") {
				ok = false
				return false
			}
			h := sha256.New()
			writeString(h, s.name)
			writeString(h, key)
			writeValue(h, v)
			entries = append(entries, key+"="+hex.EncodeToString(h.Sum(nil)[:keyDigestBytes]))
			return true
		})
	}
	if !ok {
		return ""
	}
	slices.Sort(entries)
	return boundKeys(digestPrefix + strings.Join(entries, ","))
}

// secretKeys digests each key of a Secret's data, its name and its
// decoded value apart, under the namespace's key and after the Secret's
// namespace and name, as secretHash digests the whole.
func secretKeys(key []byte, namespace, name string, data gjson.Result) keyDigests {
	if data.Exists() && data.Type != gjson.Null && !data.IsObject() {
		return ""
	}
	nsKey := namespaceKey(key, namespace)
	var entries []string
	data.ForEach(func(k, v gjson.Result) bool {
		m := secretKeyHash(nsKey, namespace, name, "key value", k.String())
		writeDecoded(m, v)
		entries = append(entries, secretKeyName(nsKey, namespace, name, k.String())+hex.EncodeToString(m.Sum(nil)[:keyDigestBytes]))
		return true
	})
	slices.Sort(entries)
	return boundKeys(keyedDigestPrefix + strings.Join(entries, ""))
}

// secretKeyName is a Secret key's name as its state shows it: a keyed
// digest, so that a pod's key is found without the name being written.
func secretKeyName(nsKey []byte, namespace, name, key string) string {
	return hex.EncodeToString(secretKeyHash(nsKey, namespace, name, "key name", key).Sum(nil)[:keyDigestBytes])
}

func secretKeyHash(nsKey []byte, namespace, name, what, key string) hash.Hash {
	m := hmac.New(sha256.New, nsKey)
	writeString(m, "config-watcher "+what)
	writeString(m, namespace)
	writeString(m, name)
	writeString(m, served(key))
	return m
}

func boundKeys(text string) keyDigests {
	if len(text) > maxKeyDigestsText {
		return ""
	}
	return keyDigests(text)
}

// parseKeyDigests reads the annotation; what cannot be read is none.
func parseKeyDigests(v string) keyDigests {
	if len(v) > maxKeyDigestsText {
		return ""
	}
	k := keyDigests(v)
	if _, ok := k.entries(); !ok {
		return ""
	}
	return keyDigests(strings.Clone(v))
}

// entries returns each key's digest by its name (a Secret's: by its
// name's digest); false if there are none.
func (k keyDigests) entries() (map[string]string, bool) {
	if list, ok := strings.CutPrefix(string(k), keyedDigestPrefix); ok {
		if len(list)%(2*keyDigestHex) != 0 || !isHex(list) {
			return nil, false
		}
		m := make(map[string]string, len(list)/(2*keyDigestHex))
		for i := 0; i < len(list); i += 2 * keyDigestHex {
			m[list[i:i+keyDigestHex]] = list[i+keyDigestHex : i+2*keyDigestHex]
		}
		return m, true
	}
	list, ok := strings.CutPrefix(string(k), digestPrefix)
	if !ok {
		return nil, false
	}
	m := map[string]string{}
	if list == "" {
		return m, true
	}
	for entry := range strings.SplitSeq(list, ",") {
		name, sum, found := strings.Cut(entry, "=")
		if !found || name == "" || len(sum) != keyDigestHex || !isHex(sum) {
			return nil, false
		}
		m[name] = sum
	}
	return m, true
}

func isHex(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') })
}

// changedKeys returns the keys (a Secret's: their names' digests) added,
// removed or changed from recorded to now; known is false where either is
// none: then which changed is not known.
func changedKeys(recorded, now keyDigests) (keys map[string]bool, known bool) {
	before, ok1 := recorded.entries()
	after, ok2 := now.entries()
	if !ok1 || !ok2 || strings.HasPrefix(string(recorded), keyedDigestPrefix) != strings.HasPrefix(string(now), keyedDigestPrefix) {
		return nil, false
	}
	keys = map[string]bool{}
	for name, sum := range before {
		if after[name] != sum {
			keys[name] = true
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			keys[name] = true
		}
	}
	return keys, true
}

// narrow makes a referencing selection restart, of the pods that read keys
// by name, only those that read a key changed from recorded to the data
// now (obj.keys); with no digests on either side, all of them. For a
// Secret, a pod's keys are looked up by their names' digests.
//
// Only a round that begins with no intent is narrowed: only then does
// every pod read R's values. With an intent left (a round interrupted,
// halted or superseded) the pods are mixed: a replacement runs the values
// of I, or of an intent before I that I superseded, and a key set back to
// R's value is a change for it. Which keys differ would take every such
// intent's digests, so every reader is restarted instead. A resumed intent
// names the pods its round took, already narrowed (or, "*", not known:
// every reader).
func (c *Controller) narrow(sel *selection, obj object, recorded keyDigests) {
	if sel.ref == nil {
		return
	}
	keys, known := changedKeys(recorded, obj.keys)
	if !known {
		return
	}
	rule := *sel.ref
	rule.all, rule.keys = false, keys
	if obj.kind == kindSecret {
		nsKey := namespaceKey(c.cfg.DigestKey, obj.namespace)
		rule.keyName = func(k string) string { return secretKeyName(nsKey, obj.namespace, obj.name, k) }
	}
	sel.ref = &rule
}

// readsKeys: obj is opted in by RestartReferencingAnnotation, and its key
// digests are kept.
func (obj object) readsKeys() bool {
	return obj.hasReferencing && obj.referencing == "true"
}
