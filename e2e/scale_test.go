//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAllNamespacesPodIndexFollowsAnnotatedNamespaces ensures that with
// WATCH_NAMESPACE=* the pod index reads the pods of only the namespaces that
// hold an annotated ConfigMap: none of the pods of namespaces without one,
// and those of a namespace as soon as a ConfigMap there is annotated. Its
// pods restart once when the data then changes (whether the round began
// from the index or from a LIST while the index was still catching up), and
// once more each, together with the pods a widened selector newly matches,
// on the next change.
func TestAllNamespacesPodIndexFollowsAnnotatedNamespaces(t *testing.T) {
	const busyNamespaces, podsPerNamespace = 4, 10
	var busy []string
	for range busyNamespaces {
		ns := newNamespace(t)
		barePods(t, ns, "filler", podsPerNamespace)
		busy = append(busy, ns)
	}
	target := newNamespace(t)
	optIn(t, target)
	apply(t, target, tierDeployment("web")+"---\n"+tierDeployment("cache"))
	web := waitPods(t, target, "app=webapp,tier=web", 2)
	cache := waitPods(t, target, "app=webapp,tier=cache", 2)

	c := startController(t, controllerOpts{namespace: "*"})
	c.WaitReady(t)
	before := c.Metric(t, "config_watcher_pod_index_namespaces")

	// The target namespace gets its first annotated ConfigMap only now.
	apply(t, target, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: webapp-config
  annotations:
    %s: "app=webapp,tier=web"
data:
  message: "Hello"
`, selectorAnnotation))
	adopted := waitRestartedFor(t, target, "webapp-config", "")
	mergePatch(t, target, "webapp-config", `{"data":{"message":"first change"}}`)
	waitDeleted(t, target, adminUser, web)
	first := waitRestartedFor(t, target, "webapp-config", adopted)
	c.Settle(t, target)
	assertDeletedOnce(t, target, adminUser, web)
	eventually(t, waitTimeout, "the target namespace indexed", func() (bool, string) {
		v := c.Metric(t, "config_watcher_pod_index_namespaces")
		return v == before+1, fmt.Sprintf("%g namespaces indexed, %g before", v, before)
	})

	// Widen the selector to the cache pods; the next change restarts them
	// and the web pods' replacements, each once.
	mergePatch(t, target, "webapp-config", `{"metadata":{"annotations":{"`+selectorAnnotation+`":"app=webapp"}}}`)
	c.Settle(t, target)
	replacements := waitPods(t, target, "app=webapp,tier=web", 2)
	mergePatch(t, target, "webapp-config", `{"data":{"message":"second change"}}`)
	waitDeleted(t, target, adminUser, slices.Concat(replacements, cache))
	waitRestartedFor(t, target, "webapp-config", first)
	c.Settle(t, target)
	assertDeletedOnce(t, target, adminUser, slices.Concat(web, replacements, cache))

	// The index started for the target namespace, and never for the busy
	// ones. (The audit log records writes only; the controller says which
	// namespaces it indexes.)
	indexed := indexedNamespaces(t, c)
	assert.Contains(t, indexed, target)
	for _, ns := range busy {
		assert.NotContains(t, indexed, ns, "no index for %s, which has no annotated ConfigMap", ns)
		assert.Empty(t, podDeletes(t, ns, adminUser), "nothing deleted in %s", ns)
	}
}

// tierDeployment is a Deployment of two pods labelled app=webapp and
// tier=<tier>.
func tierDeployment(tier string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: webapp-%[1]s
spec:
  replicas: 2
  selector:
    matchLabels:
      app: webapp
      tier: %[1]s
  template:
    metadata:
      labels:
        app: webapp
        tier: %[1]s
    spec:
      containers:
      - name: webapp
        image: k8spatterns/mini-http-server
`, tier)
}

// indexedNamespaces lists the namespaces whose pod index the controller
// started, from its log.
func indexedNamespaces(t *testing.T, c *controllerProc) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(c.Log(t), "\n") {
		if !strings.Contains(line, `msg="pod index: indexing namespace"`) {
			continue
		}
		_, ns, ok := strings.Cut(line, " namespace=")
		require.True(t, ok, "log line without a namespace: %s", line)
		out = append(out, strings.Fields(ns)[0])
	}
	return out
}
