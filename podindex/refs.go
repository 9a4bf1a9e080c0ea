package podindex

import (
	"cmp"
	"iter"
	"slices"
	"strings"
	"unique"

	"github.com/tidwall/gjson"
)

// RefKind is the kind of object a pod reads.
type RefKind uint8

const (
	RefConfigMap RefKind = iota + 1
	RefSecret
)

// Refs are the ConfigMaps and Secrets a pod's containers read, and the keys
// they read of each: interned, so that the pods of one template (which read
// the same) share one copy, and a pod costs the index one word for them.
// The zero Refs reads nothing.
type Refs struct {
	h unique.Handle[string] // the canonical text (encode); zero: none
}

// Ref is one object a pod reads: by kind and name, the whole of it (Whole)
// or the keys named (sorted, without repeats).
type Ref struct {
	Kind  RefKind
	Name  string
	Whole bool
	Keys  []string
}

// The canonical text: one entry per object, sorted by kind and name,
// separated by refSep; an entry is the kind's letter, the name, and, unless
// the object is read whole, keySep and the keys, sorted, joined by keySep.
// Names and keys holding a control character (no valid name or key does)
// are skipped by ParseRefs, so the separators cannot occur in them.
const (
	refSep = "\x1e"
	keySep = "\x1f"
)

// All yields every object the pod reads.
func (r Refs) All() iter.Seq[Ref] {
	return func(yield func(Ref) bool) {
		if r.h == (unique.Handle[string]{}) {
			return
		}
		for entry := range strings.SplitSeq(r.h.Value(), refSep) {
			if !yield(decodeRef(entry)) {
				return
			}
		}
	}
}

// Reads returns what the pod reads of the object kind/name: found is false
// if it does not reference it.
func (r Refs) Reads(kind RefKind, name string) (ref Ref, found bool) {
	if r.h == (unique.Handle[string]{}) {
		return Ref{}, false
	}
	prefix := string(kindLetter(kind)) + name
	for entry := range strings.SplitSeq(r.h.Value(), refSep) {
		if rest, ok := strings.CutPrefix(entry, prefix); ok && (rest == "" || strings.HasPrefix(rest, keySep)) {
			return decodeRef(entry), true
		}
	}
	return Ref{}, false
}

// Empty reports whether the pod reads no ConfigMap or Secret.
func (r Refs) Empty() bool { return r.h == (unique.Handle[string]{}) }

