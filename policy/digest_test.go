package policy

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

func digestOf(t *testing.T, data map[string]string) string {
	raw, err := json.Marshal(map[string]any{"metadata": map[string]string{"name": "c", "namespace": "n"}, "data": data})
	require.NoError(t, err)
	cm, err := parseObject(raw, kindConfigMap, DefaultSelectorAnnotation, nil)
	require.NoError(t, err)
	return cm.hash.text()
}

// FuzzDataHashUnambiguous ensures two ConfigMaps hash alike exactly when
// their data is equal: no choice of keys and values makes different data
// collide by construction (e.g. by moving bytes between a key and a value,
// or between two entries).
func FuzzDataHashUnambiguous(f *testing.F) {
	f.Add("a", "bc", "ab", "c")
	f.Add("k", "", "k", "")
	f.Add("x\x00", "y", "x", "\x00y")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		m1 := roundTrip(t, map[string]string{k1: v1})
		m2 := roundTrip(t, map[string]string{k2: v2})
		m3 := roundTrip(t, map[string]string{k1: v1, k2: v2})
		pairs := [][2]map[string]string{{m1, m2}, {m1, m3}, {m2, m3}}
		for _, p := range pairs {
			same := fmt.Sprint(p[0]) == fmt.Sprint(p[1])
			if (digestOf(t, p[0]) == digestOf(t, p[1])) != same {
				t.Fatalf("data %q and %q: equal=%v but digests equal=%v", p[0], p[1], same, !same)
			}
		}
	})
}

// roundTrip normalizes a map the way the API would store it (invalid UTF-8
// becomes U+FFFD).
func roundTrip(t *testing.T, m map[string]string) map[string]string {
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	var out map[string]string
	require.NoError(t, json.Unmarshal(raw, &out))
	return out
}

