//go:build e2e

package e2e

// Security checks (issue 7). Static ones (non-root, numeric UID/GID,
// read-only root filesystem, no privilege escalation, capabilities dropped,
// seccomp, the token mounted into the ambassador only, the Role's exact
// rules) are in manifests/manifests_test.go; these run the binary.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSecurityNoDataInLogsOrMetrics ensures ConfigMap data never reaches the
// controller's output: secret-looking values (in data values, data keys and
// binaryData, in a ConfigMap with a refused selector, in a round whose
// deletions fail, in watch lines cut in the middle, and a text and a JSON
// log at debug level) appear in neither log nor /metrics nor the namespace's
// Kubernetes Events.
func TestSecurityNoDataInLogsOrMetrics(t *testing.T) {
	ns := newNamespace(t)
	barePods(t, ns, "vault", 2)
	var secrets []string
	secret := func(kind string) string {
		s := fmt.Sprintf("%s%s%s", kind, randomSuffix(), randomSuffix())
		secrets = append(secrets, s)
		return s
	}
	cm := func(name, sel, data, binaryData string) string {
		b := map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "annotations": map[string]string{selectorAnnotation: sel}},
		}
		if data != "" {
			b["data"] = map[string]string{"password": data, "KEY_" + secret("ghp_key"): "x"}
		}
		if binaryData != "" {
			b["binaryData"] = map[string]string{"token": base64.StdEncoding.EncodeToString([]byte(binaryData))}
		}
		out, err := json.Marshal(b)
		require.NoError(t, err)
		return string(out)
	}
	apply(t, ns, cm("vault-config", "app=vault", "AKIA"+secret("sk_live_"), "-----BEGIN PRIVATE KEY-----"+secret("bin")))
	apply(t, ns, cm("refused", "app=vault&x="+"y", "hunter2-"+secret("refused"), ""))

	fp := startFaultProxy(t, env.proxyURL)
	fp.SetRules(t, `[
	  {"name":"halfline","watch":"true","cutAfterLines":0,"halfLine":true,"times":4},
	  {"name":"delete500","method":"DELETE","status":500,"times":1}
	]`)
	c := startController(t, controllerOpts{namespace: ns, apiURL: fp.url})
	c.WaitReady(t)
	rec := waitRestartedFor(t, ns, "vault-config", "")
	vault := livePods(t, ns, "app=vault")

	apply(t, ns, cm("vault-config", "app=vault", "AKIA"+secret("sk_live_"), "-----BEGIN PRIVATE KEY-----"+secret("bin")))
	apply(t, ns, cm("refused", "app=vault&x="+"y", "hunter2-"+secret("refused"), ""))
	waitDeleted(t, ns, adminUser, vault)
	waitRestartedFor(t, ns, "vault-config", rec)
	c.Settle(t, ns)
	fired := fp.Fired(t)
	require.Positive(t, fired["halfline"], "no watch line was cut: the test did not test that path")
	require.Positive(t, fired["delete500"])
	_, metrics, err := c.get("/metrics")
	require.NoError(t, err)
	c.Stop(t)
	text := c.Log(t)
	require.Contains(t, text, "refusing to restart pods", "the refused selector's path ran")
	require.Contains(t, text, "cannot delete pod", "the failing deletion's path ran")

	// Again with JSON logs: a restart adopts nothing new and must log no data either.
	j := startController(t, controllerOpts{namespace: ns, extraEnv: []string{"LOG_FORMAT=json"}})
	j.WaitReady(t)
	j.Settle(t, ns)
	_, jmetrics, err := j.get("/metrics")
	require.NoError(t, err)
	j.Stop(t)
	jtext := j.Log(t)
	require.True(t, strings.HasPrefix(strings.TrimSpace(jtext), "{"), "LOG_FORMAT=json")

	// Kubernetes Events in the namespace (the controller's, once it emits
	// them; the ReplicaSet's and others' too, which must not carry data either).
	events := kubectl(t, "get", "events", "-n", ns, "-o", "json")

	for _, out := range []struct{ name, text string }{
		{"text log", text}, {"json log", jtext}, {"metrics", metrics}, {"metrics (json run)", jmetrics}, {"events", events},
	} {
		for _, s := range secrets {
			assert.NotContains(t, out.text, s, "%s contains a data value or key", out.name)
		}
		for _, s := range []string{"AKIA", "BEGIN PRIVATE KEY", "hunter2", "LS0tLS1CRUdJTi"} {
			assert.NotContains(t, out.text, s, "%s contains data", out.name)
		}
	}
}

// rbacRule is one verb on one resource of the manifests' Role. (Resources
// are unique across the API groups the Role uses.)
type rbacRule struct{ resource, verb string }

