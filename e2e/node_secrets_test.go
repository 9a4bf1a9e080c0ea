//go:build e2e && e2enode

package e2e

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Secret on the real node: the demo's webapp takes its message from a Secret instead of
// its ConfigMap, in a namespace of the test's own, and a controller started by the test
// (the binary under test, on loopback inside the node's network namespace, through the
// shared proxy) watches that namespace with Secrets on.

const (
	nodeSecret      = "webapp-secret"
	nodeSecretState = "config-watcher-secret." + nodeSecret // where the controller keeps its state
)

// demoWithSecret returns the demo's Deployment (manifests/demo/webapp.yaml) with its
// message taken from Secret secret instead of the ConfigMap: the pods a user would run.
// It fails the test when the demo no longer reads its message from the ConfigMap.
func demoWithSecret(t *testing.T, secret string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "manifests", "demo", "webapp.yaml"))
	require.NoError(t, err)
	const fromConfigMap = "configMapKeyRef:\n              name: webapp-config\n"
	var deployment string
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(doc, "\nkind: Deployment\n") {
			deployment = doc
		}
	}
	require.Equal(t, 1, strings.Count(deployment, fromConfigMap), "manifests/demo/webapp.yaml: the Deployment's message no longer comes from %q", fromConfigMap)
	return strings.Replace(deployment, fromConfigMap, "secretKeyRef:\n              name: "+secret+"\n", 1)
}

// secretRestartedFor returns the restarted-for annotation of the state ConfigMap the
// controller keeps for a Secret in ns, "" while there is none.
func secretRestartedFor(t *testing.T, ns string) string {
	t.Helper()
	out, err := runKubectl("", "get", "configmap", nodeSecretState, "-n", ns, "--ignore-not-found",
		"-o", "jsonpath={.metadata.annotations."+strings.ReplaceAll(restartedAnnotation, ".", `\.`)+"}")
	require.NoError(t, err)
	return strings.TrimSpace(out)
}

// waitSecretRestartedFor waits until the Secret's recorded state is set and differs from
// not, and returns it: the controller has finished acting on the Secret's data.
func waitSecretRestartedFor(t *testing.T, ns, not string) string {
	t.Helper()
	var got string
	eventually(t, nodeTimeout, fmt.Sprintf("configmap %s/%s annotated %s (other than %q)", ns, nodeSecretState, restartedAnnotation, not), func() (bool, string) {
		got = secretRestartedFor(t, ns)
		return got != "" && got != not, fmt.Sprintf("annotation %q", got)
	})
	return got
}

// TestNodeSecretEnvServesTheNewValue ensures that pods reading a Secret's value as an
// environment variable (env valueFrom secretKeyRef) serve the new value after the
// Secret's data changes: the controller deletes each old pod once and the kubelet starts
// the replacements with the new value.
func TestNodeSecretEnvServesTheNewValue(t *testing.T) {
	requireNode(t)
	ns := newNamespace(t)
	key := filepath.Join(t.TempDir(), "digest-key")
	b := make([]byte, 32)
	_, err := rand.Read(b)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(key, b, 0o600))

	// Created, not applied: apply would keep the plain value in an annotation.
	value := "secret A " + randomSuffix()
	kubectlStdin(t, fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata:
  name: %s
  annotations:
    %s: %q
type: Opaque
stringData:
  message: %q
`, nodeSecret, selectorAnnotation, webappSel, value), "create", "-n", ns, "-f", "-")
	kubectlStdin(t, demoWithSecret(t, nodeSecret), "create", "-n", ns, "-f", "-")

	c := startController(t, controllerOpts{namespace: ns, extraEnv: []string{"WATCH_SECRETS=true", "DIGEST_KEY_FILE=" + key}})
	c.WaitReady(t)

	old := waitReadyPodsIn(t, ns, webappSel, 2)
	for name, body := range serve(t, old) {
		assert.Equal(t, value, body, "pod %s before the change", name)
	}
	// A change made before the controller adopted the Secret would be its first sight,
	// adopted as it is: wait for the adoption.
	adopted := waitSecretRestartedFor(t, ns, "")

	value = "secret B " + randomSuffix()
	kubectl(t, "patch", "secret", nodeSecret, "-n", ns, "--type=merge", "-p", fmt.Sprintf(`{"stringData":{"message":%q}}`, value))

	fresh := waitReplaced(t, ns, webappSel, old)
	for name, body := range serve(t, fresh) {
		assert.Equal(t, value, body, "pod %s after the change", name)
	}
	// The record moves on once the round is over: no deletion of it is still to come.
	waitSecretRestartedFor(t, ns, adopted)
	n := deletesByPod(podDeletes(t, ns, adminUser))
	for _, o := range old {
		assert.Equal(t, 1, n[o.Metadata.Name], "deletions of %s by %s", o.Metadata.Name, adminUser)
	}
	assert.Len(t, n, len(old), "pods deleted by %s: %v", adminUser, n)
}
