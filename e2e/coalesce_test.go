//go:build e2e

package e2e

// The tests of this file check issue 33 on the real control plane: changes
// of several objects over the same pods restart each pod once (SETTLE), a
// pod created after a change is not restarted for it, and the storm guard.

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSettleThreeObjectsRestartEachPodOnce ensures, with SETTLE=1s, that
// three ConfigMaps of the same 6 Ready pods changed within 0.2 s restart
// each pod once (6 restarts, not 18), that each object records its own R,
// and that the pods of a scale-up right after the changes are not
// restarted for them.
func TestSettleThreeObjectsRestartEachPodOnce(t *testing.T) {
	const replicas = 6
	f := webappInWaves(t, replicas, "SETTLE=1s")
	names := []string{"webapp-config", "webapp-config-b", "webapp-config-c"}
	for _, name := range names[1:] {
		apply(t, f.ns, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: %s
  annotations:
    %s: %q
data:
  message: "Hello"
`, name, selectorAnnotation, webappSelector))
	}
	adopted := map[string]string{names[0]: f.adopted}
	for _, name := range names[1:] {
		adopted[name] = waitRestartedFor(t, f.ns, name, "")
	}

	began := time.Now()
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Go(func() {
			code, body, err := proxyDo(t.Context(), http.MethodPatch, "/api/v1/namespaces/"+f.ns+"/configmaps/"+name,
				"application/merge-patch+json", []byte(`{"data":{"message":"Hello, together"}}`))
			assert.NoError(t, err)
			assert.Equal(t, http.StatusOK, code, "%s", body)
		})
	}
	wg.Wait()
	require.Less(t, time.Since(began), 200*time.Millisecond, "the three changes within 0.2 s: the scenario")
	kubectl(t, "scale", "deployment", "webapp", "-n", f.ns, "--replicas=8")
	scaledUp := time.Now()

	for _, name := range names {
		recorded := waitRestartedFor(t, f.ns, name, adopted[name])
		assert.NotEqual(t, adopted[name], recorded, "%s records its own R", name)
		eventually(t, waitTimeout, name+"'s intent removed", func() (bool, string) {
			v, ok := getConfigMap(t, f.ns, name).Metadata.Annotations[restartingAnnotation]
			return !ok, v
		})
	}
	f.c.Settle(t, f.ns)
	assertDeletedOnce(t, f.ns, adminUser, f.original) // the 6 pods once each: no replacement, no scale-up pod
	t.Logf("rounds done %s after the scale-up", time.Since(scaledUp).Round(time.Millisecond))
}

// TestStormGuardRestartsOncePerWindow ensures, with STORM_CHANGES=3 and
// STORM_WINDOW=10s, that a ConfigMap changed every second for 30 s over 4
// Ready pods makes at most (windows+1) x 4 pod deletions from the change
// that begins the storm on, for the windows its changes spanned (3 at their
// pace), and one of the wave it cuts short (at most 3 x 4 for the 3 changes
// before it), one
// ChangeStorm Event, and that every pod runs the last data within
// STORM_WINDOW + 10 s after the changes stop (a ChangeStormEnded Event then).
func TestStormGuardRestartsOncePerWindow(t *testing.T) {
	const replicas, window = 4, 10 * time.Second
	f := webappInWaves(t, replicas, "STORM_CHANGES=3", "STORM_WINDOW=10s")
	h := trackChanges(t, f.ns, webappSelector)

	tick := time.NewTicker(time.Second) // the changes' pace is the scenario
	defer tick.Stop()
	for i := range 30 {
		h.set(t, fmt.Sprintf("storm %d", i))
		<-tick.C
	}
	stopped := time.Now()
	last := h.list[len(h.list)-1]
	eventually(t, window+10*time.Second, "every pod on the last data", func() (bool, string) {
		created := h.created(t)
		var old []string
		for _, p := range livePods(t, f.ns, webappSelector) {
			if rv, ok := created[p.name]; !ok || rv < last.rv {
				old = append(old, p.name)
			}
		}
		return len(old) == 0, fmt.Sprintf("still on older data: %v", old)
	})
	t.Logf("every pod on the last data %s after the changes stopped", time.Since(stopped).Round(time.Second))
	waitConfigMapEvent(t, f.ns, "webapp-config", "Normal", "ChangeStormEnded")
	f.c.Settle(t, f.ns)

	// The first 3 changes are no storm: each has its round, superseded by
	// the next. From the 4th, the storm's: one round per window it lasted
	// (3 when the changes keep their pace; a loaded machine stretches them)
	// and the one that brings the pods to the last data, and the wave in
	// flight of the round the 4th change superseded, which finishes (one
	// pod at MAX_UNAVAILABLE's 25 % of 4).
	began := h.list[3].at
	windows := int((last.at.Sub(began) + window - 1) / window)
	inStorm, before := 0, 0
	for _, e := range successfulPodDeletes(t, f.ns) {
		if e.Received.Before(began) {
			before++
		} else {
			inStorm++
		}
	}
	t.Logf("successful deletions: %d before the storm, %d from its first change on", before, inStorm)
	assert.LessOrEqual(t, inStorm, (windows+1)*replicas+1, "in the storm, %d windows long", windows)
	assert.LessOrEqual(t, before, 3*replicas, "before it")
	storms := 0
	for _, e := range objectEvents(t, "ConfigMap", f.ns, "webapp-config") {
		if e.Reason == "ChangeStorm" {
			storms += max(e.Count, 1)
			assert.True(t, strings.HasPrefix(e.Message, "The data changed more than 3 times within 10s"), e.Message)
		}
	}
	assert.Equal(t, 1, storms, "one ChangeStorm Event")
	assert.Zero(t, f.c.Metric(t, "config_watcher_objects_in_storm"))
}

// TestChangesDuringSlowDeletesLeaveTheirReplacements is the issue's
// reproduction: the data of one ConfigMap changed five times, 0.4 s apart,
// while each DELETE takes a second (the fault proxy holds it), all pods at
// once. Every deletion hits a pod created before the change preceding it:
// a pod created after a change was seen (a replacement of a DELETE in
// flight then) is not restarted for it, and none twice.
func TestChangesDuringSlowDeletesLeaveTheirReplacements(t *testing.T) {
	_, _, h, fp, _ := webappBehindFaultProxyWith(t, 4, "MAX_UNAVAILABLE=100%")
	fp.SetRules(t, `[{"name":"slow","method":"DELETE","delay":"1s"}]`)
	tick := time.NewTicker(400 * time.Millisecond) // the changes' pace is the scenario
	defer tick.Stop()
	for i := range 5 {
		h.set(t, fmt.Sprintf("change %d", i))
		<-tick.C
	}
	h.requirePromiseKept(t)
	require.Positive(t, fp.Fired(t)["slow"], "no DELETE was slow: the test did not test it")
}