// BenchmarkParseConfigMap measures reading a ConfigMap event's object
// (names, annotations, data digest) at three sizes, with multi-line values
// so that every value needs unescaping.
func BenchmarkParseConfigMap(b *testing.B) {
	for _, size := range []int{1 << 10, 100 << 10, 1 << 20} {
		line := strings.Repeat("key = some configuration value\n", 1)
		var data = map[string]string{}
		for i := 0; len(fmt.Sprint(data)) < size; i++ {
			data[fmt.Sprintf("file-%d.conf", i)] = strings.Repeat(line, 1024/len(line)+1)
		}
		raw, _ := json.Marshal(map[string]any{
			"kind": "ConfigMap", "apiVersion": "v1",
			"metadata": map[string]any{"name": "webapp-config", "namespace": "default", "uid": "u",
				"annotations": map[string]string{DefaultSelectorAnnotation: "app=webapp"}},
			"data": data,
		})
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if _, err := parseObject(raw, kindConfigMap, DefaultSelectorAnnotation, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestParsedConfigMapOutlivesTheEvent ensures nothing parseConfigMap
// returns aliases the event's bytes, which it reads in place: the watch
// reuses them for the next event.
func TestParsedConfigMapOutlivesTheEvent(t *testing.T) {
	raw := []byte(`{"metadata":{"name":"cfg","namespace":"ns","uid":"u-1","annotations":{"` + DefaultSelectorAnnotation + `":"app=web","` +
		RestartingAnnotation + `":"sha256:` + strings.Repeat("ab", 32) + `/u-7","` + StateOfSecretAnnotation + `":"creds","` +
		DigestKeyIDAnnotation + `":"key-1"}},"data":{"k":"v"}}`)
	cm, err := parseObject(raw, kindConfigMap, DefaultSelectorAnnotation, nil)
	require.NoError(t, err)
	want := cm
	want.stored.intent = parseIntent(strings.Clone(cm.stored.intent.text))
	for i := range raw {
		raw[i] = 'x'
	}
	assert.Equal(t, want, cm)
	assert.Equal(t, "cfg", cm.name)
	assert.Equal(t, "ns", cm.namespace)
	assert.Equal(t, "u-1", cm.uid)
	assert.Equal(t, "app=web", cm.selector)
	assert.True(t, cm.stored.intent.uids()["u-7"])
	assert.Equal(t, "creds", cm.stateOf)
	assert.Equal(t, "key-1", cm.keyID)
}

// FuzzParseConfigMap ensures no input makes reading an object panic, and
// that re-encoding the same content (other escaping, other key order)
// keeps the digest.
func FuzzParseConfigMap(f *testing.F) {
	f.Add([]byte(`{"metadata":{"name":"c","namespace":"n"},"data":{"a":"b\n","c":"\u003c"}}`))
	f.Add([]byte(`{"metadata":{"name":"c","namespace":"n"},"data":{"a":1,"b":[1,{"x":"y"}],"c":null}}`))
	f.Add([]byte(`{"metadata":{"name":"c","namespace":"n"},"data":{"a":"`))
	f.Add([]byte(`{"metadata":{"name":"c","namespace":"n"},"binaryData":{"k":"AAE="},"data":"x"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		cm, err := parseObject(raw, kindConfigMap, DefaultSelectorAnnotation, nil)
		if err != nil {
			return
		}
		var obj map[string]any
		if json.Unmarshal(raw, &obj) != nil {
			return
		}
		again, err := json.Marshal(obj)
		require.NoError(t, err)
		cm2, err := parseObject(again, kindConfigMap, DefaultSelectorAnnotation, nil)
		require.NoError(t, err)
		if apiShaped(obj) && !hasDuplicateKeys(raw, obj) && cm.hash != cm2.hash {
			t.Fatalf("digest changed after re-encoding %s as %s", raw, again)
		}
	})
}

// apiShaped reports whether data and binaryData are what the API serves:
// absent, null, or objects of strings. Only for those is the digest
// independent of the encoding; other values hash as raw text.
func apiShaped(obj map[string]any) bool {
	for _, section := range []string{"data", "binaryData"} {
		v, ok := obj[section]
		if !ok || v == nil {
			continue
		}
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for _, x := range m {
			if _, ok := x.(string); !ok {
				return false
			}
		}
	}
	return true
}

// hasDuplicateKeys reports whether a section repeats a key, which
// encoding/json collapses while the digest keeps both.
func hasDuplicateKeys(raw []byte, obj map[string]any) bool {
	for _, section := range []string{"data", "binaryData"} {
		m, ok := obj[section].(map[string]any)
		if !ok {
			continue
		}
		n := 0
		gjson.GetBytes(raw, section).ForEach(func(_, _ gjson.Result) bool { n++; return true })
		if n != len(m) {
			return true
		}
	}
	return false
}

// TestDigestIsPinned ensures the digest of given content never changes: it
// is persisted in RestartedForAnnotation on users' ConfigMaps, and a new
// value for the same data would restart every annotated ConfigMap's pods
// once after an upgrade. The values were computed by the first release's
// implementation; never update them. Reading invalid UTF-8 as U+FFFD
// (TestDigestReadsInvalidUTF8AsTheServerServesIt) changed no pinned value:
// a real server never sends invalid UTF-8, so no stored record depends on
// how it hashed.
func TestDigestIsPinned(t *testing.T) {
	const meta = `"metadata":{"name":"c","namespace":"n"}`
	for _, tt := range []struct{ name, raw, want string }{
		{"NoSections", `{` + meta + `}`, "sha256:9df22baa5d3027697581a97a76161b639b16a9125e7b46cb8a890887d6c2135b"},
		{"NullSections", `{` + meta + `,"data":null,"binaryData":null}`, "sha256:9df22baa5d3027697581a97a76161b639b16a9125e7b46cb8a890887d6c2135b"},
		{"EmptyData", `{` + meta + `,"data":{}}`, "sha256:9df22baa5d3027697581a97a76161b639b16a9125e7b46cb8a890887d6c2135b"},
		{"OneKey", `{` + meta + `,"data":{"message":"Hello Kubernetes Patterns"}}`, "sha256:eb14bb9b91e297b9529f43db98d5b1a0d8716314bb7fd0bd295ac28eb0adcfcb"},
		{"KeysSorted", `{` + meta + `,"data":{"b":"2","a":"1","c":""}}`, "sha256:321341fe7e91282f5072653c8b191e93071bbde67a5c4e755bdfa6a689d52ad5"},
		{"Escapes", `{` + meta + `,"data":{"a\u0062":"line\n\"q\"\\\/\t\u003c\u00e9\ud83d\ude00 \ud83dx"}}`, "sha256:ed4b19572ba2f7859ae2c3dfb43575f5df76752e02ef3e8c6f5aa33a3cba824f"},
		{"RawUTF8", `{` + meta + `,"data":{"k":"žluťoučký 東京"}}`, "sha256:01ba0c4e1edad78ad48278b15939f095104ea7216339b93e145be2b789edb19d"},
		{"BinaryData", `{` + meta + `,"binaryData":{"blob":"AAECAw=="}}`, "sha256:de003d517a6662215c4bd11ad8c5b84be7d880c4d3e04ca9378a8eb3310e43fd"},
		{"DataAndBinaryData", `{` + meta + `,"binaryData":{"x":"AA=="},"data":{"x":"y"}}`, "sha256:bbbde2407cd3172bfcb50f418e5db811d103b86127c8e4e3ac8d0f9470360533"},
		// The API serves only strings in data; other values must only hash
		// apart. (The first release hashed an object value together with
		// the rest of its section's text; no server's object has one.)
		{"NonStringValues", `{` + meta + `,"data":{"n":1,"o":{"a":[1,2]},"t":true,"z":null}}`, "sha256:3462654e6b2225a39a020ae6b60b8f6ee9edd1abd7d91fa1e366e79b0f21ad87"},
		{"SectionNotAnObject", `{` + meta + `,"data":"x","binaryData":[1]}`, "sha256:3b2b9e9ef4d664d3dcdcac2402c9883fed3aa718a62d53a22140528c679dd1fe"},
		{"DuplicateKeys", `{` + meta + `,"data":{"a":"1","a":"2"}}`, "sha256:2c7629f5f120407cf48e516998ee2f79a173fd4100c468a1fdea1314c70300b2"},
		{"EscapedSectionName", `{` + meta + `,"d\u0061ta":{"a":"1"}}`, "sha256:951d385aae3fe24f495ff10fc885c6fadd14ad90fff625cc871fcda33b6b1286"},
		{"RepeatedSectionFirstCounts", `{` + meta + `,"data":{"a":"1"},"data":{"a":"2"}}`, "sha256:951d385aae3fe24f495ff10fc885c6fadd14ad90fff625cc871fcda33b6b1286"},
		{"Whitespace", "{ " + meta + " , \"data\" : { \"a\" : \"1\" ,\n\t\"b\":\"2\" } }", "sha256:26f5cb22fb53c1cd5699e0081d2ed546ba52e2954180fbb0696b81a10ebb411a"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cm, err := parseObject([]byte(tt.raw), kindConfigMap, DefaultSelectorAnnotation, nil)
			require.NoError(t, err)
			assert.Equal(t, tt.want, cm.hash.text())
		})
	}
}

// TestDigestReadsInvalidUTF8AsTheServerServesIt ensures a key or value
// with bytes that are not UTF-8 hashes like the text the API server would
// serve for it, which is what encoding/json makes of it: each such byte one
// U+FFFD, never one for a whole run of them. Each case's text is both a key
// and its value.
func TestDigestReadsInvalidUTF8AsTheServerServesIt(t *testing.T) {
	for _, tt := range []struct{ name, raw, served string }{
		{"OneInvalidByte", "\xff", "\uFFFD"},
		{"SeveralInvalidBytesInARowSeveralReplacements", "a\xff\xfe\x80b", "a\uFFFD\uFFFD\uFFFDb"},
		{"ValidMultiByteRunesUntouched", "ž\xff東\xc0京😀", "ž\uFFFD東\uFFFD京😀"},
		{"TruncatedRuneAtTheEnd", "東\xe4\xba", "東\uFFFD\uFFFD"},
		{"EncodedSurrogate", "\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"},
		{"OverlongEncoding", "\xc0\xaf", "\uFFFD\uFFFD"},
		{"AfterAnEscape", "\\n\xff", "\n\uFFFD"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			raw := `{"metadata":{"name":"c","namespace":"n"},"data":{"` + tt.raw + `":"` + tt.raw + `"}}`
			var obj struct{ Data map[string]string }
			require.NoError(t, json.Unmarshal([]byte(raw), &obj))
			require.Equal(t, map[string]string{tt.served: tt.served}, obj.Data, "the served form is encoding/json's")
			cm, err := parseObject([]byte(raw), kindConfigMap, DefaultSelectorAnnotation, nil)
			require.NoError(t, err)
			assert.Equal(t, digestOf(t, obj.Data), cm.hash.text())
		})
	}
}

// TestDigestOfRecordedEventsIsPinned pins the digest of real API objects,
// as the recorded watch events serve them.
func TestDigestOfRecordedEventsIsPinned(t *testing.T) {
	for _, tt := range []struct{ file, want string }{
		{"modified-1kib.ndjson", "sha256:b5cbdf4758dd3da52be2eb7752e80ff3e3fc41d07aafcf17b5becd9696315daa"},
		{"modified-100kib.ndjson", "sha256:d6dea42f2293577fa97e3e84beeccf028e05be6819f7b1516f178ac2edb41f80"},
		{"modified-1mib.ndjson", "sha256:56f1c5ea06efe7bf07ff5eb9cbae77d276d9053048d1051de344a2081323e3f1"},
	} {
		t.Run(tt.file, func(t *testing.T) {
			raw, err := os.ReadFile("../testdata/recorded/" + tt.file)
			require.NoError(t, err)
			line, _, _ := strings.Cut(string(raw), "\n")
			cm, err := parseObject([]byte(gjson.Get(line, "object").Raw), kindConfigMap, DefaultSelectorAnnotation, nil)
			require.NoError(t, err)
			assert.Equal(t, tt.want, cm.hash.text())
		})
	}
}
