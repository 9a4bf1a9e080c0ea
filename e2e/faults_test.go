//go:build e2e

package e2e

// Fault injection on the real control plane (issue 7). Every test asserts the
// promise "no change lost, each pod deleted once" from the API server's audit
// log: each pod that ran with the old data is deleted successfully exactly
// once, no pod is deleted successfully twice, and the restarted-for record
// ends at the new data's digest.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// webappWith applies the book's example with n replicas and returns its pods.
func webappWith(t *testing.T, ns string, replicas int) []pod {
	t.Helper()
	apply(t, ns, strings.Replace(webappManifests("app=webapp"), "replicas: 2", fmt.Sprintf("replicas: %d", replicas), 1))
	return waitPods(t, ns, "app=webapp", replicas)
}

// TestFaultAmbassadorKilledChangeWhileDown ensures that when the ambassador
// (kubectl proxy) crashes, a data change made while it is down is acted on
// once it is back, each pod deleted once, and that the controller stays alive
// (healthz) throughout.
func TestFaultAmbassadorKilledChangeWhileDown(t *testing.T) {
	ns := newNamespace(t)
	original := webappWith(t, ns, 2)
	amb := newAmbassador(t, env.kubeconfig)
	amb.Start()
	c := startController(t, controllerOpts{namespace: ns, apiURL: amb.url})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")

	amb.Kill()
	mergePatch(t, ns, "webapp-config", `{"data":{"message":"changed while the ambassador was down"}}`)
	time.Sleep(3 * time.Second) // several failed reconnects
	code, _, err := c.get("/healthz")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "liveness must not depend on the API")
	require.Empty(t, podDeletes(t, ns, adminUser))
	amb.Start()

	waitDeletedIn(t, ns, adminUser, original, waitTimeout)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	waitPods(t, ns, "app=webapp", 2)
	c.Settle(t, ns)
	requireEachDeletedOnce(t, ns, adminUser, original)
	assert.GreaterOrEqual(t, c.Metric(t, "config_watcher_watch_starts_total", "reason", "error"), float64(1))
}

// TestFaultControllerStartsBeforeAmbassador ensures the two containers may
// start in any order: a controller whose ambassador is not up yet stays alive
// and unready, retries, and then works normally.
func TestFaultControllerStartsBeforeAmbassador(t *testing.T) {
	ns := newNamespace(t)
	original := webappWith(t, ns, 2)
	amb := newAmbassador(t, env.kubeconfig)
	c := startController(t, controllerOpts{namespace: ns, apiURL: amb.url})
	time.Sleep(2 * time.Second)
	code, _, err := c.get("/readyz")
	require.NoError(t, err)
	assert.NotEqual(t, http.StatusOK, code, "ready without an API")
	code, _, err = c.get("/healthz")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	amb.Start()
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	require.Empty(t, podDeletes(t, ns, adminUser), "adoption deletes nothing")

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"after a late ambassador"}}`)
	waitDeletedIn(t, ns, adminUser, original, waitTimeout)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	c.Settle(t, ns)
	requireEachDeletedOnce(t, ns, adminUser, original)
}

// TestFaultAPIServerRestart ensures a kube-apiserver crash (SIGKILL) and restart in the middle of
// a watch loses nothing: a change made as soon as the new server is up is
// acted on once, and a change made before the restart is not repeated.
func TestFaultAPIServerRestart(t *testing.T) {
	ns := newNamespace(t)
	original := webappWith(t, ns, 2)
	c := startController(t, controllerOpts{namespace: ns})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"before the restart"}}`)
	waitDeleted(t, ns, adminUser, original)
	first := waitRestartedFor(t, ns, "webapp-config", adopted)
	second := waitPods(t, ns, "app=webapp", 2)

	restartComponent(t, "kube-apiserver", true, time.Second)
	waitAPIReady(t, env.kubeconfig)
	mergePatch(t, ns, "webapp-config", `{"data":{"message":"right after the restart"}}`)
	waitDeleted(t, ns, adminUser, second)
	waitRestartedFor(t, ns, "webapp-config", first)
	waitPods(t, ns, "app=webapp", 2)
	c.Settle(t, ns)
	requireEachDeletedOnce(t, ns, adminUser, append(original, second...))
	assert.GreaterOrEqual(t, c.Metric(t, "config_watcher_watch_starts_total", "reason", "initial"), float64(1))
}

