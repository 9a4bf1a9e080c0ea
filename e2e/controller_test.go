//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDataChangeRestartsPods ensures the book's scenario: changing the data of
// webapp-config deletes each of the webapp Deployment's pods exactly once, and the
// Deployment replaces them.
func TestDataChangeRestartsPods(t *testing.T) {
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	original := waitPods(t, ns, "app=webapp", 2)

	c := startController(t, controllerOpts{namespace: ns})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	assert.Empty(t, podDeletes(t, ns, adminUser), "adopting a ConfigMap must delete nothing")

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"Hello, World"}}`)
	waitDeleted(t, ns, adminUser, original)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	replaced := waitPods(t, ns, "app=webapp", 2)
	for _, p := range replaced {
		assert.NotContains(t, original, p, "pod %s survived the data change", p.name)
	}

	c.Settle(t, ns)
	assertDeletedOnce(t, ns, adminUser, original)
	assert.Equal(t, float64(2), c.Metric(t, "config_watcher_pod_deletions_total", "result", "deleted"))
	eventually(t, waitTimeout, "a PodsRestarted Event on webapp-config", func() (bool, string) {
		out, err := runKubectl("", "get", "events", "-n", ns, "--field-selector", "involvedObject.kind=ConfigMap,involvedObject.name=webapp-config,reason=PodsRestarted", "-o", "jsonpath={.items[*].message}")
		return err == nil && strings.Contains(out, "Restarted 2 pod(s) matching app=webapp"), out
	})
}

// TestMetadataOnlyEditsRestartNothing ensures that label-only and annotation-only
// edits of the ConfigMap, which leave its data alone, delete no pod.
func TestMetadataOnlyEditsRestartNothing(t *testing.T) {
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	original := waitPods(t, ns, "app=webapp", 2)

	c := startController(t, controllerOpts{namespace: ns})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	modified := c.Metric(t, "config_watcher_events_total", "type", "MODIFIED")

	kubectl(t, "label", "configmap", "webapp-config", "-n", ns, "tier=frontend")
	kubectl(t, "annotate", "configmap", "webapp-config", "-n", ns, "example.com/owner=team-a")
	c.WaitMetric(t, modified+2, "config_watcher_events_total", "type", "MODIFIED")
	c.Settle(t, ns)

	assert.Empty(t, podDeletes(t, ns, adminUser), "metadata-only edits deleted pods")
	assert.ElementsMatch(t, original, livePods(t, ns, "app=webapp"))
	assert.Equal(t, adopted, getConfigMap(t, ns, "webapp-config").Metadata.Annotations[restartedAnnotation],
		"the recorded hash must not change when the data did not")
}

// TestRBACManifestsAreEnough ensures the ServiceAccount, Role and RoleBinding in
// manifests/base/rbac.yaml grant what the controller needs: run through a kubectl proxy
// holding that account's token, it restarts the pods, and the API server never
// answers it 403.
func TestRBACManifestsAreEnough(t *testing.T) {
	requireCluster(t)
	rbac := filepath.Join(repoRoot, "manifests", "base", "rbac.yaml")
	if _, err := os.Stat(rbac); err != nil {
		t.Fatalf("manifests/base/rbac.yaml (ServiceAccount config-watcher, its Role and RoleBinding) is missing: %v", err)
	}
	ns := newNamespace(t)
	applyInNamespace(t, ns, rbac)
	apply(t, ns, webappManifests("app=webapp"))
	original := waitPods(t, ns, "app=webapp", 2)

	user := "system:serviceaccount:" + ns + ":config-watcher"
	proxy := startProxy(t, serviceAccountKubeconfig(t, ns, "config-watcher"))
	// As deployed: with leader election, so the Lease rules are exercised too.
	c := startController(t, controllerOpts{namespace: ns, apiURL: proxy, extraEnv: []string{"LEADER_ELECT=true", "POD_NAME=config-watcher-rbac"}})
	c.WaitReady(t)
	c.WaitMetric(t, 1, "config_watcher_leader")
	adopted := waitRestartedFor(t, ns, "webapp-config", "")

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"Hello, RBAC"}}`)
	waitDeleted(t, ns, user, original)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	waitPods(t, ns, "app=webapp", 2)
	c.Settle(t, ns)

	assertDeletedOnce(t, ns, user, original)
	assert.Empty(t, podDeletes(t, ns, adminUser), "pods were deleted with the admin identity, not the ServiceAccount's")
	refused := auditEvents(t, func(e auditEvent) bool {
		return e.User.Username == user && e.Code() == 403
	})
	assert.Empty(t, refused, "the API server refused the ServiceAccount's requests: the Role lacks permissions")
	seen := auditEvents(t, func(e auditEvent) bool { return e.User.Username == user })
	assert.NotEmpty(t, seen, "the audit log shows no request by %s: is the policy logging ServiceAccounts?", user)
}

