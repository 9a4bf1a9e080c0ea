//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

const (
	referencingAnnotation   = "k8spatterns.io/restartReferencingPods"
	restartedKeysAnnotation = "config-watcher.k8spatterns.io/restarted-for-keys"
)

// readerDeployment is a Deployment of two pods labelled app=name whose
// container reads shared-config as env says (a YAML list under the
// container, or "" for nothing).
func readerDeployment(name, env string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: %[1]s
spec:
  replicas: 2
  selector:
    matchLabels:
      app: %[1]s
  template:
    metadata:
      labels:
        app: %[1]s
    spec:
      containers:
      - name: app
        image: k8spatterns/mini-http-server
%[2]s
---
`, name, env)
}

// TestReferencingPodsRestartByKey ensures, on a real control plane, that a
// ConfigMap with restartReferencingPods and no selector restarts exactly
// the pods that read what changed: changing key a restarts the Deployment
// that reads a and the one that reads the whole object through envFrom,
// never the one that reads b; changing b then restarts the reader of b and
// the envFrom Deployment's pods (its replacements), not the reader of a's;
// a Deployment that references nothing is never restarted (audit log).
func TestReferencingPodsRestartByKey(t *testing.T) {
	ns := newNamespace(t)
	keyEnv := func(key string) string {
		return fmt.Sprintf(`        env:
        - name: VALUE
          valueFrom:
            configMapKeyRef:
              name: shared-config
              key: %s`, key)
	}
	apply(t, ns, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: shared-config
  annotations:
    %s: "true"
data:
  a: "1"
  b: "1"
---
`, referencingAnnotation)+
		readerDeployment("reads-a", keyEnv("a"))+
		readerDeployment("reads-b", keyEnv("b"))+
		readerDeployment("envfrom", `        envFrom:
        - configMapRef:
            name: shared-config`)+
		readerDeployment("nothing", ""))
	readsA, readsB := waitPods(t, ns, "app=reads-a", 2), waitPods(t, ns, "app=reads-b", 2)
	envFrom, nothing := waitPods(t, ns, "app=envfrom", 2), waitPods(t, ns, "app=nothing", 2)

	c := startController(t, controllerOpts{namespace: ns})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "shared-config", "")
	assert.Contains(t, getConfigMap(t, ns, "shared-config").Metadata.Annotations[restartedKeysAnnotation], "a=", "the adoption records the keys' digests")
	assert.Empty(t, podDeletes(t, ns, adminUser), "adopting deletes nothing")

	mergePatch(t, ns, "shared-config", `{"data":{"a":"2"}}`)
	waitDeleted(t, ns, adminUser, append(append([]pod{}, readsA...), envFrom...))
	recordA := waitRestartedFor(t, ns, "shared-config", adopted)
	c.Settle(t, ns)
	assertDeletedOnce(t, ns, adminUser, append(append([]pod{}, readsA...), envFrom...))
	deleted := deletesByPod(podDeletes(t, ns, adminUser))
	for _, p := range append(append([]pod{}, readsB...), nothing...) {
		assert.Zero(t, deleted[p.name], "pod %s reads no key that changed", p.name)
	}
	eventually(t, waitTimeout, "a PodsRestarted Event on shared-config", func() (bool, string) {
		out, err := runKubectl("", "get", "events", "-n", ns, "--field-selector", "involvedObject.kind=ConfigMap,involvedObject.name=shared-config,reason=PodsRestarted", "-o", "jsonpath={.items[*].message}")
		return err == nil && strings.Contains(out, "Restarted 4 pod(s) referencing ConfigMap shared-config"), out
	})

	newA, newEnvFrom := waitPods(t, ns, "app=reads-a", 2), waitPods(t, ns, "app=envfrom", 2)
	mergePatch(t, ns, "shared-config", `{"data":{"b":"2"}}`)
	waitDeleted(t, ns, adminUser, append(append([]pod{}, readsB...), newEnvFrom...))
	waitRestartedFor(t, ns, "shared-config", recordA)
	c.Settle(t, ns)
	deleted = deletesByPod(podDeletes(t, ns, adminUser))
	for _, p := range append(append([]pod{}, newA...), nothing...) {
		assert.Zero(t, deleted[p.name], "pod %s reads no key that changed", p.name)
	}
	total := 0
	for _, n := range deleted {
		total += n
	}
	assert.Equal(t, 8, total, "two changes, four pods each: %v", deleted)
}