// TestFaultEtcdRestart ensures an etcd restart (SIGKILL, down for 2 s) under
// the API server loses nothing and duplicates nothing.
func TestFaultEtcdRestart(t *testing.T) {
	ns := newNamespace(t)
	original := webappWith(t, ns, 2)
	c := startController(t, controllerOpts{namespace: ns})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")

	restartComponent(t, "etcd", true, 2*time.Second)
	waitAPIReady(t, env.kubeconfig)
	mergePatch(t, ns, "webapp-config", `{"data":{"message":"after etcd came back"}}`)
	waitDeletedIn(t, ns, adminUser, original, waitTimeout)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	waitPods(t, ns, "app=webapp", 2)
	c.Settle(t, ns)
	requireEachDeletedOnce(t, ns, adminUser, original)
}

// TestFaultHistoryLostRelists ensures a change hidden behind lost history is
// found: through an API server without watch cache, the ambassador is killed,
// the data changed, etcd compacted past the controller's resourceVersion; on
// reconnect the watch gets 410, the controller relists and restarts the pods
// once.
func TestFaultHistoryLostRelists(t *testing.T) {
	ns := newNamespace(t)
	original := webappWith(t, ns, 2)
	kubeconfig, audit := secondAPIServer(t, "--watch-cache=false")
	amb := newAmbassador(t, kubeconfig)
	amb.Start()
	c := startController(t, controllerOpts{namespace: ns, apiURL: amb.url})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	c.Settle(t, ns)

	amb.Kill()
	mergePatch(t, ns, "webapp-config", `{"data":{"message":"changed while the history was lost"}}`)
	// More writes after the change, so the compaction is well past it.
	for i := range 3 {
		kubectl(t, "create", "configmap", fmt.Sprintf("filler-%d", i), "-n", ns, "--from-literal=k=v")
	}
	compactEtcd(t)
	amb.Start()

	waitDeletedIn(t, ns, adminUser, original, waitTimeout, audit)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	waitPods(t, ns, "app=webapp", 2)
	c.Settle(t, ns)
	requireEachDeletedOnce(t, ns, adminUser, original, audit, env.auditLog)
	assert.GreaterOrEqual(t, c.Metric(t, "config_watcher_relists_total"), float64(1), "the change must have been found by a relist after 410")
	assert.GreaterOrEqual(t, c.Metric(t, "config_watcher_watch_starts_total", "reason", "gone"), float64(1))
}