// TestChangeWhileStoppedRestartsOnce ensures a data change made while the controller
// was down is acted on once when it starts again, and that a start with nothing
// changed deletes nothing.
func TestChangeWhileStoppedRestartsOnce(t *testing.T) {
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	original := waitPods(t, ns, "app=webapp", 2)

	first := startController(t, controllerOpts{namespace: ns})
	first.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	first.Settle(t, ns)
	first.Stop(t)
	require.Empty(t, podDeletes(t, ns, adminUser), "adopting a ConfigMap must delete nothing")

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"changed while nobody watched"}}`)

	second := startController(t, controllerOpts{namespace: ns})
	second.WaitReady(t)
	waitDeleted(t, ns, adminUser, original)
	restarted := waitRestartedFor(t, ns, "webapp-config", adopted)
	replaced := waitPods(t, ns, "app=webapp", 2)
	second.Settle(t, ns)
	second.Stop(t)
	assertDeletedOnce(t, ns, adminUser, original)

	third := startController(t, controllerOpts{namespace: ns})
	third.WaitReady(t)
	third.Settle(t, ns)
	assert.Len(t, podDeletes(t, ns, adminUser), 2, "a restart with no data change deleted pods")
	assert.ElementsMatch(t, replaced, livePods(t, ns, "app=webapp"))
	assert.Equal(t, restarted, getConfigMap(t, ns, "webapp-config").Metadata.Annotations[restartedAnnotation])
}

// TestInvalidSelectorsDeleteNothing ensures a selector that does not parse, and one made
// only of negative terms (which would match nearly every pod), are refused loudly and
// delete nothing, while a valid ConfigMap in the same namespace still works.
func TestInvalidSelectorsDeleteNothing(t *testing.T) {
	ns := newNamespace(t)
	// A bystander without an app label: exactly what "!app" would match.
	apply(t, ns, `apiVersion: v1
kind: Pod
metadata:
  name: bystander
  labels:
    role: bystander
spec:
  containers:
  - name: main
    image: k8spatterns/mini-http-server
`)
	apply(t, ns, webappManifests("app=webapp"))
	bad := map[string]string{"syntax-error": "app in (", "negative-only": "!app"}
	for name, sel := range bad {
		apply(t, ns, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: %s
  annotations:
    %s: %q
data:
  message: "one"
`, name, selectorAnnotation, sel))
	}
	webapp := waitPods(t, ns, "app=webapp", 2)
	bystander := waitPods(t, ns, "role=bystander", 1)

	c := startController(t, controllerOpts{namespace: ns})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	c.Settle(t, ns)
	invalid := c.Metric(t, "config_watcher_invalid_selectors_total")

	for name := range bad {
		mergePatch(t, ns, name, `{"data":{"message":"two"}}`)
	}
	// Each data change is refused once: no pod of either selector is deleted.
	c.WaitMetric(t, invalid+2, "config_watcher_invalid_selectors_total")
	c.Settle(t, ns)
	assert.Empty(t, podDeletes(t, ns, adminUser), "an invalid selector deleted pods")
	assert.ElementsMatch(t, bystander, livePods(t, ns, "role=bystander"))
	assert.ElementsMatch(t, webapp, livePods(t, ns, "app=webapp"))

	mergePatch(t, ns, "webapp-config", `{"data":{"message":"still works"}}`)
	waitDeleted(t, ns, adminUser, webapp)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	waitPods(t, ns, "app=webapp", 2)
	c.Settle(t, ns)
	assertDeletedOnce(t, ns, adminUser, webapp)
	assert.ElementsMatch(t, bystander, livePods(t, ns, "role=bystander"), "the bystander pod was deleted")
}

