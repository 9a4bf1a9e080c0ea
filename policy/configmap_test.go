package policy

import (
	"crypto/sha256"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/tidwall/gjson"
)

// gjsonConfigMap is how parseConfigMap read a ConfigMap before its single
// pass (commit abd5c39): one gjson Get per field. It is the reference the
// pass must agree with.
func gjsonConfigMap(raw []byte, selectorAnnotation string) (configMap, bool) {
	obj := gjson.ParseBytes(raw)
	meta := obj.Get("metadata")
	cm := configMap{namespace: meta.Get("namespace").String(), name: meta.Get("name").String(), uid: meta.Get("uid").String()}
	cm.version, _ = strconv.ParseUint(meta.Get("resourceVersion").String(), 10, 64)
	if cm.name == "" || cm.namespace == "" {
		return configMap{}, false
	}
	meta.Get("annotations").ForEach(func(k, v gjson.Result) bool {
		switch k.String() {
		case selectorAnnotation:
			cm.selector, cm.hasSelector = v.String(), true
		case RestartedForAnnotation:
			if d, ok := parseDigest(v.String()); ok {
				cm.recorded = d
			}
		case RestartingAnnotation:
			cm.intent = parseIntent(v.String())
		}
		return true
	})
	d := digestWriter{h: sha256.New()}
	for _, name := range []string{"data", "binaryData"} {
		section := obj.Get(name)
		d.writeString(name)
		switch {
		case section.IsObject():
			var kvs []member
			forEachMember(section.Raw, func(m member) { kvs = append(kvs, m) })
			slices.SortFunc(kvs, func(a, b member) int { return strings.Compare(a.key(), b.key()) })
			d.writeUint(uint64(len(kvs)))
			for _, kv := range kvs {
				d.writeJSONString(kv.keyToken)
				writeValue(&d, kv.valueToken)
			}
		case section.Exists() && section.Type != gjson.Null:
			d.writeUint(^uint64(0))
			writeValue(&d, section.Raw)
		default:
			d.writeUint(0)
		}
	}
	d.flush()
	cm.hash = digest(d.h.Sum(nil))
	return cm, true
}

// TestParseConfigMapReadsLikeGJSON ensures the single pass reads what one
// gjson Get per field read, on the shapes where they could part: repeated
// keys, escaped keys, values that are not strings, sections that are not
// objects.
func TestParseConfigMapReadsLikeGJSON(t *testing.T) {
	const ann = `"annotations":{"k8spatterns.io/podDeleteSelector":"app=web"}`
	for _, tt := range []struct{ name, raw string }{
		{"Plain", `{"metadata":{"name":"c","namespace":"n","uid":"u","resourceVersion":"7",` + ann + `},"data":{"a":"1"}}`},
		{"RepeatedMetadataFirstCounts", `{"metadata":{"name":"c","namespace":"n"},"metadata":{"name":"d","namespace":"m"}}`},
		{"RepeatedNameFirstCounts", `{"metadata":{"name":"c","namespace":"n","name":"d"}}`},
		{"EscapedKeys", `{"m\u0065tadata":{"n\u0061me":"c","namespace":"n"},"d\u0061ta":{"a":"1"}}`},
		{"EscapedValues", `{"metadata":{"name":"\u0063","namespace":"n\"x",` + ann + `}}`},
		{"RepeatedAnnotationLastCounts", `{"metadata":{"name":"c","namespace":"n","annotations":{"k8spatterns.io/podDeleteSelector":"a=1","k8spatterns.io/podDeleteSelector":"b=2"}}}`},
		{"NullSelector", `{"metadata":{"name":"c","namespace":"n","annotations":{"k8spatterns.io/podDeleteSelector":null}}}`},
		{"NumberValues", `{"metadata":{"name":1,"namespace":2.5,"uid":true,"resourceVersion":12}}`},
		{"ObjectName", `{"metadata":{"name":{"a":1},"namespace":"n"}}`},
		{"MetadataNotAnObject", `{"metadata":"x"}`},
		{"AnnotationsNotAnObject", `{"metadata":{"name":"c","namespace":"n","annotations":["k8spatterns.io/podDeleteSelector"]}}`},
		{"NotAnObject", `[1,2]`},
		{"Records", `{"metadata":{"name":"c","namespace":"n","annotations":{"config-watcher.k8spatterns.io/restarted-for":"sha256:9df22baa5d3027697581a97a76161b639b16a9125e7b46cb8a890887d6c2135b","config-watcher.k8spatterns.io/restarting":"sha256:9df22baa5d3027697581a97a76161b639b16a9125e7b46cb8a890887d6c2135b/u1,u2"}}}`},
		{"ManySections", `{"metadata":{"name":"c","namespace":"n"},"binaryData":{"b":"AA=="},"data":{"z":"1","y":"2","x":"3","w":"4","v":"5","u":"6","t":"7","s":"8","r":"9"}}`},
		{"NonStringData", `{"metadata":{"name":"c","namespace":"n"},"data":{"a":"1","o":{"x":[1]},"b":"2"}}`},
		{"Whitespace", " {\n \"metadata\" : { \"name\" : \"c\" , \"namespace\" : \"n\" } ,\n \"data\" : { \"a\" : \"1\" } } "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assertReadsLikeGJSON(t, []byte(tt.raw))
		})
	}
}

// FuzzParseConfigMapReadsLikeGJSON ensures the same on any valid JSON: the
// only input the controller reads (the decoder and the list validate it).
func FuzzParseConfigMapReadsLikeGJSON(f *testing.F) {
	f.Add([]byte(`{"metadata":{"name":"c","namespace":"n","annotations":{"k8spatterns.io/podDeleteSelector":"a"}},"data":{"a":"b\n"}}`))
	f.Add([]byte(`{"metadata":{"name":"c","namespace":"n"},"data":{"a":1,"b":[1,{"x":"y"}],"c":null}}`))
	f.Add([]byte(`{"metadata":{"name":"c","namespace":"n","name":"d"},"binaryData":{"k":"AAE="},"data":"x"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !gjson.ValidBytes(raw) {
			return
		}
		assertReadsLikeGJSON(t, raw)
	})
}

func assertReadsLikeGJSON(t *testing.T, raw []byte) {
	t.Helper()
	want, wantOK := gjsonConfigMap(raw, DefaultSelectorAnnotation)
	got, err := parseConfigMap(raw, DefaultSelectorAnnotation)
	if assert.Equal(t, wantOK, err == nil, "%s", raw) && wantOK {
		assert.Equal(t, want, got, "%s", raw)
	}
}