// TestFaultProxyChaos ensures the controller converges through a slow and
// failing API (the fault proxy between it and the ambassador): latency on
// everything, 429 with Retry-After on the ConfigMap list, 500s on deletions and record
// patches, watch streams reset mid-stream and cut in the middle of a line.
// Three successive data changes are each acted on, each pod deleted once.
func TestFaultProxyChaos(t *testing.T) {
	ns := newNamespace(t)
	pods := webappWith(t, ns, 3)
	fp := startFaultProxy(t, env.proxyURL)
	fp.SetRules(t, `[
	  {"name":"latency","delay":"150ms"},
	  {"name":"list429","method":"GET","watch":"false","path":"/configmaps","status":429,"retryAfter":1,"times":2},
	  {"name":"delete500","method":"DELETE","status":500,"times":2},
	  {"name":"patch503","method":"PATCH","status":503,"retryAfter":1,"times":1},
	  {"name":"halfline","watch":"true","cutAfterLines":1,"halfLine":true,"times":2},
	  {"name":"reset","watch":"true","cutAfterLines":2,"times":2},
	  {"name":"podlist500","method":"GET","path":"/pods","status":500,"times":1}
	]`)
	c := startController(t, controllerOpts{namespace: ns, apiURL: fp.url})
	c.WaitReady(t)
	record := waitRestartedFor(t, ns, "webapp-config", "")

	var all []pod
	for i := range 3 {
		mergePatch(t, ns, "webapp-config", fmt.Sprintf(`{"data":{"message":"chaos %d"}}`, i))
		waitDeletedIn(t, ns, adminUser, pods, waitTimeout)
		record = waitRestartedFor(t, ns, "webapp-config", record)
		all = append(all, pods...)
		pods = waitPods(t, ns, "app=webapp", 3)
	}
	c.Settle(t, ns)
	fired := fp.Fired(t)
	fp.Clear(t)
	c.Settle(t, ns)
	others := requireEachDeletedOnce(t, ns, adminUser, all)
	assert.Empty(t, others, "pods deleted that did not run with old data")
	t.Logf("faults fired: %v", fired)
	for _, rule := range []string{"list429", "delete500", "patch503", "podlist500"} {
		assert.Positive(t, fired[rule], "rule %s never fired: the test did not test it", rule)
	}
	assert.Positive(t, fired["halfline"]+fired["reset"], "no watch stream was cut")
	assert.GreaterOrEqual(t, c.Metric(t, "config_watcher_pod_deletions_total", "result", "error"), float64(2))
}