// TestManifestsPassServerDryRun ensures every manifest in manifests/ is accepted by a
// real API server (schema, defaulting, admission), not merely by kubectl's parser.
// Objects of kinds this control plane does not serve (the Prometheus Operator's, of
// the monitoring component) are left out, and named in the log.
func TestManifestsPassServerDryRun(t *testing.T) {
	requireCluster(t)
	dir := filepath.Join(repoRoot, "manifests")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("manifests/ does not exist yet: %v", err)
	}
	ns := newNamespace(t)

	var files, kustomizations []string
	require.NoError(t, filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch base := filepath.Base(path); {
		case base == "kustomization.yaml" || base == "kustomization.yml" || base == "Kustomization":
			kustomizations = append(kustomizations, filepath.Dir(path))
		case strings.HasSuffix(base, ".yaml") || strings.HasSuffix(base, ".yml") || strings.HasSuffix(base, ".json"):
			files = append(files, path)
		}
		return nil
	}))
	require.NotEmpty(t, append(files, kustomizations...), "manifests/ holds no manifest")
	served := servedKinds(t)

	for _, k := range kustomizations {
		rel, _ := filepath.Rel(repoRoot, k)
		t.Run("kustomize "+rel, func(t *testing.T) {
			if isKustomizeComponent(t, k) {
				t.Skip("a kustomize Component, built only into a kustomization (manifests/testdata)")
			}
			objs := localObjects(t, kubectl(t, "kustomize", k))
			ensureNamespacesOf(t, objs)
			dryRunApply(t, ns, objs, served)
		})
	}
	for _, f := range files {
		rel, _ := filepath.Rel(repoRoot, f)
		t.Run(rel, func(t *testing.T) {
			if isKustomizePatch(f, kustomizations) {
				t.Skip("a kustomize patch, checked through its kustomization")
			}
			if slices.Contains(kustomizations, filepath.Dir(f)) && isKustomizeComponent(t, filepath.Dir(f)) {
				t.Skip("part of a kustomize Component, checked through a kustomization of manifests/testdata")
			}
			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			objs := localObjects(t, string(raw))
			ensureNamespacesOf(t, objs)
			dryRunApply(t, ns, objs, served)
		})
	}
}

// servedKinds returns the apiVersion/kind pairs the API server serves.
func servedKinds(t *testing.T) map[string]bool {
	t.Helper()
	served := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(kubectl(t, "api-resources", "--no-headers")), "\n") {
		f := strings.Fields(line) // NAME [SHORTNAMES] APIVERSION NAMESPACED KIND
		if len(f) >= 4 {
			served[f[len(f)-3]+"/"+f[len(f)-1]] = true
		}
	}
	require.True(t, served["apps/v1/Deployment"], "kubectl api-resources: %v", served)
	return served
}

// localObjects decodes a manifest (YAML or JSON) offline: kubectl prints it
// back as JSON after an empty --local patch, which needs no REST mapping of
// the kinds (a kind the server does not serve included).
func localObjects(t *testing.T, manifest string) []map[string]any {
	t.Helper()
	out, err := runKubectl(manifest, "patch", "--local", "-f", "-", "--type=merge", "-p", "{}", "-o", "json")
	require.NoError(t, err)
	return decodeObjects(t, out)
}

// dryRunApply applies objs in ns with --dry-run=server, but those of kinds
// the server does not serve.
func dryRunApply(t *testing.T, ns string, objs []map[string]any, served map[string]bool) {
	t.Helper()
	var items []map[string]any
	for _, o := range objs {
		if gvk := fmt.Sprint(o["apiVersion"], "/", o["kind"]); !served[gvk] {
			t.Logf("not served here, left out: %s %s", gvk, nameOf(o))
			continue
		}
		items = append(items, o)
	}
	require.NotEmpty(t, items, "nothing to apply")
	list, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	require.NoError(t, err)
	out, err := runKubectl(string(list), "apply", "--dry-run=server", "-n", ns, "-f", "-")
	require.NoError(t, err)
	t.Log(strings.TrimSpace(out))
}

// assertDeletedOnce checks that the audit log shows exactly one successful deletion by
// user of each pod in pods, and no other pod deleted by user in ns.
func assertDeletedOnce(t *testing.T, ns, user string, pods []pod) {
	t.Helper()
	events := podDeletes(t, ns, user)
	n := deletesByPod(events)
	want := map[string]int{}
	for _, p := range pods {
		want[p.name] = 1
	}
	assert.Equal(t, want, n, "successful pod deletions by %s in %s; audit: %v", user, ns, events)
	for _, e := range events {
		assert.Equal(t, 200, e.Code(), "unexpected answer to a deletion: %v", e)
	}
}

