package policy

import (
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
	// recorded is the restarted-for annotation, zero when absent or unusable.
	recorded digest
	// intent is the restarting annotation: the round in progress, if any.
	intent intent
	// hash is the digest of data + binaryData, see dataHash.
	hash digest
	// version is metadata.resourceVersion as a number, 0 if it is not one.
	version uint64
}

func (cm configMap) key() string { return cm.namespace + "/" + cm.name }

// appendKey appends cm's key to b, so that a map lookup can use a buffer on
// the stack instead of a new string per event.
func (cm configMap) appendKey(b []byte) []byte {
	b = append(b, cm.namespace...)
	b = append(b, '/')
	return append(b, cm.name...)
}

// section is the raw JSON of data or binaryData, if the object has it.
type section struct {
	token string
	found bool
	// walked: members[:n] are the section's members, read along the way,
	// and the digest need not walk it again. Only an object of a few
	// string values, as most are, is walked so.
	walked  bool
	n       int
	members [8]member
}

// readSection reads the value of data or binaryData, the next in obj.
func readSection(obj *jsonview.Members) section {
	entries, ok := obj.Enter()
	if !ok {
		return section{token: obj.Value(), found: true}
	}
	s := section{found: true}
	onlyStrings := true
	for k, ok := entries.NextKey(); ok; k, ok = entries.NextKey() {
		v := entries.Value()
		if s.n < len(s.members) && isStringToken(v) {
			s.members[s.n] = member{keyToken: k, valueToken: v}
			s.n++
		} else {
			onlyStrings = false
		}
	}
	obj.Leave(entries)
	s.token = entries.Token()
	s.walked = onlyStrings && s.token != ""
	return s
}

// parseConfigMap reads the fields the controller needs from a ConfigMap's
// JSON, digest included, and copies the strings it keeps out of raw, which
// belongs to the decoder.
func parseConfigMap(raw []byte, selectorAnnotation string) (configMap, error) {
	cm, data, binaryData, err := readConfigMap(raw, selectorAnnotation)
	if err != nil {
		return configMap{}, err
	}
	cm.hash = dataHash(data, binaryData)
	cm.own()
	return cm, nil
}

// Fields of metadata that readConfigMap takes, as bits of a set.
const (
	haveNamespace = 1 << iota
	haveName
	haveUID
	haveVersion
	haveAnnotations
)

// readConfigMap reads the names and annotations of a ConfigMap's JSON and
// finds its data sections, in one pass over the object, metadata included.
// It leaves the digest to the caller, who may not need it. The strings of
// the result alias raw: own or keepFrom copies them.
//
// Where a key repeats, the first occurrence counts, except in annotations,
// where the last does: what gjson's Get and ForEach, which this replaces,
// did. raw must be well-formed JSON (the decoder and the list validate
// it); on anything else the result is unspecified but nothing panics.
func readConfigMap(raw []byte, selectorAnnotation string) (cm configMap, data, binaryData section, err error) {
	var annotations string
	haveMetadata := false
	obj := jsonview.ObjectMembers(jsonview.View(raw))
	for k, ok := obj.NextKey(); ok; k, ok = obj.NextKey() {
		switch name := jsonview.Key(k); {
		case name == "metadata" && !haveMetadata:
			haveMetadata = true
			if fields, ok := obj.Enter(); ok {
				annotations = cm.readMetadata(&fields)
				obj.Leave(fields)
			} else {
				obj.Value()
			}
		case name == "data" && !data.found:
			data = readSection(&obj)
		case name == "binaryData" && !binaryData.found:
			binaryData = readSection(&obj)
		default:
			obj.Value()
		}
	}
	if cm.name == "" || cm.namespace == "" {
		return configMap{}, section{}, section{}, errors.New("object has no metadata.name or metadata.namespace")
	}
	entries := jsonview.ObjectMembers(annotations)
	for k, v, ok := entries.Next(); ok; k, v, ok = entries.Next() {
		switch jsonview.Key(k) {
		case selectorAnnotation:
			cm.selector = jsonview.String(v)
			cm.hasSelector = true
		case RestartedForAnnotation:
			if d, ok := parseDigest(jsonview.String(v)); ok {
				cm.recorded = d
			}
		case RestartingAnnotation:
			cm.intent = parseIntent(jsonview.String(v))
		}
	}
	return cm, data, binaryData, nil
}

