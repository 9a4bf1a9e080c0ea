//go:build e2e

package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// previousVersion is the last commit before the state model's fourth pass
// (issue 47): what an upgrade replaces.
const previousVersion = "e43de1c"

// TestUpgradeResumesTheOldVersionsRound ensures the state and the intent the
// previous version wrote are read by this one: the old binary, restarting 8
// Ready pods in waves of 2, is SIGKILLed with its intent written, 2 pods
// deleted and the next DELETE held by the fault proxy; this version then
// deletes each pod the old round had left once, none of the replacements
// (created after the change, running the new data), and records the round.
func TestUpgradeResumesTheOldVersionsRound(t *testing.T) {
	const replicas, passed = 8, 2
	requireCluster(t)
	old := buildAt(t, previousVersion)
	ns := newNamespace(t)
	kubelet := startKubeletStandIn(t, ns, "webapp-config", func(map[string]string) bool { return true })
	pods := watchPods(t, ns, webappSelector, kubelet.podAdded)
	original := webappWith(t, ns, replicas)
	eventually(t, waitTimeout, fmt.Sprintf("%d Ready pods", replicas), func() (bool, string) {
		serving, state := pods.serving()
		return serving == replicas, state
	})
	h := trackChanges(t, ns, webappSelector)
	fp := startFaultProxy(t, env.proxyURL)
	settings := []string{fmt.Sprintf("MAX_UNAVAILABLE=%d", passed)}
	first := startController(t, controllerOpts{namespace: ns, apiURL: fp.url, bin: old, extraEnv: settings})
	first.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	fp.SetRules(t, fmt.Sprintf(`[{"name":"hold","method":"DELETE","after":%d,"delay":"120s"}]`, passed))

	h.set(t, "upgraded mid-round")
	eventually(t, waitTimeout, "the old round's intent and its first wave", func() (bool, string) {
		_, intent := getConfigMap(t, ns, "webapp-config").Metadata.Annotations[restartingAnnotation]
		n := successfulDeletes(t, ns)
		return intent && n >= passed, fmt.Sprintf("intent written: %v, deletions: %d", intent, n)
	})
	require.Eventually(t, func() bool { return fp.Fired(t)["hold"] > 0 }, waitTimeout, 50*time.Millisecond,
		"no second wave: the old round did not go on after %d deletions", passed)
	first.Kill(t)
	cm := getConfigMap(t, ns, "webapp-config")
	t.Logf("the old version killed after %d of %d deletions; its intent: %s", successfulDeletes(t, ns), replicas,
		cm.Metadata.Annotations[restartingAnnotation])
	require.Equal(t, passed, successfulDeletes(t, ns), "the old round must be cut short with pods left")
	require.Equal(t, adopted, cm.Metadata.Annotations[restartedAnnotation], "a round cut short must not be recorded")
	require.Contains(t, cm.Metadata.Annotations, restartingAnnotation)

	fp.Clear(t)
	second := startController(t, controllerOpts{namespace: ns, apiURL: fp.url, extraEnv: settings})
	second.WaitReady(t)
	waitDeletedIn(t, ns, adminUser, original, waitTimeout)
	recorded := waitRestartedFor(t, ns, "webapp-config", adopted)
	h.requirePromiseKept(t)
	second.Settle(t, ns)
	replacements := requireEachDeletedOnce(t, ns, adminUser, original)
	assert.Empty(t, replacements, "replacements running the new data were restarted again")
	assert.Equal(t, recorded, getConfigMap(t, ns, "webapp-config").Metadata.Annotations[restartedAnnotation])
}
