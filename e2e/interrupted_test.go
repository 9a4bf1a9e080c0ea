//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of this file drive the controller into the interrupted states of
// the state model (policy/doc.go) on the real control plane and check the
// promise from the audit log: every selected pod ends up running the
// current data, each restarted once per change, and nothing else deleted.

const restartingAnnotation = "config-watcher.k8spatterns.io/restarting"

// changes remembers each data change a test makes: when it was made, and
// at which revision. Pod creations come from a pod watch started first (the
// revision of its ADDED event is the pod's creation). Revisions of pods
// and ConfigMaps are compared with each other here: the test cluster has
// one etcd, whose revision numbers both (the controller never does this).
type changes struct {
	ns, selector string
	watchLog     string
	list         []dataChange
	// lateRoundsAllowed: a round whose start a failing API delays can take
	// a pod created after the change but before the round began (it is
	// restarted once, never twice). Such deletions are counted, not failed.
	lateRoundsAllowed bool
	late              int
}

type dataChange struct {
	at time.Time
	rv uint64
}

// trackChanges starts the pod watch of ns, for the lifetime of the test.
func trackChanges(t *testing.T, ns, selector string) *changes {
	t.Helper()
	h := &changes{ns: ns, selector: selector, watchLog: filepath.Join(t.TempDir(), "pods.json")}
	out, err := os.Create(h.watchLog)
	require.NoError(t, err)
	cmd := exec.Command(env.kubectl, "--kubeconfig="+env.kubeconfig, "get", "pods", "-n", ns, "--watch", "--output-watch-events", "-o", "json")
	cmd.Stdout = out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); out.Close() })
	eventually(t, waitTimeout, "the pod watch started", func() (bool, string) {
		return len(h.created(t)) > 0, ""
	})
	return h
}

// created maps each pod seen to the revision it was created at.
func (h *changes) created(t *testing.T) map[string]uint64 {
	t.Helper()
	f, err := os.Open(h.watchLog)
	require.NoError(t, err)
	defer f.Close()
	created := map[string]uint64{}
	dec := json.NewDecoder(f)
	for {
		var ev struct {
			Type   string `json:"type"`
			Object struct {
				Metadata objectMeta `json:"metadata"`
			} `json:"object"`
		}
		if dec.Decode(&ev) != nil {
			return created // the end, or an event still being written
		}
		if _, seen := created[ev.Object.Metadata.Name]; !seen && ev.Type == "ADDED" {
			created[ev.Object.Metadata.Name], _ = strconv.ParseUint(ev.Object.Metadata.ResourceVersion, 10, 64)
		}
	}
}

// set changes the webapp's data. The clock is read before the patch, so
// every deletion the audit log shows after `at` belongs to this change or
// a later one.
func (h *changes) set(t *testing.T, message string) {
	t.Helper()
	at := time.Now()
	out := kubectl(t, "patch", "configmap", "webapp-config", "-n", h.ns, "--type=merge", "-o", "jsonpath={.metadata.resourceVersion}",
		"-p", fmt.Sprintf(`{"data":{"message":%q}}`, message))
	rv, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
	require.NoError(t, err, "resourceVersion %q", out)
	h.list = append(h.list, dataChange{at: at, rv: rv})
}

// requirePromiseKept waits until no selected pod created before the last
// change survives, then checks from the audit log that no pod was deleted
// twice, that every deletion hit a pod created before the latest change
// preceding it (no pod created after a change is restarted for it), that the
// pods in spared were never deleted, and that no round is left in progress.
func (h *changes) requirePromiseKept(t *testing.T, spared ...string) {
	t.Helper()
	last := h.list[len(h.list)-1]
	eventually(t, waitTimeout, "every pod created before the last change replaced", func() (bool, string) {
		created := h.created(t)
		var old []string
		for _, p := range livePods(t, h.ns, h.selector) {
			if rv, ok := created[p.name]; !ok || rv < last.rv {
				old = append(old, p.name)
			}
		}
		return len(old) == 0, fmt.Sprintf("still running: %v", old)
	})
	eventually(t, waitTimeout, "the round's intent removed", func() (bool, string) {
		v, ok := getConfigMap(t, h.ns, "webapp-config").Metadata.Annotations[restartingAnnotation]
		return !ok, v
	})
	created := h.created(t)
	events := podDeletes(t, h.ns, adminUser)
	n := deletesByPod(events)
	for name, k := range n {
		assert.LessOrEqual(t, k, 1, "pod %s deleted %d times", name, k)
	}
	for _, e := range events {
		if !e.OK() {
			continue
		}
		received := e.Received
		i := len(h.list) - 1
		for i > 0 && h.list[i].at.After(received) {
			i--
		}
		rv, ok := created[e.ObjectRef.Name]
		if ok && rv > h.list[i].rv && h.lateRoundsAllowed {
			h.late++
			continue
		}
		assert.True(t, ok && rv < h.list[i].rv, "pod %s (created at revision %d) deleted at %s for change %d (revision %d)",
			e.ObjectRef.Name, rv, received.Format(time.StampMicro), i, h.list[i].rv)
	}
	for _, name := range spared {
		assert.Zero(t, n[name], "pod %s was deleted", name)
	}
}

