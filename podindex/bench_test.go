package podindex

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/watch"
)

// benchPod is a metadata-only pod as a Deployment's pods look: three labels
// and the managedFields the server sends (which the index skips).
func benchPod(i int, typ watch.EventType) watch.Event {
	obj := fmt.Sprintf(`{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"webapp-7466656dc8-%05d","generateName":"webapp-7466656dc8-","namespace":"default","uid":"8484289e-0b2e-40fc-a73f-ce2b22a%05d","resourceVersion":"%d","creationTimestamp":"2026-12-02T13:01:42Z","labels":{"app":"webapp","pod-template-hash":"7466656dc8","tier":"frontend"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"webapp-7466656dc8","uid":"0c7b5b1e-6f0e-4a8e-9d7e-2f4b1c3d5e6f","controller":true,"blockOwnerDeletion":true}],"managedFields":[{"manager":"kube-controller-manager","operation":"Update","apiVersion":"v1","time":"2026-12-02T13:01:42Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{},"f:tier":{}}}}}]}}`, i, i, 1000+i)
	return watch.Event{Type: typ, Object: []byte(obj)}
}

// runningPods returns n copies of the recorded Running pod (a
// Deployment's, Ready, with conditions and container statuses), each of
// its own name and uid, as ADDED events of the index's whole-pod watch.
func runningPods(b *testing.B, n int) []watch.Event {
	raw, err := os.ReadFile("../testdata/recorded/pods-running-list.json")
	if err != nil {
		b.Fatal(err)
	}
	item := gjson.GetBytes(raw, "items.0").Raw
	name, uid := gjson.Get(item, "metadata.name").Str, gjson.Get(item, "metadata.uid").Str
	evs := make([]watch.Event, n)
	for i := range evs {
		obj := strings.ReplaceAll(item, name, fmt.Sprintf("%s%05d", name[:len(name)-5], i))
		obj = strings.ReplaceAll(obj, uid, fmt.Sprintf("%s%05d", uid[:len(uid)-5], i))
		evs[i] = watch.Event{Type: watch.Added, Object: []byte(obj)}
	}
	return evs
}

// withRefs adds to each pod of evs three references: to objects of its own
// (own), else to the same three.
func withRefs(evs []watch.Event, own bool) []watch.Event {
	for i := range evs {
		suffix := ""
		if own {
			suffix = fmt.Sprintf("-%05d", i)
		}
		obj := strings.Replace(string(evs[i].Object), `"volumes":[`, `"volumes":[{"name":"cfg","configMap":{"name":"webapp-config`+suffix+`"}},{"name":"sec","secret":{"secretName":"webapp-secret`+suffix+`","items":[{"key":"token","path":"token"}]}},`, 1)
		obj = strings.Replace(obj, `"containers":[{`, `"containers":[{"envFrom":[{"configMapRef":{"name":"webapp-env`+suffix+`"}}],`, 1)
		evs[i].Object = []byte(obj)
	}
	return evs
}

// BenchmarkHandle reports the heap the index keeps per pod (1,000 pods) and
// measures the events it gets most: updates of known pods that leave the
// labels alone. "1000-pods" are metadata-only pods of three labels, what
// the index read before it watched whole pods; "1000-running-pods" the
// recorded Running pod, what it reads now; "-3-refs" with three more
// references (a ConfigMap volume, a Secret's key, envFrom), the same in
// every pod as in the pods of one template, "-3-own-refs" naming objects of
// each pod's own (nothing shared: the most they cost).
func BenchmarkHandle(b *testing.B) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name   string
		events func() []watch.Event
	}{
		{"1000-pods", func() []watch.Event {
			evs := make([]watch.Event, 1000)
			for i := range evs {
				evs[i] = benchPod(i, watch.Added)
			}
			return evs
		}},
		{"1000-running-pods", func() []watch.Event { return runningPods(b, 1000) }},
		{"1000-running-pods-3-refs", func() []watch.Event { return withRefs(runningPods(b, 1000), false) }},
		{"1000-running-pods-3-own-refs", func() []watch.Event { return withRefs(runningPods(b, 1000), true) }},
	} {
		b.Run(tc.name, func(b *testing.B) { benchHandle(b, log, tc.events()) })
	}
	b.Run("status-only-update", func(b *testing.B) {
		x := New(log)
		x.Handle(benchPod(1, watch.Added))
		ev := benchPod(1, watch.Modified)
		b.ReportAllocs()
		for b.Loop() {
			x.Handle(ev)
		}
	})
}

// benchHandle reports the heap x keeps per pod of evs, then measures
// handling them again (updates that change nothing kept).
func benchHandle(b *testing.B, log *slog.Logger, evs []watch.Event) {
	x := New(log)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range evs {
		x.Handle(evs[i])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perPod := float64(after.HeapAlloc-before.HeapAlloc) / float64(len(evs))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		x.Handle(evs[i%len(evs)])
		i++
	}
	b.ReportMetric(perPod, "heap-B/pod")
	runtime.KeepAlive(x)
}