// applyInNamespace applies a manifest file into ns. A RoleBinding's ServiceAccount
// subjects name their namespace explicitly, so they are moved to ns as well: the test
// then exercises the manifest as written for whatever namespace it is installed in.
// Cluster-scoped objects get the namespace appended to their name, so that tests do
// not share them, and are deleted when the test ends.
func applyInNamespace(t *testing.T, ns, file string) {
	t.Helper()
	objs := decodeObjects(t, kubectl(t, "create", "--dry-run=client", "-o", "json", "-f", file))
	clusterRoles := map[string]bool{}
	for _, o := range objs {
		if o["kind"] == "ClusterRole" {
			clusterRoles[nameOf(o)] = true
		}
	}
	for _, o := range objs {
		meta, _ := o["metadata"].(map[string]any)
		require.NotNil(t, meta, "object without metadata in %s", file)
		switch kind := fmt.Sprint(o["kind"]); kind {
		case "ClusterRole", "ClusterRoleBinding", "Namespace":
			if kind == "Namespace" {
				continue
			}
			name := nameOf(o) + "-" + ns
			meta["name"] = name
			t.Cleanup(func() { _, _ = runKubectl("", "delete", strings.ToLower(kind), name, "--ignore-not-found") })
		default:
			meta["namespace"] = ns
		}
		if ref, ok := o["roleRef"].(map[string]any); ok && ref["kind"] == "ClusterRole" && clusterRoles[fmt.Sprint(ref["name"])] {
			ref["name"] = fmt.Sprint(ref["name"]) + "-" + ns
		}
		if subjects, ok := o["subjects"].([]any); ok {
			for _, s := range subjects {
				if s, ok := s.(map[string]any); ok && s["kind"] == "ServiceAccount" {
					s["namespace"] = ns
				}
			}
		}
		b, err := json.Marshal(o)
		require.NoError(t, err)
		apply(t, ns, string(b))
	}
}

func nameOf(o map[string]any) string {
	meta, _ := o["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	return name
}

// decodeObjects decodes kubectl's JSON output: one object, several in a row, or a List.
func decodeObjects(t *testing.T, out string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var o map[string]any
		require.NoError(t, dec.Decode(&o), "decode kubectl output")
		if o["kind"] == "List" {
			items, _ := o["items"].([]any)
			for _, it := range items {
				if m, ok := it.(map[string]any); ok {
					objs = append(objs, m)
				}
			}
			continue
		}
		objs = append(objs, o)
	}
	return objs
}

// ensureNamespacesOf creates, for the duration of the test, any namespace that objs
// name explicitly and that does not exist yet, so a dry run can be judged.
func ensureNamespacesOf(t *testing.T, objs []map[string]any) {
	t.Helper()
	for _, o := range objs {
		meta, _ := o["metadata"].(map[string]any)
		name, _ := meta["namespace"].(string)
		if o["kind"] == "Namespace" {
			name, _ = meta["name"].(string)
		}
		if name == "" {
			continue
		}
		if _, err := runKubectl("", "get", "namespace", name); err == nil {
			continue
		}
		kubectl(t, "create", "namespace", name)
		t.Cleanup(func() { _, _ = runKubectl("", "delete", "namespace", name, "--wait=false") })
	}
}

// isKustomizePatch reports whether f sits in a kustomization's directory but is not a
// complete object (a patch): such files only make sense through kustomize.
func isKustomizePatch(f string, kustomizations []string) bool {
	dir := filepath.Dir(f)
	if !slices.Contains(kustomizations, dir) {
		return false
	}
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return false
	}
	base := filepath.Base(f)
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if strings.Contains(line, base) && (strings.HasPrefix(line, "path:") || strings.HasPrefix(line, "- path:") ||
			strings.Contains(line, "patch")) {
			return true
		}
	}
	return false
}

// isKustomizeComponent reports whether dir's kustomization is a Component,
// which kustomize builds only as part of another kustomization.
func isKustomizeComponent(t *testing.T, dir string) bool {
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	require.NoError(t, err)
	return regexp.MustCompile(`(?m)^kind:\s*Component\s*$`).Match(raw)
}
