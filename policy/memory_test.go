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
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/watch"
)

// TestMemoryReleasedOnceAfterInitialSync ensures the memory of the initial
// sync goes back to the OS when the last scope has listed and the queue has
// run dry, and not before.
func TestMemoryReleasedOnceAfterInitialSync(t *testing.T) {
	api := newFakeAPI(t)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true})
	other, ns := c.ForConfigMaps("other"), c.ForConfigMaps("ns")
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
	ns := c.ForConfigMaps("ns")
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
	return syntheticOf(i, rv, recorded, "", false)
}

// syntheticOf is syntheticConfigMap, or, referencing, one annotated with
// RestartReferencingAnnotation (no selector) whose 1 KiB of data is in
// three keys, recorded with key digests keys.
func syntheticOf(i int, rv int, recorded, keys string, referencing bool) []byte {
	name := fmt.Sprintf("cm-%05d", i)
	annotations := map[string]string{}
	data := map[string]string{"config": strings.Repeat("key = some configuration value\n", 1024/31+1)[:1024]}
	switch {
	case i%2 == 0 && referencing:
		annotations[RestartReferencingAnnotation] = "true"
		v := data["config"]
		data = map[string]string{"config": v[:342], "feature-flags": v[342:684], "endpoint": v[684:]}
	case i%2 == 0:
		annotations[DefaultSelectorAnnotation] = "bench-mem=" + name
	}
	if recorded != "" {
		annotations[RestartedForAnnotation] = recorded
	}
	if keys != "" {
		annotations[RestartedForKeysAnnotation] = keys
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
		"data": data,
	})
	if err != nil {
		panic(err)
	}
	return raw
}

