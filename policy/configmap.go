package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
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
	// intent is the restarting annotation: the round in progress, if any.
	intent intent
	// hash is the digest of data + binaryData, see dataHash.
	hash string
	// version is metadata.resourceVersion as a number, 0 if it is not one.
	version uint64
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
	// resourceVersions are opaque to clients, but every API server backed by
	// etcd serves its revision, a number that only grows; where it is not a
	// number, ordering is simply not checked.
	cm.version, _ = strconv.ParseUint(meta.Get("resourceVersion").String(), 10, 64)
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
		case RestartingAnnotation:
			cm.intent = parseIntent(v.String())
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

// RestartingAnnotation is written as a round begins: the digest it restarts
// for and the uids of the pods that existed then. A controller killed in
// the middle of the round resumes it from there and leaves alone the pods
// created since, which already run the new data. It is removed when the
// round's record is written.
const RestartingAnnotation = "config-watcher.k8spatterns.io/restarting"

// maxIntentPods bounds the intent's size (a uid is 36 bytes; annotations
// may total 256 KiB). A larger round goes without one.
const maxIntentPods = 2000

// intent is a round in progress, as recorded on the ConfigMap.
type intent struct {
	hash string
	uids map[string]bool
}

// formatIntent renders "sha256:…/uid,uid,…".
func formatIntent(hash string, pods []podRef) string {
	var b strings.Builder
	b.WriteString(hash)
	b.WriteByte('/')
	for i, p := range pods {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p.uid)
	}
	return b.String()
}

func parseIntent(v string) intent {
	hash, list, ok := strings.Cut(v, "/")
	if !ok || !isDigest(hash) {
		return intent{}
	}
	in := intent{hash: strings.Clone(hash), uids: map[string]bool{}}
	for _, uid := range strings.Split(list, ",") {
		if uid != "" {
			in.uids[strings.Clone(uid)] = true
		}
	}
	return in
}

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
	d := digestWriter{h: sha256.New()}
	writeSection(&d, "data", obj.Get("data"))
	writeSection(&d, "binaryData", obj.Get("binaryData"))
	d.flush()
	var sum [sha256.Size]byte
	return digestPrefix + hex.EncodeToString(d.h.Sum(sum[:0]))
}

func writeSection(d *digestWriter, name string, section gjson.Result) {
	d.writeString(name)
	if !section.IsObject() {
		// Absent or null is an empty section. Anything else is not a
		// ConfigMap the API would serve, but must still hash apart.
		if section.Exists() && section.Type != gjson.Null {
			d.writeUint(^uint64(0))
			writeValue(d, section.Raw)
			return
		}
		d.writeUint(0)
		return
	}
	var kvs []member
	forEachMember(section.Raw, func(m member) { kvs = append(kvs, m) })
	slices.SortFunc(kvs, func(a, b member) int { return strings.Compare(a.key(), b.key()) })
	d.writeUint(uint64(len(kvs)))
	for _, kv := range kvs {
		d.writeJSONString(kv.keyToken)
		writeValue(d, kv.valueToken)
	}
}

// writeValue writes a string value decoded; anything else (the API never
// serves it) as raw text, tagged apart, so that it still hashes differently.
func writeValue(d *digestWriter, token string) {
	if isStringToken(token) {
		d.writeByte('s')
		d.writeJSONString(token)
		return
	}
	d.writeByte('r')
	d.writeString(token)
}

// member is one "key": value pair of a JSON object, as raw tokens.
type member struct{ keyToken, valueToken string }

// key is the decoded key; keys almost never need unescaping.
func (m member) key() string {
	if strings.IndexByte(m.keyToken, '\\') < 0 {
		return m.keyToken[1 : len(m.keyToken)-1]
	}
	return gjson.Parse(m.keyToken).String()
}

func isStringToken(tok string) bool { return len(tok) >= 2 && tok[0] == '"' }

// forEachMember calls fn for each member of a JSON object, as raw tokens.
// Unlike gjson's ForEach it does not unescape string values, which would
// allocate a copy of every multi-line value. It stops at anything that is
// not a well-formed object; it never reads out of bounds.
func forEachMember(obj string, fn func(member)) {
	if len(obj) < 2 || obj[0] != '{' {
		return
	}
	i := 1
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] == '}' {
			return
		}
		if obj[i] == ',' {
			i++
			continue
		}
		if obj[i] != '"' {
			return
		}
		keyEnd := stringEnd(obj, i)
		if keyEnd < 0 {
			return
		}
		key := obj[i:keyEnd]
		i = skipSpace(obj, keyEnd)
		if i >= len(obj) || obj[i] != ':' {
			return
		}
		i = skipSpace(obj, i+1)
		if i >= len(obj) {
			return
		}
		var valueEnd int
		if obj[i] == '"' {
			valueEnd = stringEnd(obj, i)
		} else {
			valueEnd = i + len(gjson.Parse(obj[i:]).Raw)
		}
		if valueEnd <= i || valueEnd > len(obj) {
			return
		}
		fn(member{keyToken: key, valueToken: obj[i:valueEnd]})
		i = valueEnd
	}
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the closing quote of the string token
// starting at s[i], or -1 if it is not closed.
func stringEnd(s string, i int) int {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}