// TestSecurityRoleIsMinimal ensures each verb the manifests' Role grants is
// needed: with that one verb removed, the feature that needs it fails with a
// 403 from the API server (seen in the audit log for the ServiceAccount), the
// controller says so clearly in its log (which verb on which resource), and
// no pod is deleted, unless the verb only saves time (watch on pods: the pod
// index) or tells the story (create on events): then the pods still restart.
func TestSecurityRoleIsMinimal(t *testing.T) {
	requireCluster(t)
	rbacFile := filepath.Join(repoRoot, "manifests", "base", "rbac.yaml")
	objs := decodeObjects(t, kubectl(t, "create", "--dry-run=client", "-o", "json", "-f", rbacFile))
	var role map[string]any
	for _, o := range objs {
		if o["kind"] == "Role" {
			role = o
		}
	}
	require.NotNil(t, role, "manifests/base/rbac.yaml has no Role")

	// Every verb granted, found in the manifest itself: a verb added to the
	// Role without a case here fails the test.
	var granted []rbacRule
	for _, r := range role["rules"].([]any) {
		r := r.(map[string]any)
		for _, res := range r["resources"].([]any) {
			for _, v := range r["verbs"].([]any) {
				granted = append(granted, rbacRule{fmt.Sprint(res), fmt.Sprint(v)})
			}
		}
	}
	// What the controller must log when the verb is missing: the watch loops, leader
	// election and Events say it with apiclient.Hint's fix, naming the rule.
	fix := func(verb, resource string) string {
		return fmt.Sprintf(`fix="RBAC: the controller may not %s %s in namespace \S+; grant it with the rule {apiGroups: \[\\"[a-z0-9.]*\\"\], resources: \[\\"%s\\"\], verbs: \[\\"%s\\"\]}`, verb, resource, resource, verb)
	}
	want := map[rbacRule]*regexp.Regexp{
		{"configmaps", "list"}:  regexp.MustCompile(`level=ERROR msg="list failed; retrying".*` + fix("list", "configmaps") + `.*cannot list resource \\"configmaps\\"`),
		{"configmaps", "watch"}: regexp.MustCompile(`level=ERROR msg="watch failed; retrying".*` + fix("watch", "configmaps")),
		{"configmaps", "patch"}: regexp.MustCompile(`RBAC: the controller may not patch configmaps in \S+ \(needs verb patch on configmaps`),
		{"pods", "list"}:        regexp.MustCompile(`RBAC: the controller may not list pods in \S+ \(needs verb list on pods\)`),
		// Without watch the pod index cannot be kept: rounds list first, and still restart.
		{"pods", "watch"}:  regexp.MustCompile(`level=ERROR msg="watch failed; retrying".*` + fix("watch", "pods")),
		{"pods", "delete"}: regexp.MustCompile(`RBAC: the controller may not delete pods in \S+ \(needs verb delete on pods\)`),
		// Leader election (LEADER_ELECT=true, as in manifests/base/deployment.yaml).
		{"leases", "get"}:    regexp.MustCompile(`msg="cannot (acquire|renew) lease".*` + fix("get", "leases")),
		{"leases", "create"}: regexp.MustCompile(`msg="cannot (acquire|renew) lease".*` + fix("create", "leases")),
		{"events", "create"}: regexp.MustCompile(`msg="cannot record event".*` + fix("create", "events")),
		{"leases", "update"}: regexp.MustCompile(`msg="cannot (acquire|renew) lease".*` + fix("update", "leases")),
		// The owners' scale: each needs pods of its kind made Ready, which
		// TestBudgetReadsTheOwnersScale does, with and without the rule.
		{"replicasets/scale", "get"}:            nil,
		{"statefulsets/scale", "get"}:           nil,
		{"replicationcontrollers/scale", "get"}: nil,
	}
	var extraEnv []string
	for _, g := range granted {
		if g.resource == "leases" {
			extraEnv = []string{"LEADER_ELECT=true"} // the controller as the manifests run it
		}
	}
	for _, g := range granted {
		require.Contains(t, want, g, "the Role grants %s on %s: add a case showing what needs it", g.verb, g.resource)
	}
	require.LessOrEqual(t, len(granted), len(want))

	for _, missing := range granted {
		if want[missing] == nil {
			continue
		}
		t.Run("without "+missing.verb+" "+missing.resource, func(t *testing.T) {
			ns := newNamespace(t)
			user := "system:serviceaccount:" + ns + ":config-watcher"
			applyInNamespace(t, ns, rbacFile)
			apply(t, ns, reducedRole(t, role, missing))
			eventually(t, 30*time.Second, "RBAC denies "+missing.verb+" "+missing.resource, func() (bool, string) {
				out, _ := runKubectl("", "auth", "can-i", missing.verb, missing.resource, "-n", ns, "--as", user)
				return strings.TrimSpace(out) == "no", out
			})
			apply(t, ns, webappManifests("app=webapp"))
			waitPods(t, ns, "app=webapp", 2)

			proxy := startProxy(t, serviceAccountKubeconfig(t, ns, "config-watcher"))
			c := startController(t, controllerOpts{namespace: ns, apiURL: proxy, extraEnv: extraEnv})
			if missing.resource == "pods" || missing.resource == "events" {
				// The change that needs the pods: adoption first, then new data.
				c.WaitReady(t)
				waitRestartedFor(t, ns, "webapp-config", "")
				mergePatch(t, ns, "webapp-config", `{"data":{"message":"needs pods"}}`)
			}
			eventually(t, waitTimeout, "403 on "+missing.verb+" "+missing.resource+" in the audit log", func() (bool, string) {
				n := len(auditEvents(t, func(e auditEvent) bool {
					return e.User.Username == user && e.Verb == missing.verb && e.ObjectRef != nil &&
						e.ObjectRef.Resource == missing.resource && e.Code() == 403
				}))
				return n > 0, fmt.Sprint(n)
			})
			eventually(t, 30*time.Second, "the controller's log to say what is missing", func() (bool, string) {
				return want[missing].MatchString(c.Log(t)), want[missing].String()
			})
			switch missing {
			case rbacRule{"events", "create"}, rbacRule{"pods", "watch"}:
				// Events only tell the story, the pod index only saves time:
				// restarts go on without them.
				eventually(t, waitTimeout, "the pods restarted all the same", func() (bool, string) {
					n := len(deletesByPod(podDeletes(t, ns, user)))
					return n == 2, fmt.Sprint(n)
				})
			default:
				assert.Empty(t, deletesByPod(podDeletes(t, ns, user)), "pods deleted without the full Role")
			}
			assert.Empty(t, podDeletes(t, ns, adminUser))
		})
	}
}

