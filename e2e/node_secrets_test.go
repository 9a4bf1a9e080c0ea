//go:build e2e && e2enode

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Secret on the real node: the demo (manifests/demo, its webapp reading a credential
// from the Secret webapp-credentials as the environment variable API_TOKEN), in a
// namespace of the test's own, its web server answering with that credential instead of
// its message. A controller started by the test (the binary under test, on loopback
// inside the node's network namespace, through the shared proxy) watches the namespace
// with Secrets on.

const (
	nodeSecret    = "webapp-credentials"
	nodeSecretKey = "token"
)

// demoServingTheSecret returns manifests/demo/webapp.yaml with the web server answering
// with API_TOKEN, which the demo reads from the Secret, instead of its message. It fails
// the test when the demo no longer reads API_TOKEN from the Secret.
func demoServingTheSecret(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "manifests", "demo", "webapp.yaml"))
	require.NoError(t, err)
	demo := string(b)
	const served, fromSecret = "- -text=$(MESSAGE)\n",
		"- name: API_TOKEN\n          valueFrom:\n            secretKeyRef:\n              name: " + nodeSecret + "\n              key: " + nodeSecretKey + "\n"
	require.Equal(t, 1, strings.Count(demo, served), "manifests/demo/webapp.yaml: the web server's argument")
	require.Equal(t, 1, strings.Count(demo, fromSecret), "manifests/demo/webapp.yaml: API_TOKEN from the Secret")
	return strings.Replace(demo, served, "- -text=$(API_TOKEN)\n", 1)
}

// secretValue returns the decoded value the Secret holds under nodeSecretKey.
func secretValue(t *testing.T, ns string) string {
	t.Helper()
	var s struct {
		Data map[string][]byte `json:"data"` // base64 in JSON
	}
	getJSON(t, ns, &s, "secret", nodeSecret)
	return string(s.Data[nodeSecretKey])
}

// TestNodeSecretEnvServesTheNewValue ensures that pods reading a Secret's value as an
// environment variable (env valueFrom secretKeyRef) serve the new value after the
// Secret's data changes: the controller deletes each old pod once and the kubelet starts
// the replacements with the new value.
func TestNodeSecretEnvServesTheNewValue(t *testing.T) {
	requireNode(t)
	ns := newNamespace(t)
	key := writeDigestKey(t)

	// Created, not applied: apply would keep the Secret's value in an annotation.
	kubectlStdin(t, demoServingTheSecret(t), "create", "-n", ns, "-f", "-")
	value := secretValue(t, ns)
	require.NotEmpty(t, value)

	c := startController(t, controllerOpts{namespace: ns, extraEnv: []string{"WATCH_SECRETS=true", "DIGEST_KEY_FILE=" + key}})
	c.WaitReady(t)

	old := waitReadyPodsIn(t, ns, webappSel, 2)
	for name, body := range serve(t, old) {
		assert.Equal(t, value, body, "pod %s before the change", name)
	}
	// A change made before the controller adopted the Secret would be its first sight,
	// adopted as it is: wait for the adoption.
	adopted := waitSecretRecordWithin(t, nodeTimeout, ns, nodeSecret, "")

	value = "rotated " + randomSuffix()
	kubectl(t, "patch", "secret", nodeSecret, "-n", ns, "--type=merge", "-p", fmt.Sprintf(`{"stringData":{%q:%q}}`, nodeSecretKey, value))
	require.Equal(t, value, secretValue(t, ns))

	fresh := waitReplaced(t, ns, webappSel, old)
	for name, body := range serve(t, fresh) {
		assert.Equal(t, value, body, "pod %s after the change", name)
	}
	// The record moves on once the round is over: no deletion of it is still to come.
	waitSecretRecordWithin(t, nodeTimeout, ns, nodeSecret, adopted)
	n := deletesByPod(podDeletes(t, ns, adminUser))
	for _, o := range old {
		assert.Equal(t, 1, n[o.Metadata.Name], "deletions of %s by %s", o.Metadata.Name, adminUser)
	}
	assert.Len(t, n, len(old), "pods deleted by %s: %v", adminUser, n)
}
