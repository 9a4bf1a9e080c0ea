//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of this file try to make the controller restart a pod it must
// not (one relabelled out of the selector while its restart is retried, a
// replacement after the ConfigMap was replaced), drop a change (a write an
// admission policy refuses), or keep work on a standby, and judge the
// outcome from the API server's audit log.

// evictions returns the evictions in ns made by the controller.
func evictions(t *testing.T, ns string) []auditEvent {
	t.Helper()
	return auditEvents(t, func(e auditEvent) bool {
		return e.Verb == "create" && e.User.Username == adminUser && e.ObjectRef != nil && e.ObjectRef.Namespace == ns &&
			e.ObjectRef.Resource == "pods" && e.ObjectRef.Subresource == "eviction"
	})
}

// TestBystanderRelabelledDuringDeleteRetries ensures a pod relabelled out
// of the selector while its DELETE is being retried (the fault proxy
// answers 500) is not deleted once the faults stop, with and without the
// pod index (which only rounds of MAX_UNAVAILABLE=100% begin from).
func TestBystanderRelabelledDuringDeleteRetries(t *testing.T) {
	for _, podIndex := range []string{"false", "true"} {
		t.Run("POD_INDEX="+podIndex, func(t *testing.T) {
			const replicas = 3
			ns, pods, h, fp, c := webappBehindFaultProxyWith(t, replicas, "POD_INDEX="+podIndex, "MAX_UNAVAILABLE=100%")
			quarantined := pods[0].name
			fp.SetRules(t, fmt.Sprintf(`[{"name":"fail","method":"DELETE","path":"/pods/%s","status":500}]`, quarantined))

			h.set(t, "v2")
			require.Eventually(t, func() bool { return fp.Fired(t)["fail"] >= 2 }, waitTimeout, 50*time.Millisecond, "the DELETE retried")
			kubectl(t, "label", "pod", quarantined, "-n", ns, "app=quarantine", "--overwrite")
			fp.Clear(t)

			h.requirePromiseKept(t, quarantined)
			assert.True(t, slices.ContainsFunc(livePods(t, ns, "app=quarantine"), func(p pod) bool { return p.name == quarantined }))
			assert.Equal(t, float64(1), c.Metric(t, "config_watcher_pod_deletions_total", "result", "left"))
		})
	}
}

// TestBystanderRelabelledDuringRefusedEvictions ensures a pod relabelled
// out of the selector while a disruption budget refuses its eviction is
// not evicted once the budget is removed. The pods are set Running and
// Ready through pods/status, as a kubelet would: a budget ignores pods
// that are not. The budget is the only guard here (MAX_UNAVAILABLE=100%):
// with waves, the round would wait for replacements no kubelet makes Ready.
func TestBystanderRelabelledDuringRefusedEvictions(t *testing.T) {
	const replicas = 4
	ns := newNamespace(t)
	pods := webappWith(t, ns, replicas)
	for _, p := range pods {
		kubectl(t, "patch", "pod", p.name, "-n", ns, "--subresource=status", "--type=merge", "-p",
			`{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}`)
	}
	apply(t, ns, fmt.Sprintf(`apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: webapp
spec:
  minAvailable: %d
  selector:
    matchLabels:
      app: webapp
`, replicas))
	eventually(t, waitTimeout, "the budget counting the pods", func() (bool, string) {
		out := kubectl(t, "get", "pdb", "webapp", "-n", ns, "-o", "jsonpath={.status.currentHealthy}")
		return out == fmt.Sprint(replicas), out
	})
	h := trackChanges(t, ns, "app=webapp")
	c := startController(t, controllerOpts{namespace: ns, extraEnv: []string{"RESTART_STRATEGY=evict", "MAX_UNAVAILABLE=100%"}})
	c.WaitReady(t)
	waitRestartedFor(t, ns, "webapp-config", "")
	quarantined := pods[0].name

	h.set(t, "v2")
	eventually(t, waitTimeout, "evictions of "+quarantined+" refused twice", func() (bool, string) {
		refused := 0
		for _, e := range evictions(t, ns) {
			if e.ObjectRef.Name == quarantined && e.Code() == http.StatusTooManyRequests {
				refused++
			}
		}
		return refused >= 2, fmt.Sprint(refused)
	})
	kubectl(t, "label", "pod", quarantined, "-n", ns, "app=quarantine", "--overwrite")
	kubectl(t, "delete", "pdb", "webapp", "-n", ns)

	h.requirePromiseKept(t)
	evicted := map[string]int{}
	for _, e := range evictions(t, ns) {
		if e.OK() {
			evicted[e.ObjectRef.Name]++
		}
	}
	assert.Zero(t, evicted[quarantined], "the relabelled pod was evicted")
	for _, p := range pods[1:] {
		assert.Equal(t, 1, evicted[p.name], "pod %s evictions", p.name)
	}
	assert.Equal(t, float64(1), c.Metric(t, "config_watcher_pod_evictions_total", "result", "left"))
}