// reducedRole returns role, as JSON for ns, without verb on resource.
func reducedRole(t *testing.T, role map[string]any, missing rbacRule) string {
	t.Helper()
	b, err := json.Marshal(role)
	require.NoError(t, err)
	var r struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Rules      []struct {
			APIGroups     []string `json:"apiGroups"`
			Resources     []string `json:"resources"`
			ResourceNames []string `json:"resourceNames,omitempty"`
			Verbs         []string `json:"verbs"`
		} `json:"rules"`
	}
	require.NoError(t, json.Unmarshal(b, &r))
	type rule struct {
		APIGroups     []string `json:"apiGroups"`
		Resources     []string `json:"resources"`
		ResourceNames []string `json:"resourceNames,omitempty"`
		Verbs         []string `json:"verbs"`
	}
	var rules []rule
	for _, rl := range r.Rules {
		for _, res := range rl.Resources {
			var verbs []string
			for _, v := range rl.Verbs {
				if res != missing.resource || v != missing.verb {
					verbs = append(verbs, v)
				}
			}
			if len(verbs) > 0 {
				rules = append(rules, rule{rl.APIGroups, []string{res}, rl.ResourceNames, verbs})
			}
		}
	}
	out, err := json.Marshal(map[string]any{"apiVersion": r.APIVersion, "kind": r.Kind,
		"metadata": map[string]any{"name": r.Metadata["name"]}, "rules": rules})
	require.NoError(t, err)
	return string(out)
}

// optInLabel is the label of a Namespace that opts in under WATCH_NAMESPACE=*
// (the default NAMESPACE_SELECTOR).
const optInLabel = "config-watcher.k8spatterns.io/enabled=true"

// optIn labels ns so that a controller watching every namespace acts in it.
func optIn(t *testing.T, ns string) {
	t.Helper()
	kubectl(t, "label", "namespace", ns, optInLabel, "--overwrite")
}

