//go:build e2e

package e2e

// The tests of this file check how the restart budget is counted on the real
// control plane: the owners' desired replicas read from their scale
// subresource under the manifests' Role, the estimate and its Event without
// that rule, and two ConfigMaps over the same pods sharing one budget.

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// webappOwnedBy is the book's webapp (webapp-config, and replicas pods
// labelled app=webapp reading it) run by a controller of kind:
// ReplicaSet (through a Deployment), StatefulSet or ReplicationController.
func webappOwnedBy(kind string, replicas int) string {
	deployment := strings.Replace(webappManifests("app=webapp"), "replicas: 2", fmt.Sprintf("replicas: %d", replicas), 1)
	switch kind {
	case "StatefulSet":
		return strings.NewReplacer("kind: Deployment", "kind: StatefulSet",
			"spec:\n  replicas:", "spec:\n  serviceName: webapp\n  podManagementPolicy: Parallel\n  replicas:").Replace(deployment)
	case "ReplicationController":
		return strings.NewReplacer("apiVersion: apps/v1\nkind: Deployment", "apiVersion: v1\nkind: ReplicationController",
			"  selector:\n    matchLabels:\n      app: webapp\n", "  selector:\n    app: webapp\n").Replace(deployment)
	}
	return deployment
}

// TestBudgetReadsTheOwnersScale ensures a round in waves reads the desired
// replicas of its pods' owner from its scale subresource, under the
// manifests' Role, for each kind the Role names (ReplicaSet, StatefulSet,
// ReplicationController), and restarts the 3 Ready pods one at a time; and
// that without the Role's rule for that kind the read is refused (403 in the
// audit log), the controller says which rule is missing (a log line and an
// ExpectedPodsEstimated Warning Event), and still restarts every pod one at
// a time, counting the most pods it has seen.
func TestBudgetReadsTheOwnersScale(t *testing.T) {
	requireCluster(t)
	rbacFile := filepath.Join(repoRoot, "manifests", "base", "rbac.yaml")
	var role map[string]any
	for _, o := range decodeObjects(t, kubectl(t, "create", "--dry-run=client", "-o", "json", "-f", rbacFile)) {
		if o["kind"] == "Role" {
			role = o
		}
	}
	require.NotNil(t, role)
	for _, tt := range []struct{ kind, resource string }{
		{"Deployment", "replicasets"},
		{"StatefulSet", "statefulsets"},
		{"ReplicationController", "replicationcontrollers"},
	} {
		for _, withRule := range []bool{true, false} {
			name := tt.kind
			if !withRule {
				name += "WithoutTheRule"
			}
			t.Run(name, func(t *testing.T) {
				ns := newNamespace(t)
				user := "system:serviceaccount:" + ns + ":config-watcher"
				applyInNamespace(t, ns, rbacFile)
				if !withRule {
					apply(t, ns, reducedRole(t, role, rbacRule{tt.resource + "/scale", "get"}))
				}
				kubelet := startKubeletStandIn(t, ns, "webapp-config", func(map[string]string) bool { return true })
				pods := watchPods(t, ns, webappSelector, kubelet.podAdded)
				apply(t, ns, webappOwnedBy(tt.kind, 3))
				original := waitPods(t, ns, webappSelector, 3)
				eventually(t, waitTimeout, "3 Ready pods", func() (bool, string) {
					n, state := pods.serving()
					return n == 3, state
				})
				proxy := startProxy(t, serviceAccountKubeconfig(t, ns, "config-watcher"))
				c := startController(t, controllerOpts{namespace: ns, apiURL: proxy})
				c.WaitReady(t)
				adopted := waitRestartedFor(t, ns, "webapp-config", "")
				sampler := pods.sampleServing(sampleEvery)

				mergePatch(t, ns, "webapp-config", `{"data":{"message":"Hello, owners"}}`)
				waitDeleted(t, ns, user, original)
				waitRestartedFor(t, ns, "webapp-config", adopted)
				sampler.stop().assertAtLeast(t, 2)
				reads := auditEvents(t, func(e auditEvent) bool {
					return e.User.Username == user && e.Verb == "get" && e.ObjectRef != nil &&
						e.ObjectRef.Resource == tt.resource && e.ObjectRef.Subresource == "scale"
				})
				require.NotEmpty(t, reads, "reads of the %s's scale", tt.kind)
				estimated := slicesContainReason(objectEvents(t, "ConfigMap", ns, "webapp-config"), "ExpectedPodsEstimated")
				if withRule {
					for _, e := range reads {
						assert.Equal(t, 200, e.Code(), "%s", e)
					}
					assert.False(t, estimated, "an estimate with the scale readable")
					return
				}
				assert.Equal(t, 403, reads[0].Code(), "%s", reads[0])
				assert.True(t, estimated, "an ExpectedPodsEstimated Event")
				assert.Contains(t, c.Log(t), fmt.Sprintf("needs verb get on %s/scale", tt.resource))
			})
		}
	}
}