// TestBystanderAdmissionPolicyRefusalIsVisibleAndRetried ensures a
// ValidatingAdmissionPolicy that refuses the controller's intent (422) does
// not drop the change: a Warning Event says so while it refuses, and once
// the policy is removed (10 s after the change) each selected pod is deleted
// once. The policy matches the controller's writes by the annotation it
// adds: the harness and the controller act as the same user.
func TestBystanderAdmissionPolicyRefusalIsVisibleAndRetried(t *testing.T) {
	const replicas = 2
	ns := newNamespace(t)
	webappWith(t, ns, replicas)
	h := trackChanges(t, ns, "app=webapp")
	c := startController(t, controllerOpts{namespace: ns})
	c.WaitReady(t)
	waitRestartedFor(t, ns, "webapp-config", "")

	name := "cw-freeze-" + ns
	policy := fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: %[1]s
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["UPDATE"]
      resources: ["configmaps"]
  validations:
  - expression: "!has(object.metadata.annotations) || !('%[3]s' in object.metadata.annotations)"
    message: "no rounds of config-watcher here"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: %[1]s
spec:
  policyName: %[1]s
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: %[2]s
`, name, ns, restartingAnnotation)
	_, err := runKubectl(policy, "apply", "-f", "-")
	require.NoError(t, err)
	removed := false
	removePolicy := func() {
		if !removed {
			removed = true
			_, _ = runKubectl("", "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name, "--ignore-not-found")
		}
	}
	t.Cleanup(removePolicy)
	eventually(t, waitTimeout, "the policy in force", func() (bool, string) {
		_, err := runKubectl("", "annotate", "configmap", "webapp-config", "-n", ns, restartingAnnotation+"=probe", "--dry-run=server")
		return err != nil && strings.Contains(err.Error(), "no rounds of config-watcher here"), fmt.Sprint(err)
	})

	h.set(t, "v2")
	eventually(t, waitTimeout, "a Warning Event WriteRefused", func() (bool, string) {
		out := kubectl(t, "get", "events", "-n", ns, "--field-selector", "reason=WriteRefused,involvedObject.name=webapp-config", "-o", "jsonpath={.items[*].type}")
		return strings.Contains(out, "Warning"), out
	})
	require.Empty(t, podDeletes(t, ns, adminUser), "a pod deleted while the intent could not be written")
	// The round is retried under the policy: three refusals show the retries
	// keep failing before the first restart, not a moment of luck.
	eventually(t, waitTimeout, "three refused intent writes", func() (bool, string) {
		v := c.Metric(t, "config_watcher_writes_refused_total", "resource", "configmaps")
		return v >= 3, fmt.Sprint(v)
	})
	require.Empty(t, podDeletes(t, ns, adminUser), "a pod deleted while the intent could not be written")
	assert.GreaterOrEqual(t, c.Metric(t, "config_watcher_writes_refused_total", "resource", "configmaps"), float64(2), "retried")
	refusals := auditEvents(t, func(e auditEvent) bool {
		return e.Verb == "patch" && e.User.Username == adminUser && e.On(ns, "configmaps") && !e.OK()
	})
	require.NotEmpty(t, refusals)
	t.Logf("the policy answered the intent's PATCH %d", refusals[0].Code())
	assert.Equal(t, http.StatusUnprocessableEntity, refusals[0].Code())
	removePolicy()

	h.requirePromiseKept(t)
	assert.Equal(t, replicas, successfulDeletes(t, ns))
}

// TestBystanderReplaceMidRoundRestartsNoReplacement ensures an object
// replaced with the same data while its round runs (kubectl replace: the
// controller's annotations are gone) does not make the controller restart
// the replacements its round created: it writes its intent again and goes
// on.
func TestBystanderReplaceMidRoundRestartsNoReplacement(t *testing.T) {
	const replicas = 4
	ns, _, h, fp, _ := webappBehindFaultProxyWith(t, replicas, "MAX_CONCURRENT_RESTARTS=1")
	fp.SetRules(t, `[{"name":"hold","method":"DELETE","after":1,"times":1,"delay":"5s"}]`)

	h.set(t, "v2")
	require.Eventually(t, func() bool { return fp.Fired(t)["hold"] > 0 }, waitTimeout, 50*time.Millisecond)
	var cm map[string]any
	require.NoError(t, json.Unmarshal([]byte(kubectl(t, "get", "configmap", "webapp-config", "-n", ns, "-o", "json")), &cm))
	require.Contains(t, cm["metadata"].(map[string]any)["annotations"], restartingAnnotation, "the round's intent")
	meta := cm["metadata"].(map[string]any)
	for _, k := range []string{"resourceVersion", "uid", "creationTimestamp", "managedFields"} {
		delete(meta, k)
	}
	annotations := meta["annotations"].(map[string]any)
	delete(annotations, restartingAnnotation)
	delete(annotations, restartedAnnotation)
	raw, err := json.Marshal(cm)
	require.NoError(t, err)
	_, err = runKubectl(string(raw), "replace", "-n", ns, "-f", "-")
	require.NoError(t, err)

	h.requirePromiseKept(t)
	assert.Equal(t, replicas, successfulDeletes(t, ns))
}

// TestBystanderStandbyQueueStaysEmpty ensures a standby keeps no work
// queued while 2,000 ConfigMaps of generated names are created and
// deleted, and the leader's queue drains.
func TestBystanderStandbyQueueStaysEmpty(t *testing.T) {
	ns := newNamespace(t)
	a, b := startLeaderAndStandby(t, ns, "e2e-queue")

	const cycles = 2000
	path := env.proxyURL + "/api/v1/namespaces/" + ns + "/configmaps"
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"generateName":"gen-","annotations":{%q:"app=none"}},"data":{"k":"v"}}`, selectorAnnotation)
	for i := range cycles {
		resp, err := http.Post(path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		created, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode, "create %d: %s", i, created)
		var obj struct {
			Metadata struct{ Name string } `json:"metadata"`
		}
		require.NoError(t, json.Unmarshal(created, &obj))
		req, err := http.NewRequest(http.MethodDelete, path+"/"+obj.Metadata.Name, nil)
		require.NoError(t, err)
		resp, err = http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "delete %d", i)
	}
	eventually(t, waitTimeout, "the standby seeing the last deletion", func() (bool, string) {
		v := b.Metric(t, "config_watcher_events_total", "type", "DELETED")
		return v >= cycles, fmt.Sprint(v)
	})
	assert.Zero(t, b.Metric(t, "config_watcher_workqueue_depth"), "the standby's queue")
	assert.Zero(t, b.Metric(t, "config_watcher_leader"))
	eventually(t, waitTimeout, "the leader's queue drained", func() (bool, string) {
		v := a.Metric(t, "config_watcher_workqueue_depth")
		return v == 0, fmt.Sprint(v)
	})
}