// BenchmarkHeapPerConfigMap measures the live heap the controller keeps per
// ConfigMap once it has synced n ConfigMaps (half of them annotated: with
// a selector, or "-referencing-3-keys" restartReferencingPods and three
// keys, whose digests it keeps),
// adopted the annotated ones and seen the watch events of its own records:
// the state it holds for as long as it runs. The queue is drained by hand
// (as the workers would, without their API calls).
func BenchmarkHeapPerConfigMap(b *testing.B) {
	for _, tc := range []struct {
		n           int
		referencing bool
	}{{5000, false}, {20000, false}, {5000, true}} {
		name := fmt.Sprint(tc.n)
		if tc.referencing {
			name += "-referencing-3-keys"
		}
		n := tc.n
		b.Run(name, func(b *testing.B) {
			synced := make([][]byte, n)
			recorded := make([][]byte, n)
			for i := range n {
				synced[i] = syntheticOf(i, 1000+i, "", "", tc.referencing)
				if i%2 == 0 {
					cm, err := parseObject(synced[i], kindConfigMap, DefaultSelectorAnnotation, nil)
					if err != nil {
						b.Fatal(err)
					}
					recorded[i] = syntheticOf(i, 1000+n+i, fmt.Sprint(cm.hash), string(cm.keys), tc.referencing)
				}
			}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			var before, after runtime.MemStats
			for b.Loop() {
				runtime.GC()
				runtime.ReadMemStats(&before)
				c := New(Config{SelectorAnnotation: DefaultSelectorAnnotation, RecordHash: true}, nil, log, NewMetrics(metrics.NewRegistry()))
				all := c.ForConfigMaps("")
				all.BeginList()
				for _, raw := range synced {
					all.Handle(watch.Event{Type: watch.Synced, Object: raw})
				}
				all.EndList()
				for c.queue.Len() > 0 {
					key, _ := c.queue.Get()
					c.mu.Lock()
					e := c.entries[key]
					e.r, e.rKeys, e.adopted = e.obj.hash, e.obj.keys, false // adopted and recorded, as record does
					c.mu.Unlock()
					c.queue.Done(key)
				}
				for _, raw := range recorded {
					if raw != nil {
						all.Handle(watch.Event{Type: watch.Modified, Object: raw})
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

// heapAfter returns the live heap after f, less the live heap before it.
func heapAfter(f func()) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// bigAnnotation is an annotation value of 255 KiB: a list of short ids after
// a digest, as a forged intent would be.
func bigAnnotation(t *testing.T, i int) string {
	var b strings.Builder
	b.WriteString(hashOf(t, v2) + "/")
	for n := 0; b.Len() < 255<<10; n++ {
		fmt.Fprintf(&b, "%d-%d,", i, n)
	}
	return b.String()
}

// TestForgedStateConfigMapsAreNotKept ensures ConfigMaps shaped as the state
// of a Secret, each with a 255 KiB intent, cost next to no memory, with
// Secrets watched (their Secret is not one of ours) or not, and that the
// controller still acts on the next change of its own Secret.
func TestForgedStateConfigMapsAreNotKept(t *testing.T) {
	for _, secrets := range []bool{false, true} {
		t.Run(fmt.Sprintf("WatchSecrets=%v", secrets), func(t *testing.T) {
			api := replacingAPI(t)
			cfg := Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}}
			if secrets {
				cfg.DigestKey = testKey
			}
			c, _ := newTestController(t, api.client(), cfg)
			secret := secretSpec{selector: ptr("app=webapp"), data: s1}
			if secrets {
				listSecrets(t, c, secret)
			}
			forged := make([]cmSpec, 20)
			for i := range forged {
				forged[i] = stateSpec(fmt.Sprintf("forged-%d", i), keyID(testKey), hashOf(t, v1), bigAnnotation(t, i))
			}
			kept := heapAfter(func() {
				list(t, c.ForConfigMaps(""), append(forged, stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), "")))
			})
			runtime.KeepAlive(forged)
			t.Logf("heap kept after listing 20 forged state ConfigMaps: %d KiB", kept>>10)
			assert.Less(t, kept, int64(1<<20), "20 x 255 KiB of forged intents")
			if !secrets {
				return
			}
			start(t, c)
			secret.data = s2
			handleSecret(t, c, watch.Modified, secret)
			require.Eventually(t, func() bool { return len(api.deletedPods()) == 3 }, waitFor, time.Millisecond)
		})
	}
}

// TestLongIntentsAndSelectorsAreBounded ensures annotated ConfigMaps whose
// intent and selector are 255 KiB each keep a bounded amount of memory: the
// selector is refused as too long (a Warning Event, no restart), the intent
// is read as naming no pods; another ConfigMap's change is acted on.
func TestLongIntentsAndSelectorsAreBounded(t *testing.T) {
	api := replacingAPI(t)
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}, Events: rec})
	forged := make([]cmSpec, 20)
	for i := range forged {
		sel := "app in (" + strings.Repeat("x,", 255<<9) + "webapp)"
		forged[i] = cmSpec{name: fmt.Sprintf("forged-%d", i), uid: fmt.Sprintf("forged-uid-%d", i), selector: &sel, recorded: hashOf(t, v1), intent: bigAnnotation(t, i), data: v2}
	}
	kept := heapAfter(func() { list(t, c.ForConfigMaps(""), forged) })
	runtime.KeepAlive(forged)
	t.Logf("heap kept after listing 20 ConfigMaps with 255 KiB intents and selectors: %d KiB", kept>>10)
	assert.Less(t, kept, int64(4<<20), "20 x 510 KiB of annotations")
	c.mu.Lock()
	in := c.entries["ns/forged-0"].obj.stored.intent
	c.mu.Unlock()
	assert.True(t, in.all, "an intent past the bound names no pods")
	assert.LessOrEqual(t, len(in.text), maxIntentText)

	start(t, c)
	require.Eventually(t, func() bool { return m.InvalidSelectors.Value() == 20 }, waitFor, time.Millisecond)
	assert.Contains(t, eventText(rec, "InvalidSelector"), "longer than 4096 bytes")
	assert.Empty(t, api.deletedPods(), "a refused selector restarts nothing")
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return len(api.deletedPods()) == 3 }, waitFor, time.Millisecond)
}
