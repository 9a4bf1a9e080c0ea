//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startLeaderAndStandby starts two replicas with LEADER_ELECT=true on the
// Lease named lease, with short timings, and returns them once replica-a
// leads and replica-b stands by, both ready.
func startLeaderAndStandby(t *testing.T, ns, lease string) (leader, standby *controllerProc) {
	t.Helper()
	replica := func(name string) controllerOpts {
		return controllerOpts{namespace: ns, extraEnv: []string{
			"LEADER_ELECT=true", "POD_NAME=" + name, "LEASE_NAME=" + lease,
			"LEASE_DURATION=3s", "RENEW_DEADLINE=2s", "RETRY_PERIOD=500ms",
		}}
	}
	leader = startController(t, replica("replica-a"))
	leader.WaitReady(t)
	leader.WaitMetric(t, 1, "config_watcher_leader")
	standby = startController(t, replica("replica-b"))
	standby.WaitReady(t)
	return leader, standby
}

// TestLeaderElection ensures two replicas with LEADER_ELECT=true act as one:
// a data change deletes each pod exactly once, and when the leader is killed
// (no chance to release its Lease) the standby takes over and handles the
// next change, again once per pod.
func TestLeaderElection(t *testing.T) {
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	original := waitPods(t, ns, "app=webapp", 2)
	a, b := startLeaderAndStandby(t, ns, "e2e")
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	assert.Equal(t, float64(0), b.Metric(t, "config_watcher_leader"), "two leaders")

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"first change"}}`)
	waitDeleted(t, ns, adminUser, original)
	restarted := waitRestartedFor(t, ns, "webapp-config", adopted)
	replaced := waitPods(t, ns, "app=webapp", 2)
	a.Settle(t, ns)
	assertDeletedOnce(t, ns, adminUser, original)

	a.Kill(t)
	mergePatch(t, ns, "webapp-config", `{"data":{"message":"changed after the leader died"}}`)
	b.WaitMetric(t, 1, "config_watcher_leader")
	waitDeleted(t, ns, adminUser, replaced)
	waitRestartedFor(t, ns, "webapp-config", restarted)
	waitPods(t, ns, "app=webapp", 2)
	b.Settle(t, ns)
	assertDeletedOnce(t, ns, adminUser, append(original, replaced...))
}

// TestLeaderFailoverDuringBurst ensures that when the leader dies in the
// middle of a burst of changes, the standby finishes the work: every pod of
// every changed ConfigMap is deleted exactly once, none twice, none missed.
func TestLeaderFailoverDuringBurst(t *testing.T) {
	const n, passed = 10, 3
	ns := newNamespace(t)
	var manifests []string
	for i := range n {
		manifests = append(manifests, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: cm-%d
  annotations:
    %s: "app=pod-%d"
data:
  message: "one"
---
apiVersion: v1
kind: Pod
metadata:
  name: pod-%d
  labels:
    app: pod-%d
spec:
  containers:
  - name: main
    image: k8spatterns/mini-http-server`, i, selectorAnnotation, i, i, i))
	}
	apply(t, ns, strings.Join(manifests, "\n---\n"))
	var pods []pod
	for i := range n {
		pods = append(pods, waitPods(t, ns, fmt.Sprintf("app=pod-%d", i), 1)...)
	}
	replica := func(name, apiURL string) controllerOpts {
		return controllerOpts{namespace: ns, apiURL: apiURL, extraEnv: []string{
			"LEADER_ELECT=true", "POD_NAME=" + name, "LEASE_NAME=e2e-burst",
			"LEASE_DURATION=3s", "RENEW_DEADLINE=2s", "RETRY_PERIOD=500ms",
		}}
	}
	fp := startFaultProxy(t, env.proxyURL)
	a := startController(t, replica("replica-a", fp.url))
	a.WaitReady(t)
	a.WaitMetric(t, 1, "config_watcher_leader")
	b := startController(t, replica("replica-b", ""))
	b.WaitReady(t)
	adopted := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("cm-%d", i)
		adopted[name] = waitRestartedFor(t, ns, name, "")
	}

	fp.SetRules(t, fmt.Sprintf(`[{"name":"hold","method":"DELETE","after":%d,"delay":"120s"}]`, passed))
	for i := range n {
		mergePatch(t, ns, fmt.Sprintf("cm-%d", i), `{"data":{"message":"two"}}`)
	}
	require.Eventually(t, func() bool { return fp.Fired(t)["hold"] > 0 }, waitTimeout, 50*time.Millisecond, "the leader's burst never reached the held DELETEs")
	a.Kill(t)

	b.WaitMetric(t, 1, "config_watcher_leader")
	waitDeleted(t, ns, adminUser, pods)
	for name, was := range adopted {
		waitRestartedFor(t, ns, name, was)
	}
	b.Settle(t, ns)
	assertDeletedOnce(t, ns, adminUser, pods)
}