// slicesContainReason reports whether one of events has reason.
func slicesContainReason(events []coreEvent, reason string) bool {
	for _, e := range events {
		if e.Reason == reason {
			return true
		}
	}
	return false
}

// TestBudgetSharedByTwoObjectsOverTheSamePods ensures two annotated
// ConfigMaps that select the same 8 Ready pods, with MAX_UNAVAILABLE=2 and
// changed 0.1 s apart, never leave fewer than 6 of them serving, restart
// every pod that ran before the changes, and both record their data.
func TestBudgetSharedByTwoObjectsOverTheSamePods(t *testing.T) {
	const replicas, maxUnavailable = 8, 2
	f := webappInWaves(t, replicas, fmt.Sprintf("MAX_UNAVAILABLE=%d", maxUnavailable))
	apply(t, f.ns, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: webapp-extra
  annotations:
    %s: %q
data:
  feature: "off"
`, selectorAnnotation, webappSelector))
	extra := waitRestartedFor(t, f.ns, "webapp-extra", "")
	sampler := f.pods.sampleServing(sampleEvery)

	mergePatch(t, f.ns, "webapp-config", `{"data":{"message":"Hello, two rounds"}}`)
	time.Sleep(100 * time.Millisecond) // the second change 0.1 s after the first, as a user's two applies
	mergePatch(t, f.ns, "webapp-extra", `{"data":{"feature":"on"}}`)
	waitDeleted(t, f.ns, adminUser, f.original)
	waitRestartedFor(t, f.ns, "webapp-config", f.adopted)
	waitRestartedFor(t, f.ns, "webapp-extra", extra)
	f.waitServing(t, replicas)
	sampler.stop().assertAtLeast(t, replicas-maxUnavailable)
}

// TestBudgetReadsAnUnknownOwnerKindThroughDiscovery ensures a round in waves
// over pods whose owners are of kinds outside the controller's table reads
// each owner's group-version discovery document, then the scale it names:
// two Ready pods owned by a Deployment itself (its scale read) and one owned
// by a core object without a scale (as a mirror pod's Node, counted by its
// pods), and
// deletes one pod of the three (MAX_UNAVAILABLE=1), the ambassador passing
// every request.
func TestBudgetReadsAnUnknownOwnerKindThroughDiscovery(t *testing.T) {
	ns := newNamespace(t)
	// Paused: the Deployment creates no ReplicaSet, and selects no pod here.
	apply(t, ns, `apiVersion: apps/v1
kind: Deployment
metadata:
  name: owner
spec:
  replicas: 2
  paused: true
  selector:
    matchLabels:
      app: owner
  template:
    metadata:
      labels:
        app: owner
    spec:
      containers:
      - name: owner
        image: k8spatterns/mini-http-server
`)
	apply(t, ns, strings.SplitN(webappManifests(webappSelector), "---\n", 2)[0])
	owned := func(name, apiVersion, kind, owner string) string {
		uid := kubectl(t, "get", strings.ToLower(kind), owner, "-n", ns, "-o", "jsonpath={.metadata.uid}")
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  labels:
    app: webapp
  ownerReferences:
  - {apiVersion: %s, kind: %s, name: %s, uid: %s, controller: true}
spec:
  containers:
  - name: webapp
    image: k8spatterns/mini-http-server
`, name, apiVersion, kind, owner, uid)
	}
	kubelet := startKubeletStandIn(t, ns, "webapp-config", func(map[string]string) bool { return true })
	pods := watchPods(t, ns, webappSelector, kubelet.podAdded)
	apply(t, ns, owned("webapp-a", "apps/v1", "Deployment", "owner"))
	apply(t, ns, owned("webapp-b", "apps/v1", "Deployment", "owner"))
	apply(t, ns, owned("webapp-c", "v1", "ConfigMap", "webapp-config"))
	eventually(t, waitTimeout, "3 Ready pods", func() (bool, string) {
		n, state := pods.serving()
		return n == 3, state
	})
	c := startController(t, controllerOpts{namespace: ns, extraEnv: []string{"MAX_UNAVAILABLE=1"}})
	c.WaitReady(t)
	waitRestartedFor(t, ns, "webapp-config", "")

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"Hello, owners found by discovery"}}`)
	eventually(t, waitTimeout, "a pod deleted", func() (bool, string) {
		n := len(podDeletes(t, ns, adminUser))
		return n > 0, fmt.Sprintf("%d deleted", n)
	})
	// The audit policy logs no admin's read of a Deployment's scale: the
	// requests are the recorder's (paths_test.go), the outcome the log's.
	for _, path := range []string{"/apis/apps/v1", "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale", "/api/v1"} {
		assert.True(t, sent(t, http.MethodGet, path), "GET %s", path)
	}
	log := c.Log(t)
	assert.NotContains(t, log, "owner=Deployment/owner", "the Deployment's scale read")
	assert.Contains(t, log, "owner=ConfigMap/webapp-config pods=1 err=\"its kind has no scale subresource\"")
	assert.Len(t, podDeletes(t, ns, adminUser), 1, "MAX_UNAVAILABLE=1: one pod until a replacement is Ready, and none comes")
}