// webappBehindFaultProxy starts the webapp with replicas pods in a new
// namespace, a pod watch for the test's judgement, and a controller that
// talks to the API server through a fault proxy without rules yet; it
// returns once the controller is ready and has adopted the ConfigMap.
func webappBehindFaultProxy(t *testing.T, replicas int) (ns string, pods []pod, h *changes, fp *faultProxy) {
	t.Helper()
	ns, pods, h, fp, _ = webappBehindFaultProxyWith(t, replicas)
	return ns, pods, h, fp
}

// webappBehindFaultProxyWith is webappBehindFaultProxy with settings for
// the controller, which it returns too.
func webappBehindFaultProxyWith(t *testing.T, replicas int, extraEnv ...string) (ns string, pods []pod, h *changes, fp *faultProxy, c *controllerProc) {
	t.Helper()
	ns = newNamespace(t)
	pods = webappWith(t, ns, replicas)
	h = trackChanges(t, ns, "app=webapp")
	fp = startFaultProxy(t, env.proxyURL)
	c = startController(t, controllerOpts{namespace: ns, apiURL: fp.url, extraEnv: extraEnv})
	c.WaitReady(t)
	waitRestartedFor(t, ns, "webapp-config", "")
	return ns, pods, h, fp, c
}

// successfulDeletes counts the controller's successful pod deletions in ns.
func successfulDeletes(t *testing.T, ns string) int {
	n := 0
	for _, k := range deletesByPod(podDeletes(t, ns, adminUser)) {
		n += k
	}
	return n
}

// TestInterruptedKilledThenReverted ensures data set back to the recorded
// value after a round cut short by SIGKILL restarts every pod: the
// replacements of the cut-short round run the data in between.
func TestInterruptedKilledThenReverted(t *testing.T) {
	const replicas, passed = 6, 2
	ns := newNamespace(t)
	webappWith(t, ns, replicas)
	h := trackChanges(t, ns, "app=webapp")
	fp := startFaultProxy(t, env.proxyURL)
	first := startController(t, controllerOpts{namespace: ns, apiURL: fp.url})
	first.WaitReady(t)
	waitRestartedFor(t, ns, "webapp-config", "")
	fp.SetRules(t, fmt.Sprintf(`[{"name":"hold","method":"DELETE","after":%d,"delay":"120s"}]`, passed))

	h.set(t, "v2")
	eventually(t, waitTimeout, fmt.Sprintf("%d deletions", passed), func() (bool, string) {
		n := successfulDeletes(t, ns)
		return n >= passed, fmt.Sprint(n)
	})
	require.Eventually(t, func() bool { return fp.Fired(t)["hold"] > 0 }, 10*time.Second, 50*time.Millisecond)
	first.Kill(t)
	require.Contains(t, getConfigMap(t, ns, "webapp-config").Metadata.Annotations, restartingAnnotation,
		"the intent was written before the first deletion")
	waitPods(t, ns, "app=webapp", replicas)

	h.set(t, "Hello") // back to the recorded data
	fp.Clear(t)
	second := startController(t, controllerOpts{namespace: ns, apiURL: fp.url})
	second.WaitReady(t)
	h.requirePromiseKept(t)
}

// TestInterruptedRecordFailsThenReverted ensures data set back while the
// record of a round is being retried (503, Retry-After 30 s) restarts every
// pod for the data set back: all of them had been restarted for the other.
func TestInterruptedRecordFailsThenReverted(t *testing.T) {
	const replicas = 6
	ns, _, h, fp := webappBehindFaultProxy(t, replicas)
	// The intent's PATCH passes; the record's is refused once, for 30 s.
	fp.SetRules(t, `[{"name":"record503","method":"PATCH","path":"/configmaps/webapp-config","after":1,"times":1,"status":503,"retryAfter":30}]`)

	h.set(t, "v2")
	require.Eventually(t, func() bool { return fp.Fired(t)["record503"] > 0 }, waitTimeout, 50*time.Millisecond)
	require.Equal(t, replicas, successfulDeletes(t, ns))
	waitPods(t, ns, "app=webapp", replicas)
	h.set(t, "Hello")
	h.requirePromiseKept(t)
}

