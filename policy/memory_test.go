package policy

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/watch"
)

// TestMemoryReleasedOnceAfterInitialSync ensures the memory of the initial
// sync goes back to the OS when the last scope has listed and the queue has
// run dry, and not before.
func TestMemoryReleasedOnceAfterInitialSync(t *testing.T) {
	api := newFakeAPI(t)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true})
	other, ns := c.ForNamespace("other"), c.ForNamespace("ns")
	other.BeginList()
	other.EndList()
	assert.False(t, c.released.Load(), "scope ns has not listed")
	ns.BeginList()
	ns.Handle(watch.Event{Type: watch.Synced, Object: cmSpec{selector: ptr("app=webapp"), data: v1}.json(t)})
	ns.EndList()
	assert.False(t, c.released.Load(), "the adoption is still queued")
	start(t, c)
	settle(t, c)
	assert.Eventually(t, c.released.Load, waitFor, time.Millisecond)
}

// TestMemoryReleasedByStandbyAfterListing ensures a standby, whose queue
// nobody works, releases the memory of its sync once it has listed.
func TestMemoryReleasedByStandbyAfterListing(t *testing.T) {
	api := newFakeAPI(t)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, MayAct: func() bool { return false }})
	ns := c.ForNamespace("ns")
	ns.BeginList()
	ns.Handle(watch.Event{Type: watch.Synced, Object: cmSpec{selector: ptr("app=webapp"), data: v1}.json(t)})
	assert.False(t, c.released.Load(), "still listing")
	ns.EndList()
	assert.True(t, c.released.Load(), "listed, with its adoption queued for a leader")
}

// syntheticConfigMap is a ConfigMap as the API serves it after the
// benchmark's load (bench/tool create): 1 KiB of data, managedFields, and
// on every second one a selector annotation and, once recorded, the
// restarted-for annotation.
func syntheticConfigMap(i int, rv int, recorded string) []byte {
	name := fmt.Sprintf("cm-%05d", i)
	annotations := map[string]string{}
	if i%2 == 0 {
		annotations[DefaultSelectorAnnotation] = "bench-mem=" + name
	}
	if recorded != "" {
		annotations[RestartedForAnnotation] = recorded
	}
	raw, err := json.Marshal(map[string]any{
		"kind": "ConfigMap", "apiVersion": "v1",
		"metadata": map[string]any{
			"name": name, "namespace": "bench-mem",
			"uid":               fmt.Sprintf("%08x-be74-487a-9cae-f034ea947b5f", i),
			"resourceVersion":   fmt.Sprint(rv),
			"creationTimestamp": "2026-12-02T11:03:20Z",
			"annotations":       annotations,
			"managedFields": []any{map[string]any{
				"manager": "benchtool", "operation": "Update", "apiVersion": "v1", "time": "2026-12-02T11:03:20Z",
				"fieldsType": "FieldsV1", "fieldsV1": map[string]any{"f:data": map[string]any{".": map[string]any{}, "f:config": map[string]any{}}},
			}},
		},
		"data": map[string]string{"config": strings.Repeat("key = some configuration value\n", 1024/31+1)[:1024]},
	})
	if err != nil {
		panic(err)
	}
	return raw
}

// BenchmarkHeapPerConfigMap measures the live heap the controller keeps per
// ConfigMap once it has synced n ConfigMaps (half of them annotated),
// adopted the annotated ones and seen the watch events of its own records:
// the state it holds for as long as it runs. The queue is drained by hand
// (as the workers would, without their API calls).
func BenchmarkHeapPerConfigMap(b *testing.B) {
	for _, n := range []int{5000, 20000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			synced := make([][]byte, n)
			recorded := make([][]byte, n)
			for i := range n {
				synced[i] = syntheticConfigMap(i, 1000+i, "")
				if i%2 == 0 {
					cm, err := parseObject(synced[i], kindConfigMap, DefaultSelectorAnnotation, nil)
					if err != nil {
						b.Fatal(err)
					}
					recorded[i] = syntheticConfigMap(i, 1000+n+i, fmt.Sprint(cm.hash))
				}
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			var before, after runtime.MemStats
			for b.Loop() {
				runtime.GC()
				runtime.ReadMemStats(&before)
				c := New(Config{SelectorAnnotation: DefaultSelectorAnnotation, RecordHash: true}, nil, log, NewMetrics(metrics.NewRegistry()))
				all := c.ForNamespace("")
				all.BeginList()
				for _, raw := range synced {
					all.Handle(watch.Event{Type: watch.Synced, Object: raw})
				}
				all.EndList()
				for c.queue.Len() > 0 {
					key, _ := c.queue.Get()
					c.mu.Lock()
					e := c.entries[key]
					e.r, e.adopted = e.obj.hash, false // adopted and recorded, as record does
					c.mu.Unlock()
					c.queue.Done(key)
				}
				for _, raw := range recorded {
					if raw != nil {
						c.Handle(watch.Event{Type: watch.Modified, Object: raw})
					}
				}
				if c.queue.Len() != 0 {
					b.Fatalf("%d ConfigMaps queued after their records", c.queue.Len())
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				runtime.KeepAlive(c)
			}
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heap-B/configmap")
			b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(n), "inuse-B/configmap")
		})
	}
}
