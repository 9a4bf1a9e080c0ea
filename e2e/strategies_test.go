//go:build e2e

package e2e

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestEvictStrategy ensures RESTART_STRATEGY=evict restarts each pod once
// through the Eviction subresource and never deletes it directly.
func TestEvictStrategy(t *testing.T) {
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	original := waitPods(t, ns, "app=webapp", 2)
	c := startController(t, controllerOpts{namespace: ns, extraEnv: []string{"RESTART_STRATEGY=evict"}})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"evicted"}}`)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	replaced := waitPods(t, ns, "app=webapp", 2)
	c.Settle(t, ns)
	for _, p := range replaced {
		assert.NotContains(t, original, p, "pod %s survived the data change", p.name)
	}
	evictions := auditEvents(t, func(e auditEvent) bool {
		return e.Verb == "create" && e.ObjectRef != nil && e.ObjectRef.Namespace == ns &&
			e.ObjectRef.Resource == "pods" && e.ObjectRef.Subresource == "eviction" && e.User.Username == adminUser
	})
	evicted := map[string]int{}
	for _, e := range evictions {
		evicted[e.ObjectRef.Name]++
	}
	assert.Equal(t, map[string]int{original[0].name: 1, original[1].name: 1}, evicted, "one eviction per original pod")
	assert.Empty(t, podDeletes(t, ns, adminUser), "evict never deletes")
	assert.Equal(t, float64(2), c.Metric(t, "config_watcher_pod_evictions_total", "result", "evicted"))
}

// TestDryRun ensures DRY_RUN=true goes through a round (the server checks
// each deletion with dryRun=All) without deleting a pod or writing the
// record.
func TestDryRun(t *testing.T) {
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	original := waitPods(t, ns, "app=webapp", 2)
	c := startController(t, controllerOpts{namespace: ns, extraEnv: []string{"DRY_RUN=true"}})
	c.WaitReady(t)

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"dry"}}`)
	c.WaitMetric(t, 2, "config_watcher_pod_deletions_total", "result", "dry_run")
	assert.ElementsMatch(t, original, livePods(t, ns, "app=webapp"), "a dry run deleted pods")
	assert.Empty(t, getConfigMap(t, ns, "webapp-config").Metadata.Annotations[restartedAnnotation], "a dry run wrote the record")
}

// TestMaxConcurrentRestartsPaces ensures MAX_CONCURRENT_RESTARTS=1 restarts
// one pod after the other: the API server receives each DELETE only after it
// answered the one before.
func TestMaxConcurrentRestartsPaces(t *testing.T) {
	ns := newNamespace(t)
	original := webappWith(t, ns, 4)
	c := startController(t, controllerOpts{namespace: ns, extraEnv: []string{"MAX_CONCURRENT_RESTARTS=1"}})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"one by one"}}`)
	waitDeleted(t, ns, adminUser, original)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	c.Settle(t, ns)
	assertDeletedOnce(t, ns, adminUser, original)

	deletes := podDeletes(t, ns, adminUser)
	slices.SortFunc(deletes, func(a, b auditEvent) int {
		return a.Received.Compare(b.Received)
	})
	for i := 1; i < len(deletes); i++ {
		assert.False(t, deletes[i].Received.Before(deletes[i-1].Done), "DELETE %d arrived before DELETE %d was answered: not paced", i, i-1)
	}
}