// TestInterruptedToggleNeverReusesARound ensures a round for data that was
// left and came back is never resumed: a v2 round fails on one pod, the data
// goes back to v1, every pod is replaced by a third party (scaled to zero
// and back), and v2 again restarts every pod.
func TestInterruptedToggleNeverReusesARound(t *testing.T) {
	const replicas = 4
	ns, pods, h, fp := webappBehindFaultProxy(t, replicas)
	fp.SetRules(t, fmt.Sprintf(`[{"name":"stuck","method":"DELETE","path":"/pods/%s","status":500}]`, pods[0].name))

	h.set(t, "v2")
	eventually(t, waitTimeout, "the v2 round failing on one pod", func() (bool, string) {
		n := successfulDeletes(t, ns)
		return n == replicas-1 && fp.Fired(t)["stuck"] > 1, fmt.Sprint(n)
	})
	h.set(t, "Hello")
	fp.Clear(t)
	h.requirePromiseKept(t)

	kubectl(t, "scale", "deployment", "webapp", "-n", ns, "--replicas=0")
	waitPods(t, ns, "app=webapp", 0)
	kubectl(t, "scale", "deployment", "webapp", "-n", ns, "--replicas="+fmt.Sprint(replicas))
	waitPods(t, ns, "app=webapp", replicas)
	h.set(t, "v2")
	h.requirePromiseKept(t)
}

// TestInterruptedFrozenIndexDeletesNoBystander ensures a pod index whose
// watch is down is not trusted: with the pod watch refused and its stream
// cut, a selected pod relabelled out of the selection is not deleted when
// the data changes, and the others are restarted.
func TestInterruptedFrozenIndexDeletesNoBystander(t *testing.T) {
	const replicas = 3
	ns, pods, h, fp := webappBehindFaultProxy(t, replicas)

	fp.SetRules(t, `[{"name":"podwatch503","watch":"true","path":"/pods","status":503}]`)
	fp.Drop(t) // cut the streams in flight; the pod watch cannot come back
	require.Eventually(t, func() bool { return fp.Fired(t)["podwatch503"] > 0 }, waitTimeout, 50*time.Millisecond)
	quarantined := pods[0].name
	kubectl(t, "label", "pod", quarantined, "-n", ns, "app=quarantine", "--overwrite")
	// Its ReplicaSet replaces it before the change: one created after the
	// change and before the controller saw it is a window of design.md,
	// not what this test is about (a loaded machine's ReplicaSet controller
	// made it 1 revision after the change, and the round restarted it).
	waitPods(t, ns, "app=webapp", replicas)

	h.set(t, "v2")
	h.requirePromiseKept(t, quarantined)
	assert.True(t, slices.ContainsFunc(livePods(t, ns, "app=quarantine"), func(p pod) bool { return p.name == quarantined }))
}

// TestInterruptedFaultsRestartNothingTwice ensures that through a slow,
// failing API (15 % 429, 15 % 500, 20 ms latency, watch streams cut in the
// middle of a line) ten data changes 2.5 s apart restart each pod at most
// once per change (the storm guard off): over several runs, the successful
// deletions never exceed pods × changes, and every pod ends up running the
// last data.
func TestInterruptedFaultsRestartNothingTwice(t *testing.T) {
	const replicas, changesPerRun, runs = 2, 10, 3
	for run := range runs {
		t.Run(fmt.Sprintf("run-%d", run+1), func(t *testing.T) {
			// Ten changes in 25 s are a storm by default (more than 5 a
			// minute): this test is of every change acted on.
			ns, _, h, fp, _ := webappBehindFaultProxyWith(t, replicas, "STORM_CHANGES=0")
			h.lateRoundsAllowed = true
			fp.SetRules(t, `[
			  {"name":"latency","delay":"20ms"},
			  {"name":"busy","watch":"false","status":429,"retryAfter":1,"probability":0.15},
			  {"name":"broken","watch":"false","status":500,"probability":0.15},
			  {"name":"cut","watch":"true","cutAfterLines":1,"halfLine":true,"probability":0.5}
			]`)
			for i := range changesPerRun {
				// Cuts apply to watches opened under the rules, and a watch
				// that escapes one lives for minutes: dropping the
				// connections at every change makes each watch reconnect
				// ten times, so that the cut rule fires in every run.
				fp.Drop(t)
				h.set(t, fmt.Sprintf("change %d", i))
				time.Sleep(2500 * time.Millisecond) // the changes' pace is the scenario, not a wait for a condition
			}
			fired := fp.Fired(t)
			fp.Clear(t)
			h.requirePromiseKept(t)
			deletes := successfulDeletes(t, ns)
			t.Logf("successful deletions: %d (at most %d), of pods created after the change but before a delayed round: %d; faults fired: %v",
				deletes, replicas*changesPerRun, h.late, fired)
			assert.LessOrEqual(t, deletes, replicas*changesPerRun)
			for _, rule := range []string{"busy", "broken", "cut"} {
				assert.Positive(t, fired[rule], "rule %s never fired: the test did not test it", rule)
			}
		})
	}
}