// readMetadata walks metadata's members to the end, taking the names into
// cm, and returns the annotations' raw JSON.
func (cm *configMap) readMetadata(fields *jsonview.Members) (annotations string) {
	var have int
	for k, ok := fields.NextKey(); ok; k, ok = fields.NextKey() {
		var field int
		switch jsonview.Key(k) {
		case "namespace":
			field = haveNamespace
		case "name":
			field = haveName
		case "uid":
			field = haveUID
		case "resourceVersion":
			field = haveVersion
		case "annotations":
			field = haveAnnotations
		}
		v := fields.Value()
		if field == 0 || have&field != 0 {
			continue
		}
		have |= field
		switch field {
		case haveNamespace:
			cm.namespace = jsonview.String(v)
		case haveName:
			cm.name = jsonview.String(v)
		case haveUID:
			cm.uid = jsonview.String(v)
		case haveVersion:
			// resourceVersions are opaque to clients, but every API server
			// backed by etcd serves its revision, a number that only grows;
			// where it is not a number, ordering is simply not checked.
			cm.version, _ = strconv.ParseUint(jsonview.String(v), 10, 64)
		case haveAnnotations:
			annotations = v
		}
	}
	return annotations
}

// own copies cm's strings out of the buffer they alias, in one allocation,
// and returns cm's key, which shares it.
func (cm *configMap) own() (key string) {
	all := cm.namespace + "/" + cm.name + cm.uid + cm.selector
	n := len(cm.namespace) + 1 + len(cm.name)
	key = all[:n]
	cm.namespace = key[:len(cm.namespace)]
	cm.name = key[len(cm.namespace)+1:]
	cm.uid = all[n : n+len(cm.uid)]
	cm.selector = all[n+len(cm.uid):]
	return key
}

// keepFrom makes cm's strings owned ones, taking them from prev, the state
// already kept for the same key, where they are equal: an event repeats
// almost all of them.
func (cm *configMap) keepFrom(prev configMap) {
	cm.namespace = keepString(cm.namespace, prev.namespace)
	cm.name = keepString(cm.name, prev.name)
	cm.uid = keepString(cm.uid, prev.uid)
	cm.selector = keepString(cm.selector, prev.selector)
}

func keepString(s, prev string) string {
	if s == prev {
		return prev
	}
	return strings.Clone(s)
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
	hash digest
	uids map[string]bool
}

// formatIntent renders "sha256:…/uid,uid,…".
func formatIntent(hash digest, pods []podRef) string {
	var b strings.Builder
	b.WriteString(hash.String())
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
	text, list, ok := strings.Cut(v, "/")
	if !ok {
		return intent{}
	}
	hash, ok := parseDigest(text)
	if !ok {
		return intent{}
	}
	in := intent{hash: hash, uids: map[string]bool{}}
	for _, uid := range strings.Split(list, ",") {
		if uid != "" {
			in.uids[strings.Clone(uid)] = true
		}
	}
	return in
}

// dataHash digests data and binaryData in an encoding where different
// content can never produce the same byte stream: every section, key and
// value is length-prefixed and keys are sorted, so the digest does not depend
// on the server's key order or JSON escaping. binaryData values are hashed as
// the base64 text the API serves, which is canonical.
func dataHash(data, binaryData section) digest {
	d := digestWriters.Get().(*digestWriter)
	defer d.release()
	writeSection(d, "data", &data)
	writeSection(d, "binaryData", &binaryData)
	d.flush()
	return digest(d.h.Sum(d.sum[:0]))
}

func writeSection(d *digestWriter, name string, s *section) {
	d.writeString(name)
	if len(s.token) == 0 || s.token[0] != '{' {
		// Absent or null is an empty section. Anything else is not a
		// ConfigMap the API would serve, but must still hash apart.
		if s.found && s.token != "null" {
			d.writeUint(^uint64(0))
			writeValue(d, s.token)
			return
		}
		d.writeUint(0)
		return
	}
	kvs := s.members[:s.n]
	if !s.walked {
		walked := d.members[:0]
		forEachMember(s.token, func(m member) { walked = append(walked, m) })
		d.members = walked
		kvs = walked
	}
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
		keyEnd := jsonview.StringEnd(obj, i)
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
			valueEnd = jsonview.StringEnd(obj, i)
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
