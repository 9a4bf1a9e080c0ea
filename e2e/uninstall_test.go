//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// installedLabel is on every object the manifests install.
const installedLabel = "app.kubernetes.io/name=config-watcher"

// TestUninstallLeavesNothing ensures hack/uninstall.sh (make uninstall), run
// on an install with Secrets on that has acted once, stops the controller
// before it touches anything and leaves no object, annotation, state or
// Event of config-watcher's, and nothing else changed.
//
// The control plane has no kubelet, so the test plays one for the
// installed Deployment: the pods are bound to a node that does not exist
// (they stay Terminating when deleted, as on a real node), one controller
// process runs per pod, as that pod and as its ServiceAccount, and when a
// pod is deleted its process is stopped before the pod is let go.
func TestUninstallLeavesNothing(t *testing.T) {
	ns := newNamespace(t)
	keyFile := writeDigestKey(t)
	install(t, ns, "manifests/secrets")
	kubectl(t, "create", "secret", "generic", "config-watcher-digest-key", "-n", ns, "--from-file=key="+keyFile)

	// The webapp, restarted by a ConfigMap and by a Secret.
	apply(t, ns, webappManifests("app=webapp"))
	createFromFile(t, ns, secretJSON("webapp-secret", "Opaque", map[string]string{"token": "one"}, map[string]string{selectorAnnotation: "app=webapp"}))
	waitPods(t, ns, "app=webapp", 2)

	user := "system:serviceaccount:" + ns + ":config-watcher"
	eventually(t, 30*time.Second, "the installed RBAC in effect", func() (bool, string) {
		out, _ := runKubectl("", "auth", "can-i", "watch", "secrets", "-n", ns, "--as", user)
		return strings.TrimSpace(out) == "yes", out
	})
	proxy := startProxy(t, serviceAccountKubeconfig(t, ns, "config-watcher"))
	running := map[string]*controllerProc{}
	for _, p := range waitPods(t, ns, installedLabel, 2) {
		running[p.name] = startController(t, controllerOpts{namespace: ns, apiURL: proxy, extraEnv: []string{
			"POD_NAME=" + p.name, "LEADER_ELECT=true", "WATCH_SECRETS=true", "DIGEST_KEY_FILE=" + keyFile}})
	}
	for _, c := range running {
		c.WaitReady(t)
	}
	eventually(t, waitTimeout, "one leader", func() (bool, string) {
		leaders := 0.0
		for _, c := range running {
			leaders += c.Metric(t, "config_watcher_leader")
		}
		return leaders == 1, fmt.Sprint(leaders)
	})

	// It acts once: both adopted, a data change restarts the pods and is recorded.
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	waitSecretRecord(t, ns, "webapp-secret", "")
	mergePatch(t, ns, "webapp-config", `{"data":{"message":"Hello, uninstall"}}`)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	waitConfigMapEvent(t, ns, "webapp-config", "Normal", "PodsRestarted")

	started := time.Now()
	uninstall := exec.Command("bash", filepath.Join(repoRoot, "hack", "uninstall.sh"), ns)
	uninstall.Env = append(os.Environ(), "KUBECTL="+env.kubectl, "KUBECONFIG="+env.kubeconfig, "YES=1") // no one to ask
	var out bytes.Buffer
	uninstall.Stdout, uninstall.Stderr = &out, &out
	require.NoError(t, uninstall.Start())
	done := make(chan error, 1)
	go func() { done <- uninstall.Wait() }()
	var uninstalled error
	for waiting := true; waiting; {
		select {
		case uninstalled = <-done:
			waiting = false
		case <-time.After(pollInterval):
			var pods podList
			getJSON(t, ns, &pods, "pods", "-l", installedLabel)
			for _, p := range pods.Items {
				if c := running[p.Metadata.Name]; c != nil && p.Metadata.DeletionTimestamp != nil {
					c.Stop(t) // as the kubelet stops the container, then confirms the deletion
					delete(running, p.Metadata.Name)
					kubectl(t, "delete", "pod", p.Metadata.Name, "-n", ns, "--grace-period=0", "--force")
				}
			}
		}
	}
	require.NoError(t, uninstalled, "hack/uninstall.sh:\n%s", out.String())
	t.Logf("hack/uninstall.sh:\n%s", out.String())
	require.Empty(t, running, "the uninstall ended with controllers running")

	eventually(t, waitTimeout, "no installed object left", func() (bool, string) {
		left := kubectl(t, "get", "deployment,replicaset,pod,poddisruptionbudget,service,configmap,serviceaccount,role,rolebinding", "-n", ns, "-l", installedLabel, "-o", "name")
		return strings.TrimSpace(left) == "", left
	})
	assert.Empty(t, strings.TrimSpace(kubectl(t, "get", "lease", "-n", ns, "-o", "name")), "the Lease is left")
	assert.Empty(t, strings.TrimSpace(kubectl(t, "get", "secret", "-n", ns, "--field-selector", "metadata.name=config-watcher-digest-key", "-o", "name")), "the digest key is left")
	assert.Empty(t, strings.TrimSpace(kubectl(t, "get", "configmap", "-n", ns, "-l", managedByLabel+"=config-watcher", "-o", "name")), "a state ConfigMap is left")
	assert.Empty(t, strings.TrimSpace(kubectl(t, "get", "events", "-n", ns, "--field-selector", "reportingComponent=config-watcher", "-o", "name")), "an Event of config-watcher's is left")
	var cms struct{ Items []configMap }
	getJSON(t, ns, &cms, "configmaps")
	for _, cm := range cms.Items {
		for k := range cm.Metadata.Annotations {
			assert.False(t, strings.HasPrefix(k, controllerAnnotations), "configmap %s keeps %s", cm.Metadata.Name, k)
		}
	}
	// Nothing else: the user's objects keep their own annotations and data.
	cm := getConfigMap(t, ns, "webapp-config")
	assert.Equal(t, "app=webapp", cm.Metadata.Annotations[selectorAnnotation])
	assert.Equal(t, "Hello, uninstall", cm.Data["message"])
	assert.Equal(t, "app=webapp", getSecret(t, ns, "webapp-secret").Metadata.Annotations[selectorAnnotation])
	waitPods(t, ns, "app=webapp", 2)

	// Stopped first: every request of the controllers came before the first
	// removal of their annotations.
	var lastByController, firstRemoval time.Time
	for _, e := range auditEvents(t, func(e auditEvent) bool { return e.ObjectRef != nil && e.ObjectRef.Namespace == ns }) {
		switch {
		case e.User.Username == user && e.Received.After(lastByController):
			lastByController = e.Received
		case e.User.Username == adminUser && e.Verb == "patch" && e.On(ns, "configmaps") && e.ObjectRef.Name == "webapp-config" && e.Received.After(started):
			if firstRemoval.IsZero() || e.Received.Before(firstRemoval) {
				firstRemoval = e.Received
			}
		}
	}
	require.False(t, firstRemoval.IsZero(), "the audit log shows no removal of the annotations")
	assert.True(t, lastByController.Before(firstRemoval), "the controller's last request (%s) came after the first removal of its annotations (%s)",
		lastByController.Format(time.RFC3339Nano), firstRemoval.Format(time.RFC3339Nano))
}

// install applies manifests/ in ns as a user's kustomization would, with the
// given components, its pods bound to a node that does not exist: deleted,
// they stay Terminating until someone confirms (the test, playing the
// kubelet), as pods on a real node do until their containers stopped.
func install(t *testing.T, ns string, components ...string) {
	t.Helper()
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(repoRoot, p))
		require.NoError(t, err)
		return r
	}
	var comps strings.Builder
	for _, c := range components {
		fmt.Fprintf(&comps, "- %s\n", rel(c))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), fmt.Appendf(nil, `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %s
resources:
- %s
components:
%spatches:
- patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: config-watcher
    spec:
      template:
        spec:
          nodeName: e2e-kubelet-stand-in
`, ns, rel("manifests"), comps.String()), 0o600))
	_, err := runKubectl(kubectl(t, "kustomize", dir), "apply", "-f", "-")
	require.NoError(t, err)
}
