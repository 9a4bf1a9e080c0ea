//go:build e2e

package e2e

// The bad-input matrix against the real API server (issue 7): hostile
// selectors the API server stores without complaint are refused by the
// controller and delete nothing; a ConfigMap near the 1 MiB limit and a
// binaryData-only ConfigMap are acted on once. The full matrix is the unit
// tests policy/badinput_test.go and watch/badinput_test.go.

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// barePods creates n pods labelled app=label, owned by nothing (nobody replaces them).
func barePods(t *testing.T, ns, label string, n int) []pod {
	t.Helper()
	for i := range n {
		apply(t, ns, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s-%d
  labels:
    app: %s
spec:
  containers:
  - name: main
    image: k8spatterns/mini-http-server
`, label, i, label))
	}
	return waitPods(t, ns, "app="+label, n)
}

// createFromFile creates (not applies: a 1 MiB object would not fit in
// kubectl's last-applied annotation) the object in manifest.
func createFromFile(t *testing.T, ns, manifest string) {
	t.Helper()
	_, err := runKubectl(manifest, "create", "-n", ns, "-f", "-")
	require.NoError(t, err)
}

// patchFromFile merge-patches a ConfigMap with a patch too large for argv.
func patchFromFile(t *testing.T, ns, name, patch string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "patch.json")
	require.NoError(t, os.WriteFile(f, []byte(patch), 0o600))
	kubectl(t, "patch", "configmap", name, "-n", ns, "--type=merge", "--patch-file="+f)
}

// TestBadInputOnRealAPIServer ensures hostile selectors stored by the real API
// server are refused by the controller (logged with the ConfigMap's name,
// counted, no pod deleted, no pod list made with them), while in the same
// namespace a ConfigMap of 1,000,000 bytes of data and a binaryData-only
// ConfigMap have their pods restarted once each.
func TestBadInputOnRealAPIServer(t *testing.T) {
	ns := newNamespace(t)
	webapp := webappWith(t, ns, 2)
	hostile := map[string]string{
		"amp-injection":  "app=webapp&labelSelector=",
		"question-mark":  "app=webapp?watch=true",
		"hash-fragment":  "app=webapp#x",
		"percent-encode": "app%3Dwebapp",
		"non-ascii":      "app=wébapp",
		"overlong-key":   strings.Repeat("k", 64) + "=webapp",
		"overlong-value": "app=" + strings.Repeat("w", 64),
		"empty":          "",
		"negative-only":  "!role",
		// Too broad (issue 37, issue 36 item 5): the webapp's pods all carry
		// these, and so does every Deployment's pod.
		"existence-only":    "app",
		"pod-template-hash": "pod-template-hash",
	}
	for name, sel := range hostile {
		apply(t, ns, fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  annotations:\n    %s: %q\ndata:\n  message: one\n",
			name, selectorAnnotation, sel))
	}
	big := barePods(t, ns, "big", 2)
	bin := barePods(t, ns, "bin", 1)
	createFromFile(t, ns, fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big","annotations":{%q:"app=big"}},"data":{"blob":%q}}`,
		selectorAnnotation, strings.Repeat("a", 1_000_000)))
	createFromFile(t, ns, fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bin","annotations":{%q:"app=bin"}},"binaryData":{"blob":%q}}`,
		selectorAnnotation, base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 0xff})))

	c := startController(t, controllerOpts{namespace: ns})
	c.WaitReady(t)
	bigRec := waitRestartedFor(t, ns, "big", "")
	binRec := waitRestartedFor(t, ns, "bin", "")
	c.Settle(t, ns)
	invalid := c.Metric(t, "config_watcher_invalid_selectors_total")

	for name := range hostile {
		mergePatch(t, ns, name, `{"data":{"message":"two"}}`)
	}
	patchFromFile(t, ns, "big", fmt.Sprintf(`{"data":{"blob":%q}}`, strings.Repeat("b", 1_000_000)))
	mergePatch(t, ns, "bin", fmt.Sprintf(`{"binaryData":{"blob":%q}}`, base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 0xfe})))

	c.WaitMetric(t, invalid+float64(len(hostile)), "config_watcher_invalid_selectors_total")
	waitDeleted(t, ns, adminUser, append(append([]pod(nil), big...), bin...))
	waitRestartedFor(t, ns, "big", bigRec)
	waitRestartedFor(t, ns, "bin", binRec)
	c.Settle(t, ns)

	assertDeletedOnce(t, ns, adminUser, append(append([]pod(nil), big...), bin...))
	assert.ElementsMatch(t, webapp, livePods(t, ns, "app=webapp"), "a hostile selector deleted webapp pods")
	log := c.Log(t)
	for name := range hostile {
		assert.Regexp(t, `msg="refusing to restart pods: invalid selector".*configmap=`+name+` `, log, "refusal of %s not logged", name)
		assert.NotEmpty(t, getConfigMap(t, ns, name).Metadata.Annotations[restartedAnnotation], "%s adopted", name)
	}
	// No pod list carried a hostile selector: the audit log has every request a
	// ServiceAccount makes, but the admin's lists are not logged, so ask the controller.
	assert.Equal(t, invalid+float64(len(hostile)), c.Metric(t, "config_watcher_invalid_selectors_total"), "each refused once, not retried")
	assert.NotContains(t, log, strings.Repeat("a", 64), "data in the log")
	assert.NotContains(t, log, strings.Repeat("b", 64), "data in the log")
}