// TestBystanderUIDPreconditionAnswer records how the API server answers a
// merge patch whose metadata.uid is not the object's (the controller's
// record on a ConfigMap replaced under the same name): the error table
// takes a 409, or a 422 with a cause on metadata.uid, as "replaced".
func TestBystanderUIDPreconditionAnswer(t *testing.T) {
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	req, err := http.NewRequest(http.MethodPatch, env.proxyURL+"/api/v1/namespaces/"+ns+"/configmaps/webapp-config",
		strings.NewReader(`{"metadata":{"uid":"00000000-0000-0000-0000-000000000000","annotations":{"x":"y"}}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/merge-patch+json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	t.Logf("a merge patch with another uid: %d %s", resp.StatusCode, b)
	var st struct {
		Details struct {
			Causes []struct{ Field string } `json:"causes"`
		} `json:"details"`
	}
	require.NoError(t, json.Unmarshal(b, &st))
	switch resp.StatusCode {
	case http.StatusConflict:
	case http.StatusUnprocessableEntity:
		assert.True(t, slices.ContainsFunc(st.Details.Causes, func(c struct{ Field string }) bool { return c.Field == "metadata.uid" }), "a 422 without a cause on metadata.uid")
	default:
		t.Errorf("answer %d", resp.StatusCode)
	}
}