// TestSecurityConfigMapWriterCannotRestartPodsWithoutConsent ensures that with
// POD_OPT_IN_LABEL someone who may edit ConfigMaps but not delete pods makes the
// controller restart only the pods that carry the opt-in label: the pods of a
// workload that did not opt in are left, though the selector matches them.
// The controller runs as manifests/base/rbac.yaml's ServiceAccount, through an
// ambassador filtered as manifests/base/deployment.yaml's.
func TestSecurityConfigMapWriterCannotRestartPodsWithoutConsent(t *testing.T) {
	ns := newNamespace(t)
	applyInNamespace(t, ns, filepath.Join(repoRoot, "manifests", "base", "rbac.yaml"))
	writer := "system:serviceaccount:" + ns + ":writer"
	apply(t, ns, `apiVersion: v1
kind: ServiceAccount
metadata:
  name: writer
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: configmap-writer
rules:
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "patch", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: writer
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-writer}
subjects:
- {kind: ServiceAccount, name: writer, namespace: `+ns+`}
`)
	eventually(t, 30*time.Second, "RBAC lets the writer patch ConfigMaps but not delete pods", func() (bool, string) {
		patch, _ := runKubectl("", "auth", "can-i", "patch", "configmaps", "-n", ns, "--as", writer)
		del, _ := runKubectl("", "auth", "can-i", "delete", "pods", "-n", ns, "--as", writer)
		return strings.TrimSpace(patch) == "yes" && strings.TrimSpace(del) == "no", patch + "/" + del
	})
	apply(t, ns, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: shared-config
  annotations:
    %s: "app in (webapp,consenting)"
data:
  message: "Hello"
`, selectorAnnotation))
	apply(t, ns, webappDeployment("configMapKeyRef", "shared-config", "message"))
	// The same Deployment as consenting: its pod template carries the opt-in label.
	apply(t, ns, strings.NewReplacer("name: webapp\n", "name: consenting\n", "        app: webapp\n", "        app: consenting\n        config-watcher.k8spatterns.io/restart: \"true\"\n", "app: webapp\n", "app: consenting\n").
		Replace(webappDeployment("configMapKeyRef", "shared-config", "message")))
	webapp := waitPods(t, ns, "app=webapp", 2)
	consenting := waitPods(t, ns, "app=consenting,config-watcher.k8spatterns.io/restart=true", 2)

	user := "system:serviceaccount:" + ns + ":config-watcher"
	proxy := startProxy(t, serviceAccountKubeconfig(t, ns, "config-watcher"))
	c := startController(t, controllerOpts{namespace: ns, apiURL: proxy, extraEnv: []string{"POD_OPT_IN_LABEL=config-watcher.k8spatterns.io/restart=true"}})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "shared-config", "")

	kubectl(t, "patch", "configmap", "shared-config", "-n", ns, "--as", writer, "--type=merge", "-p", `{"data":{"message":"from the writer"}}`)
	waitDeleted(t, ns, user, consenting)
	waitRestartedFor(t, ns, "shared-config", adopted)
	c.Settle(t, ns)
	assertDeletedOnce(t, ns, user, consenting)
	assert.ElementsMatch(t, webapp, livePods(t, ns, "app=webapp"), "a workload without the opt-in label was restarted")
	for _, p := range webapp {
		assert.Zero(t, deletesByPod(podDeletes(t, ns, user))[p.name], "pod %s deleted", p.name)
	}
}

// TestSecurityNamespaceWithoutOptInIgnored ensures that with WATCH_NAMESPACE=*
// (and the default NAMESPACE_SELECTOR) a namespace without the opt-in label is
// ignored: its ConfigMap is neither recorded nor acted on, and the result
// not_opted_in is counted; once labelled, its ConfigMap is adopted as it is,
// and its next change restarts its pods.
func TestSecurityNamespaceWithoutOptInIgnored(t *testing.T) {
	in, out := newNamespace(t), newNamespace(t)
	optIn(t, in)
	var pods [][]pod
	for _, ns := range []string{in, out} {
		apply(t, ns, webappManifests("app=webapp"))
		pods = append(pods, waitPods(t, ns, "app=webapp", 2))
	}
	c := startController(t, controllerOpts{namespace: "*"})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, in, "webapp-config", "")
	c.WaitMetric(t, 1, "config_watcher_reconciles_total", "result", "not_opted_in")

	mergePatch(t, out, "webapp-config", `{"data":{"message":"not opted in"}}`)
	mergePatch(t, in, "webapp-config", `{"data":{"message":"opted in"}}`)
	waitDeleted(t, in, adminUser, pods[0])
	waitRestartedFor(t, in, "webapp-config", adopted)
	// Settled through the namespace that opted in (one cluster-wide watch, in
	// order): out's marker would never be recorded.
	c.Settle(t, in)
	assert.Empty(t, podDeletes(t, out, adminUser), "pods deleted in a namespace that did not opt in")
	assert.Empty(t, getConfigMap(t, out, "webapp-config").Metadata.Annotations[restartedAnnotation], "a record written in a namespace that did not opt in")
	assert.Contains(t, c.Log(t), `msg="ignoring annotated objects in a namespace that did not opt in (NAMESPACE_SELECTOR)" namespace=`+out)

	optIn(t, out)
	waitRestartedFor(t, out, "webapp-config", "") // adopted as it is: the relist
	c.Settle(t, out)
	assert.Empty(t, podDeletes(t, out, adminUser), "a change made before the namespace opted in was acted on")
	mergePatch(t, out, "webapp-config", `{"data":{"message":"opted in now"}}`)
	waitDeleted(t, out, adminUser, pods[1])
	c.Settle(t, out)
	assertDeletedOnce(t, out, adminUser, pods[1])
}