// String is the references for tests and debugging: "ConfigMap/a[k1,k2] Secret/b".
func (r Refs) String() string {
	var parts []string
	for ref := range r.All() {
		s := "ConfigMap/"
		if ref.Kind == RefSecret {
			s = "Secret/"
		}
		s += ref.Name
		if !ref.Whole {
			s += "[" + strings.Join(ref.Keys, ",") + "]"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

func kindLetter(k RefKind) byte {
	if k == RefSecret {
		return 'S'
	}
	return 'C'
}

func decodeRef(entry string) Ref {
	ref := Ref{Kind: RefConfigMap}
	if entry != "" && entry[0] == 'S' {
		ref.Kind = RefSecret
	}
	name, keys, hasKeys := strings.Cut(entry[min(1, len(entry)):], keySep)
	ref.Name, ref.Whole = name, !hasKeys
	if hasKeys && keys != "" {
		ref.Keys = strings.Split(keys, keySep)
	}
	return ref
}

// ParseRefs reads what a pod spec references: volumes (configMap, secret,
// and the configMap and secret sources of a projected volume; a volume
// with items reads their keys, one without reads the whole object), and in
// containers and initContainers envFrom (whole) and env's configMapKeyRef
// and secretKeyRef (one key). Not ephemeralContainers: a running pod can
// gain them, and its replacement would not have them. Not imagePullSecrets
// or CSI volumes: the kubelet reads those, not the containers. An optional
// reference counts like any other: the key or object may come later, and
// then the pod would read it.
func ParseRefs(spec gjson.Result) Refs {
	var refs []Ref
	add := func(kind RefKind, name gjson.Result, keys []string) {
		if n := name.String(); n != "" && !hasControl(n) {
			refs = append(refs, Ref{Kind: kind, Name: n, Whole: keys == nil, Keys: keys})
		}
	}
	spec.Get("volumes").ForEach(func(_, v gjson.Result) bool {
		if cm := v.Get("configMap"); cm.Exists() {
			add(RefConfigMap, cm.Get("name"), itemKeys(cm))
		}
		if s := v.Get("secret"); s.Exists() {
			add(RefSecret, s.Get("secretName"), itemKeys(s))
		}
		v.Get("projected.sources").ForEach(func(_, src gjson.Result) bool {
			if cm := src.Get("configMap"); cm.Exists() {
				add(RefConfigMap, cm.Get("name"), itemKeys(cm))
			}
			if s := src.Get("secret"); s.Exists() {
				add(RefSecret, s.Get("name"), itemKeys(s))
			}
			return true
		})
		return true
	})
	for _, list := range []string{"containers", "initContainers"} {
		spec.Get(list).ForEach(func(_, c gjson.Result) bool {
			c.Get("envFrom").ForEach(func(_, from gjson.Result) bool {
				if cm := from.Get("configMapRef"); cm.Exists() {
					add(RefConfigMap, cm.Get("name"), nil)
				}
				if s := from.Get("secretRef"); s.Exists() {
					add(RefSecret, s.Get("name"), nil)
				}
				return true
			})
			c.Get("env").ForEach(func(_, env gjson.Result) bool {
				if cm := env.Get("valueFrom.configMapKeyRef"); cm.Exists() {
					add(RefConfigMap, cm.Get("name"), oneKey(cm))
				}
				if s := env.Get("valueFrom.secretKeyRef"); s.Exists() {
					add(RefSecret, s.Get("name"), oneKey(s))
				}
				return true
			})
			return true
		})
	}
	return MakeRefs(refs)
}

// MakeRefs interns refs: the same object referenced twice is read whole if
// either reads it whole, else for the keys of both.
func MakeRefs(refs []Ref) Refs {
	if len(refs) == 0 {
		return Refs{}
	}
	slices.SortFunc(refs, func(a, b Ref) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name))
	})
	var b strings.Builder
	for i := 0; i < len(refs); {
		ref := refs[i]
		whole, keys := ref.Whole, slices.Clone(ref.Keys)
		for i++; i < len(refs) && refs[i].Kind == ref.Kind && refs[i].Name == ref.Name; i++ {
			whole = whole || refs[i].Whole
			keys = append(keys, refs[i].Keys...)
		}
		if b.Len() > 0 {
			b.WriteString(refSep)
		}
		b.WriteByte(kindLetter(ref.Kind))
		b.WriteString(ref.Name)
		if whole {
			continue
		}
		slices.Sort(keys)
		b.WriteString(keySep) // even for no key: read by key, none valid
		b.WriteString(strings.Join(slices.Compact(keys), keySep))
	}
	return Refs{h: unique.Make(b.String())}
}

// itemKeys returns the keys a volume source's items read; nil (the whole
// object) without items. A key with a control character (not a valid key)
// is left out; a source whose every key is, reads none of the object's.
func itemKeys(src gjson.Result) []string {
	items := src.Get("items")
	if !items.IsArray() || len(items.Array()) == 0 {
		return nil
	}
	keys := []string{}
	items.ForEach(func(_, item gjson.Result) bool {
		if k := item.Get("key").String(); k != "" && !hasControl(k) {
			keys = append(keys, k)
		}
		return true
	})
	return keys
}

// oneKey is an env var's key as a list; an empty one (not valid) reads none.
func oneKey(ref gjson.Result) []string {
	if k := ref.Get("key").String(); k != "" && !hasControl(k) {
		return []string{k}
	}
	return []string{}
}

func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}
