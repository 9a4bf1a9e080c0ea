package podindex_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/watch"
)

// TestParseRefsReadsEachForm ensures every form a pod's containers read a
// ConfigMap or Secret by is found, whole or by key, and the forms the
// containers do not read through (ephemeral containers, image pull
// secrets, CSI) are not.
func TestParseRefsReadsEachForm(t *testing.T) {
	for _, tc := range []struct {
		name, spec, want string
	}{
		{"ConfigMapVolumeWhole", `{"volumes":[{"name":"v","configMap":{"name":"cm"}}]}`, "ConfigMap/cm"},
		{"ConfigMapVolumeItems", `{"volumes":[{"name":"v","configMap":{"name":"cm","items":[{"key":"b","path":"x"},{"key":"a","path":"y"}]}}]}`, "ConfigMap/cm[a,b]"},
		{"ConfigMapVolumeEmptyItemsIsWhole", `{"volumes":[{"name":"v","configMap":{"name":"cm","items":[]}}]}`, "ConfigMap/cm"},
		{"SecretVolumeWhole", `{"volumes":[{"name":"v","secret":{"secretName":"s"}}]}`, "Secret/s"},
		{"SecretVolumeItems", `{"volumes":[{"name":"v","secret":{"secretName":"s","items":[{"key":"k","path":"k"}]}}]}`, "Secret/s[k]"},
		{"ProjectedSources", `{"volumes":[{"name":"v","projected":{"sources":[{"configMap":{"name":"cm","items":[{"key":"a","path":"a"}]}},{"secret":{"name":"s"}},{"serviceAccountToken":{"path":"t"}}]}}]}`, "ConfigMap/cm[a] Secret/s"},
		{"EnvFrom", `{"containers":[{"name":"c","envFrom":[{"configMapRef":{"name":"cm"}},{"prefix":"P_","secretRef":{"name":"s"}}]}]}`, "ConfigMap/cm Secret/s"},
		{"EnvKeyRefs", `{"containers":[{"name":"c","env":[{"name":"A","valueFrom":{"configMapKeyRef":{"name":"cm","key":"a"}}},{"name":"B","valueFrom":{"secretKeyRef":{"name":"s","key":"b"}}},{"name":"C","value":"x"},{"name":"D","valueFrom":{"fieldRef":{"fieldPath":"metadata.name"}}}]}]}`, "ConfigMap/cm[a] Secret/s[b]"},
		{"InitContainers", `{"initContainers":[{"name":"i","envFrom":[{"configMapRef":{"name":"init"}}]}]}`, "ConfigMap/init"},
		{"KeysOfSeveralReadersJoin", `{"containers":[{"name":"c","env":[{"name":"A","valueFrom":{"configMapKeyRef":{"name":"cm","key":"a"}}}]},{"name":"d","env":[{"name":"B","valueFrom":{"configMapKeyRef":{"name":"cm","key":"b"}}},{"name":"A","valueFrom":{"configMapKeyRef":{"name":"cm","key":"a"}}}]}]}`, "ConfigMap/cm[a,b]"},
		{"WholeWinsOverKeys", `{"volumes":[{"name":"v","configMap":{"name":"cm"}}],"containers":[{"name":"c","env":[{"name":"A","valueFrom":{"configMapKeyRef":{"name":"cm","key":"a"}}}]}]}`, "ConfigMap/cm"},
		{"SameNameOfBothKindsApart", `{"volumes":[{"name":"v","configMap":{"name":"x","items":[{"key":"a","path":"a"}]}},{"name":"w","secret":{"secretName":"x"}}]}`, "ConfigMap/x[a] Secret/x"},
		{"OptionalCounts", `{"containers":[{"name":"c","env":[{"name":"A","valueFrom":{"configMapKeyRef":{"name":"missing","key":"a","optional":true}}}],"envFrom":[{"secretRef":{"name":"gone","optional":true}}]}]}`, "ConfigMap/missing[a] Secret/gone"},
		{"NotEphemeralContainers", `{"ephemeralContainers":[{"name":"debug","envFrom":[{"configMapRef":{"name":"cm"}}]}]}`, ""},
		{"NotImagePullSecretsOrCSI", `{"imagePullSecrets":[{"name":"regcred"}],"volumes":[{"name":"v","csi":{"driver":"secrets-store.csi.k8s.io","nodePublishSecretRef":{"name":"s"}}}]}`, ""},
		{"NoSpec", `{}`, ""},
		{"NamelessReferenceIgnored", `{"containers":[{"name":"c","envFrom":[{"configMapRef":{}}]}]}`, ""},
		{"ControlCharactersIgnored", `{"containers":[{"name":"c","envFrom":[{"configMapRef":{"name":"a\u001eb"}}],"env":[{"name":"A","valueFrom":{"configMapKeyRef":{"name":"cm","key":"a\u001fb"}}}]}]}`, "ConfigMap/cm[]"},
		{"MalformedShapes", `{"volumes":"x","containers":[{"env":{"a":1},"envFrom":[1,"x",{"configMapRef":"cm"}]}]}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := podindex.ParseRefs(gjson.Parse(tc.spec))
			assert.Equal(t, tc.want, got.String())
			assert.Equal(t, tc.want == "", got.Empty())
		})
	}
}

// TestRefsReadsOneObject ensures a lookup finds the object by kind and
// exact name (not a name it is a prefix of) and says what of it is read.
func TestRefsReadsOneObject(t *testing.T) {
	refs := podindex.ParseRefs(gjson.Parse(`{"volumes":[{"name":"v","configMap":{"name":"app-config","items":[{"key":"b","path":"b"},{"key":"a","path":"a"}]}}],
		"containers":[{"name":"c","envFrom":[{"configMapRef":{"name":"app"}}],"env":[{"name":"X","valueFrom":{"secretKeyRef":{"name":"app","key":"k"}}}]}]}`))

	ref, found := refs.Reads(podindex.RefConfigMap, "app")
	assert.True(t, found)
	assert.True(t, ref.Whole)

	ref, found = refs.Reads(podindex.RefConfigMap, "app-config")
	assert.True(t, found)
	assert.Equal(t, podindex.Ref{Kind: podindex.RefConfigMap, Name: "app-config", Keys: []string{"a", "b"}}, ref)

	ref, found = refs.Reads(podindex.RefSecret, "app")
	assert.True(t, found)
	assert.Equal(t, []string{"k"}, ref.Keys)
	assert.False(t, ref.Whole)

	_, found = refs.Reads(podindex.RefConfigMap, "ap")
	assert.False(t, found)
	_, found = refs.Reads(podindex.RefSecret, "app-config")
	assert.False(t, found)
	_, found = podindex.Refs{}.Reads(podindex.RefConfigMap, "app")
	assert.False(t, found)
}

// TestRefsOfOneTemplateAreShared ensures two pods reading the same objects,
// however their specs order them, hold one interned value.
func TestRefsOfOneTemplateAreShared(t *testing.T) {
	a := podindex.ParseRefs(gjson.Parse(`{"containers":[{"envFrom":[{"configMapRef":{"name":"x"}},{"secretRef":{"name":"y"}}]}]}`))
	b := podindex.ParseRefs(gjson.Parse(`{"containers":[{"envFrom":[{"secretRef":{"name":"y"}},{"configMapRef":{"name":"x"}}]}]}`))
	assert.Equal(t, a, b)
	assert.True(t, a == b, "the same handle")
}

// TestIndexKeepsRefsFromTheFirstSight ensures the index reads a pod's
// references when it first sees it and keeps them through updates (the
// volumes and env of a pod cannot change), also where an update's object
// lacks its spec.
func TestIndexKeepsRefsFromTheFirstSight(t *testing.T) {
	x := podindex.New(discard)
	relist(x)
	x.Handle(watch.Event{Type: watch.Added, Object: []byte(`{"metadata":{"namespace":"ns","name":"p","uid":"u1","resourceVersion":"5"},
		"spec":{"containers":[{"name":"c","envFrom":[{"configMapRef":{"name":"cm"}}]}]}}`)})
	x.Handle(watch.Event{Type: watch.Modified, Object: []byte(`{"metadata":{"namespace":"ns","name":"p","uid":"u1","resourceVersion":"6"},
		"status":{"conditions":[{"type":"Ready","status":"True"}]}}`)})
	view, ok := x.View("ns")
	require.True(t, ok)
	require.Len(t, view, 1)
	assert.True(t, view[0].Ready)
	assert.Equal(t, "ConfigMap/cm", view[0].Refs.String())
}

// FuzzParseRefs ensures any spec is read without a panic, and what is read
// is found again by a lookup of each object, as a round looks it up.
func FuzzParseRefs(f *testing.F) {
	for _, s := range []string{
		`{"volumes":[{"name":"v","configMap":{"name":"cm","items":[{"key":"b"},{"key":"a"}]}},{"name":"w","projected":{"sources":[{"secret":{"name":"s"}}]}}]}`,
		`{"containers":[{"envFrom":[{"configMapRef":{"name":"cm"}}],"env":[{"valueFrom":{"secretKeyRef":{"name":"s","key":"k"}}}]}],"initContainers":[{"envFrom":[{"secretRef":{"name":"cm"}}]}]}`,
		`{"containers":[{"env":[{"valueFrom":{"configMapKeyRef":{"name":"a\u001eb","key":"c\u001fd"}}}]}]}`,
		`{"volumes":[{"configMap":{"name":"x","items":[]}},{"configMap":{"name":"x","items":[{"key":""}]}}]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		refs := podindex.ParseRefs(gjson.Parse(spec))
		for ref := range refs.All() {
			got, found := refs.Reads(ref.Kind, ref.Name)
			if !found || got.Whole != ref.Whole || strings.Join(got.Keys, ",") != strings.Join(ref.Keys, ",") {
				t.Fatalf("%s: %+v read back as %+v (found %v)", refs, ref, got, found)
			}
		}
	})
}
