//go:build e2e

package e2e

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLeaderElection ensures two replicas with LEADER_ELECT=true act as one:
// a data change deletes each pod exactly once, and when the leader is killed
// (no chance to release its Lease) the standby takes over and handles the
// next change, again once per pod.
func TestLeaderElection(t *testing.T) {
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	original := waitPods(t, ns, "app=webapp", 2)
	replica := func(name string) controllerOpts {
		return controllerOpts{namespace: ns, extraEnv: []string{
			"LEADER_ELECT=true", "POD_NAME=" + name, "LEASE_NAME=e2e",
			"LEASE_DURATION=3s", "RENEW_DEADLINE=2s", "RETRY_PERIOD=500ms",
		}}
	}

	a := startController(t, replica("replica-a"))
	a.WaitReady(t)
	a.WaitMetric(t, 1, "config_watcher_leader")
	b := startController(t, replica("replica-b"))
	b.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	assert.Equal(t, float64(0), b.Metric(t, "config_watcher_leader"), "two leaders")

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"first change"}}`)
	waitDeleted(t, ns, adminUser, original)
	restarted := waitRestartedFor(t, ns, "webapp-config", adopted)
	replaced := waitPods(t, ns, "app=webapp", 2)
	a.Settle(t, ns)
	assertDeletedOnce(t, ns, adminUser, original)

	a.kill(t)
	mergePatch(t, ns, "webapp-config", `{"data":{"message":"changed after the leader died"}}`)
	b.WaitMetric(t, 1, "config_watcher_leader")
	waitDeleted(t, ns, adminUser, replaced)
	waitRestartedFor(t, ns, "webapp-config", restarted)
	waitPods(t, ns, "app=webapp", 2)
	b.Settle(t, ns)
	assertDeletedOnce(t, ns, adminUser, append(original, replaced...))
}

// kill ends the controller with SIGKILL, as a crash would: no shutdown, no
// Lease release.
func (c *controllerProc) kill(t *testing.T) {
	t.Helper()
	c.stopped = true
	_ = c.cmd.Process.Kill()
	<-c.done
}