// TestFaultSIGKILLMidRound ensures a controller killed with SIGKILL in the
// middle of a round of deletions and restarted completes the round: every pod
// that ran with the old data is deleted once and none twice; a further
// restart deletes nothing for the change already handled. The fault proxy
// lets the first 4 of 12 DELETEs through and holds the rest, so the kill
// lands mid-round whether the controller deletes one pod at a time or all at
// once. It reports how many replacement pods (created after the change,
// already running the new data) the restarted controller deleted: see KNOWN
// LIMITATION below.
func TestFaultSIGKILLMidRound(t *testing.T) {
	const replicas, passed = 12, 4
	ns := newNamespace(t)
	original := webappWith(t, ns, replicas)
	fp := startFaultProxy(t, env.proxyURL)
	first := startController(t, controllerOpts{namespace: ns, apiURL: fp.url})
	first.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	fp.SetRules(t, fmt.Sprintf(`[{"name":"hold","method":"DELETE","after":%d,"delay":"120s"}]`, passed))

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"interrupted round"}}`)
	eventually(t, waitTimeout, fmt.Sprintf("%d deletions", passed), func() (bool, string) {
		n := len(deletesByPod(podDeletes(t, ns, adminUser)))
		return n >= passed, fmt.Sprint(n)
	})
	require.Eventually(t, func() bool { return fp.Fired(t)["hold"] > 0 }, 10*time.Second, 50*time.Millisecond,
		"no DELETE held: the round did not go on after %d deletions", passed)
	first.Kill(t)
	before := deletesByPod(podDeletes(t, ns, adminUser))
	t.Logf("SIGKILL after %d of %d deletions", len(before), replicas)
	require.Len(t, before, passed)
	require.Equal(t, adopted, getConfigMap(t, ns, "webapp-config").Metadata.Annotations[restartedAnnotation],
		"a round cut short must not be recorded")
	waitPods(t, ns, "app=webapp", replicas) // the ReplicaSet has replaced what was deleted

	fp.Clear(t)
	second := startController(t, controllerOpts{namespace: ns, apiURL: fp.url})
	second.WaitReady(t)
	waitDeletedIn(t, ns, adminUser, original, waitTimeout)
	done := waitRestartedFor(t, ns, "webapp-config", adopted)
	waitPods(t, ns, "app=webapp", replicas)
	second.Settle(t, ns)
	second.Stop(t)
	replacements := requireEachDeletedOnce(t, ns, adminUser, original)

	third := startController(t, controllerOpts{namespace: ns, apiURL: fp.url})
	third.WaitReady(t)
	third.Settle(t, ns)
	assert.Equal(t, replacements, requireEachDeletedOnce(t, ns, adminUser, original),
		"a restart after the change was fully handled deleted pods")
	assert.Equal(t, done, getConfigMap(t, ns, "webapp-config").Metadata.Annotations[restartedAnnotation])

	// The round recorded the pods it began with (config-watcher.k8spatterns.io/restarting),
	// so the restarted controller leaves alone the replacements of the pods deleted
	// before the kill: they were created after the change and run the new data.
	t.Logf("replacement pods deleted by the restarted controller: %d (%d pods were deleted before the kill)",
		len(replacements), len(before))
	assert.Empty(t, replacements, "replacements running the new data were restarted again")
}

// TestFaultThrottledEvictionsAreRetriedNotBlocked ensures evictions the API
// server throttles (429 with Retry-After and no DisruptionBudget cause, as
// priority and fairness answers) are not taken for a disruption budget's
// refusal: none is counted blocked, each is retried after the server's hint,
// and every pod is evicted once.
func TestFaultThrottledEvictionsAreRetriedNotBlocked(t *testing.T) {
	requireCluster(t)
	ns := newNamespace(t)
	original := webappWith(t, ns, 2)
	fp := startFaultProxy(t, env.proxyURL)
	c := startController(t, controllerOpts{namespace: ns, apiURL: fp.url, extraEnv: []string{"RESTART_STRATEGY=evict", "MAX_UNAVAILABLE=100%"}})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	fp.SetRules(t, `[{"name":"throttle","method":"POST","path":"/eviction","status":429,"retryAfter":1,"times":2}]`)

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"Hello, throttled"}}`)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	assert.Equal(t, 2, fp.Fired(t)["throttle"])
	assert.Zero(t, c.Metric(t, "config_watcher_pod_evictions_total", "result", "blocked"), "throttling counted as a disruption budget")
	assert.Equal(t, float64(2), c.Metric(t, "config_watcher_pod_evictions_total", "result", "evicted"))
	assert.Contains(t, c.Log(t), "priority and fairness")
	evictions := auditEvents(t, func(e auditEvent) bool {
		return e.ObjectRef != nil && e.ObjectRef.Namespace == ns && e.ObjectRef.Subresource == "eviction" && e.OK()
	})
	n := map[string]int{}
	for _, e := range evictions {
		n[e.ObjectRef.Name]++
	}
	for _, p := range original {
		assert.Equal(t, 1, n[p.name], "evictions of %s", p.name)
	}
}

// TestFaultConflictOnTheIntentIsRetried ensures a 409 on the intent's PATCH
// that no replacement of the ConfigMap explains (here the fault proxy's; an
// admission webhook may answer so) is retried, visibly (a RestartFailed
// Warning Event that says so), and the round completes, each pod deleted
// once; it is not taken for the object replaced.
func TestFaultConflictOnTheIntentIsRetried(t *testing.T) {
	requireCluster(t)
	ns := newNamespace(t)
	original := webappWith(t, ns, 2)
	fp := startFaultProxy(t, env.proxyURL)
	c := startController(t, controllerOpts{namespace: ns, apiURL: fp.url})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	fp.SetRules(t, `[{"name":"conflict","method":"PATCH","path":"/configmaps/webapp-config","status":409,"times":1}]`)

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"Hello, conflict"}}`)
	waitDeleted(t, ns, adminUser, original)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	assert.Equal(t, 1, fp.Fired(t)["conflict"])
	failed := waitConfigMapEvent(t, ns, "webapp-config", "Warning", "RestartFailed")
	assert.Contains(t, failed.Message, "no event shows it replaced or deleted")
	assertDeletedOnce(t, ns, adminUser, original)
}
