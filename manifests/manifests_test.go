package manifests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// The rules the controller needs, and no more: "apiGroup resource verb".
// pods/eviction is not among them: RESTART_STRATEGY=evict adds it.
var allowedRules = []string{
	" configmaps list",
	" configmaps watch",
	" configmaps patch", // the restarted-for annotation (RECORD_HASH=true, the default)
	" pods list",
	" pods watch", // the pod index (POD_INDEX=true, the default)
	" pods delete",
	" events create",             // Kubernetes Events (EVENTS=true, the default)
	"apps replicasets/scale get", // the restart budget: owners' desired replicas
	"apps statefulsets/scale get",
	" replicationcontrollers/scale get",
	"coordination.k8s.io leases get @config-watcher", // leader election (LEADER_ELECT=true), its Lease only
	"coordination.k8s.io leases create",              // cannot be restricted by name
	"coordination.k8s.io leases update @config-watcher",
}

const (
	// A release labels every object's metadata with its version (hack/image, make
	// release); a selector is immutable, so the version in one would make the next
	// release's apply fail, and in a pod template it would restart pods for a label.
	versionLabel    = "app.kubernetes.io/version"
	controllerImage = "ghcr.io/k8spatterns/config-watcher"
	deleteSelector  = "k8spatterns.io/podDeleteSelector"
)

// loopbackHosts are the --accept-hosts patterns that admit loopback names only.
var loopbackHosts = []string{`^localhost$`, `^127\.0\.0\.1$`, `^\[::1\]$`}

// obj is one Kubernetes object as kubectl prints it in JSON.
type obj = map[string]any

// check is one property of the rendered manifests; it returns what violates it.
type check struct {
	name string
	fn   func(objs []obj) []string
}

// containerChecks hold for every container of every pod template, base and demo alike.
var containerChecks = []check{
	{"EveryContainerRunsAsNonRootWithNumericIDs", checkNonRoot},
	{"EveryContainerHasReadOnlyRootFilesystem", checkReadOnlyRoot},
	{"NoContainerCanEscalatePrivileges", checkNoEscalation},
	{"EveryContainerDropsAllCapabilities", checkDropAll},
	{"EveryPodUsesRuntimeDefaultSeccomp", checkSeccomp},
	{"EveryContainerHasRequestsAndMemoryLimit", checkResources},
	{"EveryImageIsPinned", checkPinnedImages},
	{"NoSelectorOrPodTemplateCarriesTheVersion", checkVersionNotInSelectors},
}

// baseChecks hold for manifests/ (the controller).
var baseChecks = append(slices.Clone(containerChecks),
	check{"RoleGrantsExactlyWhatTheControllerUses", checkRoleRules},
	check{"NothingOnSecretsWithoutTheComponent", checkNoSecrets},
	check{"NoClusterWideRBAC", checkNoClusterRBAC},
	check{"ControllerRunsAsTheBoundServiceAccount", checkServiceAccountBound},
	check{"AmbassadorListensOnLoopbackOnly", checkAmbassadorLoopback},
	check{"AmbassadorAcceptsOnlyTheControllersPaths", checkAmbassadorPaths},
	check{"ControllerTalksToTheAmbassador", checkAPIURL},
	check{"OnlyTheAmbassadorGetsAToken", checkTokenOnlyInAmbassador},
	check{"SeveralControllersElectALeader", checkLeaderElection},
	check{"ControllerProbesHealthzAndReadyz", checkProbes},
	check{"ControllerLearnsNamespaceAndPodNameFromDownwardAPI", checkDownwardAPI},
	check{"ReplicasHaveADisruptionBudgetThatLetsADrainThrough", checkDisruptionBudget},
	check{"ReplicasPreferDifferentNodes", checkAntiAffinity},
)

// demoChecks hold for manifests/demo/ (the book's webapp).
var demoChecks = append(slices.Clone(containerChecks),
	check{"DemoSelectorMatchesWebappPods", checkDemoSelector},
)

// TestBaseManifestsPassEveryCheck ensures manifests/ renders and satisfies every base check.
func TestBaseManifestsPassEveryCheck(t *testing.T) {
	objs := render(t, ".")
	require.NotEmpty(t, objs)
	for _, c := range baseChecks {
		t.Run(c.name, func(t *testing.T) {
			assert.Empty(t, c.fn(objs))
		})
	}
}

// TestDemoManifestsPassEveryCheck ensures manifests/demo/ renders and satisfies every demo check.
func TestDemoManifestsPassEveryCheck(t *testing.T) {
	objs := render(t, "demo")
	require.NotEmpty(t, objs)
	for _, c := range demoChecks {
		t.Run(c.name, func(t *testing.T) {
			assert.Empty(t, c.fn(objs))
		})
	}
}

// violation breaks the rendered manifests of dir in one way that the check named
// check must report.
type violation struct {
	name   string
	dir    string
	check  string
	mutate func(t *testing.T, objs []obj) []obj
}

var violations = []violation{
	{"ContainerRunAsNonRootFalseOverridesPod", ".", "EveryContainerRunsAsNonRootWithNumericIDs", func(t *testing.T, o []obj) []obj {
		secCtx(t, container(t, o, "ambassador"))["runAsNonRoot"] = false
		return o
	}},
	{"RunAsNonRootMissingAtBothLevels", "demo", "EveryContainerRunsAsNonRootWithNumericIDs", func(t *testing.T, o []obj) []obj {
		delete(secCtx(t, container(t, o, "app")), "runAsNonRoot")
		delete(podSecCtx(t, o, "webapp"), "runAsNonRoot")
		return o
	}},
	{"RunAsUserRoot", ".", "EveryContainerRunsAsNonRootWithNumericIDs", func(t *testing.T, o []obj) []obj {
		secCtx(t, container(t, o, "config-watcher"))["runAsUser"] = 0
		return o
	}},
	{"RunAsGroupMissingAtBothLevels", ".", "EveryContainerRunsAsNonRootWithNumericIDs", func(t *testing.T, o []obj) []obj {
		delete(secCtx(t, container(t, o, "config-watcher")), "runAsGroup")
		delete(podSecCtx(t, o, "config-watcher"), "runAsGroup")
		return o
	}},
	{"WritableRootFilesystem", ".", "EveryContainerHasReadOnlyRootFilesystem", func(t *testing.T, o []obj) []obj {
		delete(secCtx(t, container(t, o, "ambassador")), "readOnlyRootFilesystem")
		return o
	}},
	{"PrivilegeEscalationAllowed", "demo", "NoContainerCanEscalatePrivileges", func(t *testing.T, o []obj) []obj {
		secCtx(t, container(t, o, "app"))["allowPrivilegeEscalation"] = true
		return o
	}},
	{"PrivilegedContainer", ".", "NoContainerCanEscalatePrivileges", func(t *testing.T, o []obj) []obj {
		secCtx(t, container(t, o, "config-watcher"))["privileged"] = true
		return o
	}},
	{"CapabilityKept", ".", "EveryContainerDropsAllCapabilities", func(t *testing.T, o []obj) []obj {
		secCtx(t, container(t, o, "config-watcher"))["capabilities"] = map[string]any{"drop": []any{"NET_RAW"}}
		return o
	}},
	{"CapabilityAddedBack", "demo", "EveryContainerDropsAllCapabilities", func(t *testing.T, o []obj) []obj {
		secCtx(t, container(t, o, "app"))["capabilities"] = map[string]any{"drop": []any{"ALL"}, "add": []any{"NET_BIND_SERVICE"}}
		return o
	}},
	{"SeccompUnconfined", ".", "EveryPodUsesRuntimeDefaultSeccomp", func(t *testing.T, o []obj) []obj {
		podSecCtx(t, o, "config-watcher")["seccompProfile"] = map[string]any{"type": "Unconfined"}
		return o
	}},
	{"SeccompMissing", "demo", "EveryPodUsesRuntimeDefaultSeccomp", func(t *testing.T, o []obj) []obj {
		delete(podSecCtx(t, o, "webapp"), "seccompProfile")
		return o
	}},
	{"MemoryLimitMissing", ".", "EveryContainerHasRequestsAndMemoryLimit", func(t *testing.T, o []obj) []obj {
		delete(container(t, o, "ambassador"), "resources")
		return o
	}},
	{"CPURequestMissing", "demo", "EveryContainerHasRequestsAndMemoryLimit", func(t *testing.T, o []obj) []obj {
		delete(dig(container(t, o, "app"), "resources", "requests").(map[string]any), "cpu")
		return o
	}},
	{"ImageWithoutTag", "demo", "EveryImageIsPinned", func(t *testing.T, o []obj) []obj {
		container(t, o, "app")["image"] = "hashicorp/http-echo"
		return o
	}},
	{"ImageLatest", ".", "EveryImageIsPinned", func(t *testing.T, o []obj) []obj {
		container(t, o, "config-watcher")["image"] = "localhost:5000/config-watcher:latest"
		return o
	}},
	{"VersionInDeploymentSelector", ".", "NoSelectorOrPodTemplateCarriesTheVersion", func(t *testing.T, o []obj) []obj {
		dig(find(t, o, "Deployment", "config-watcher"), "spec", "selector", "matchLabels").(map[string]any)[versionLabel] = "v1.0.0"
		return o
	}},
	{"VersionInPodTemplate", "demo", "NoSelectorOrPodTemplateCarriesTheVersion", func(t *testing.T, o []obj) []obj {
		dig(find(t, o, "Deployment", "webapp"), "spec", "template", "metadata", "labels").(map[string]any)[versionLabel] = "v1.0.0"
		return o
	}},
	{"WildcardVerb", ".", "RoleGrantsExactlyWhatTheControllerUses", func(t *testing.T, o []obj) []obj {
		addRule(t, o, map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"*"}})
		return o
	}},
	{"WildcardResource", ".", "RoleGrantsExactlyWhatTheControllerUses", func(t *testing.T, o []obj) []obj {
		addRule(t, o, map[string]any{"apiGroups": []any{""}, "resources": []any{"*"}, "verbs": []any{"get"}})
		return o
	}},
	{"SecretsReadable", ".", "RoleGrantsExactlyWhatTheControllerUses", func(t *testing.T, o []obj) []obj {
		addRule(t, o, map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"}, "verbs": []any{"get"}})
		return o
	}},
	{"SecretsListable", ".", "NothingOnSecretsWithoutTheComponent", func(t *testing.T, o []obj) []obj {
		addRule(t, o, map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"}, "verbs": []any{"list"}})
		return o
	}},
	{"EveryResourceGranted", ".", "NothingOnSecretsWithoutTheComponent", func(t *testing.T, o []obj) []obj {
		addRule(t, o, map[string]any{"apiGroups": []any{"*"}, "resources": []any{"*"}, "verbs": []any{"watch"}})
		return o
	}},
	{"PodDeleteMissing", ".", "RoleGrantsExactlyWhatTheControllerUses", func(t *testing.T, o []obj) []obj {
		role := find(t, o, "Role", "config-watcher")
		var kept []any
		for _, r := range list(role, "rules") {
			if !slices.Contains(strs(list(r, "resources")), "pods") {
				kept = append(kept, r)
			}
		}
		role["rules"] = kept
		return o
	}},
	{"ClusterRoleAdded", ".", "NoClusterWideRBAC", func(t *testing.T, o []obj) []obj {
		return append(o, obj{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
			"metadata": map[string]any{"name": "config-watcher"}})
	}},
	{"BoundToBuiltinEdit", ".", "NoClusterWideRBAC", func(t *testing.T, o []obj) []obj {
		find(t, o, "RoleBinding", "config-watcher")["roleRef"] = map[string]any{
			"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"}
		return o
	}},
	{"DeploymentUsesDefaultServiceAccount", ".", "ControllerRunsAsTheBoundServiceAccount", func(t *testing.T, o []obj) []obj {
		delete(podSpec(t, o, "config-watcher"), "serviceAccountName")
		return o
	}},
	{"BindingNamesAnotherAccount", ".", "ControllerRunsAsTheBoundServiceAccount", func(t *testing.T, o []obj) []obj {
		list(find(t, o, "RoleBinding", "config-watcher"), "subjects")[0].(map[string]any)["name"] = "someone-else"
		return o
	}},
	{"ProxyOnAllInterfaces", ".", "AmbassadorListensOnLoopbackOnly", func(t *testing.T, o []obj) []obj {
		setFlag(t, container(t, o, "ambassador"), "--address", "0.0.0.0")
		return o
	}},
	{"ProxyAcceptsAnyHost", ".", "AmbassadorListensOnLoopbackOnly", func(t *testing.T, o []obj) []obj {
		setFlag(t, container(t, o, "ambassador"), "--accept-hosts", ".*")
		return o
	}},
	{"ProxyAcceptsEveryPath", ".", "AmbassadorAcceptsOnlyTheControllersPaths", func(t *testing.T, o []obj) []obj {
		setFlag(t, container(t, o, "ambassador"), "--accept-paths", "^.*")
		return o
	}},
	{"ProxyAcceptsSecretsByName", ".", "AmbassadorAcceptsOnlyTheControllersPaths", func(t *testing.T, o []obj) []obj {
		a := container(t, o, "ambassador")
		paths, _ := flag(a, "--accept-paths")
		setFlag(t, a, "--accept-paths", paths+`,^/api/v1/namespaces/[^/]+/secrets/[^/]+$`)
		return o
	}},
	{"ProxyAcceptsAPathNeverRequested", ".", "AmbassadorAcceptsOnlyTheControllersPaths", func(t *testing.T, o []obj) []obj {
		a := container(t, o, "ambassador")
		paths, _ := flag(a, "--accept-paths")
		setFlag(t, a, "--accept-paths", paths+`,^/apis/apps/v1/namespaces/[^/]+/deployments$`)
		return o
	}},
	{"ProxyAcceptsABranchNeverRequested", ".", "AmbassadorAcceptsOnlyTheControllersPaths", func(t *testing.T, o []obj) []obj {
		a := container(t, o, "ambassador")
		paths, _ := flag(a, "--accept-paths")
		setFlag(t, a, "--accept-paths", strings.Replace(paths, `(secrets|events)`, `(secrets|events|services)`, 1))
		return o
	}},
	{"NamespacedProxyAcceptsClusterCollections", ".", "AmbassadorAcceptsOnlyTheControllersPaths", func(t *testing.T, o []obj) []obj {
		a := container(t, o, "ambassador")
		paths, _ := flag(a, "--accept-paths")
		setFlag(t, a, "--accept-paths", paths+`,^/api/v1/(configmaps|secrets|namespaces)$`)
		return o
	}},
	{"ClusterWideProxyMissesTheClusterCollections", "cluster-wide", "AmbassadorAcceptsOnlyTheControllersPaths", func(t *testing.T, o []obj) []obj {
		a := container(t, o, "ambassador")
		paths, _ := flag(a, "--accept-paths")
		setFlag(t, a, "--accept-paths", strings.Replace(paths, `,^/api/v1/(configmaps|secrets|namespaces)$`, "", 1))
		return o
	}},
	{"ProxyMissesTheLease", ".", "AmbassadorAcceptsOnlyTheControllersPaths", func(t *testing.T, o []obj) []obj {
		a := container(t, o, "ambassador")
		paths, _ := flag(a, "--accept-paths")
		setFlag(t, a, "--accept-paths", strings.ReplaceAll(paths, `leases(/[^/]+)?$`, `leases$`))
		return o
	}},
	{"ProxyAcceptsEveryMethod", ".", "AmbassadorAcceptsOnlyTheControllersPaths", func(t *testing.T, o []obj) []obj {
		setFlag(t, container(t, o, "ambassador"), "--reject-methods", "^$")
		return o
	}},
	{"ProxyPortPublished", ".", "AmbassadorListensOnLoopbackOnly", func(t *testing.T, o []obj) []obj {
		container(t, o, "ambassador")["ports"] = []any{map[string]any{"containerPort": 8001}}
		return o
	}},
	{"PodOnHostNetwork", ".", "AmbassadorListensOnLoopbackOnly", func(t *testing.T, o []obj) []obj {
		podSpec(t, o, "config-watcher")["hostNetwork"] = true
		return o
	}},
	{"APIURLWrongPort", ".", "ControllerTalksToTheAmbassador", func(t *testing.T, o []obj) []obj {
		setEnv(t, container(t, o, "config-watcher"), "API_URL", "http://127.0.0.1:8080")
		return o
	}},
	{"APIURLRemoteHost", ".", "ControllerTalksToTheAmbassador", func(t *testing.T, o []obj) []obj {
		setEnv(t, container(t, o, "config-watcher"), "API_URL", "https://kubernetes.default.svc:8001")
		return o
	}},
	{"TokenAutomounted", ".", "OnlyTheAmbassadorGetsAToken", func(t *testing.T, o []obj) []obj {
		delete(podSpec(t, o, "config-watcher"), "automountServiceAccountToken")
		return o
	}},
	{"ControllerMountsToken", ".", "OnlyTheAmbassadorGetsAToken", func(t *testing.T, o []obj) []obj {
		c := container(t, o, "config-watcher")
		c["volumeMounts"] = append(list(c, "volumeMounts"), map[string]any{
			"name": "ambassador-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"})
		return o
	}},
	{"TwoReplicasWithoutLeaderElection", ".", "SeveralControllersElectALeader", func(t *testing.T, o []obj) []obj {
		setEnv(t, container(t, o, "config-watcher"), "LEADER_ELECT", "false")
		return o
	}},
	{"OneReplicaRolledWithoutLeaderElection", ".", "SeveralControllersElectALeader", func(t *testing.T, o []obj) []obj {
		find(t, o, "Deployment", "config-watcher")["spec"].(map[string]any)["replicas"] = 1
		setEnv(t, container(t, o, "config-watcher"), "LEADER_ELECT", "false")
		return o
	}},
	{"LeaderElectionWithoutPodName", ".", "SeveralControllersElectALeader", func(t *testing.T, o []obj) []obj {
		c := container(t, o, "config-watcher")
		var env []any
		for _, e := range list(c, "env") {
			if e.(map[string]any)["name"] != "POD_NAME" {
				env = append(env, e)
			}
		}
		c["env"] = env
		return o
	}},
	{"LivenessProbeMissing", ".", "ControllerProbesHealthzAndReadyz", func(t *testing.T, o []obj) []obj {
		delete(container(t, o, "config-watcher"), "livenessProbe")
		return o
	}},
	{"ReadinessProbeOnUndeclaredPort", ".", "ControllerProbesHealthzAndReadyz", func(t *testing.T, o []obj) []obj {
		dig(container(t, o, "config-watcher"), "readinessProbe", "httpGet").(map[string]any)["port"] = "metrics"
		return o
	}},
	{"ReadinessProbeOnHealthz", ".", "ControllerProbesHealthzAndReadyz", func(t *testing.T, o []obj) []obj {
		dig(container(t, o, "config-watcher"), "readinessProbe", "httpGet").(map[string]any)["path"] = "/healthz"
		return o
	}},
	{"WatchNamespaceHardcoded", ".", "ControllerLearnsNamespaceAndPodNameFromDownwardAPI", func(t *testing.T, o []obj) []obj {
		setEnv(t, container(t, o, "config-watcher"), "WATCH_NAMESPACE", "default")
		return o
	}},
	{"PodNameMissing", ".", "ControllerLearnsNamespaceAndPodNameFromDownwardAPI", func(t *testing.T, o []obj) []obj {
		c := container(t, o, "config-watcher")
		var kept []any
		for _, e := range list(c, "env") {
			if str(e, "name") != "POD_NAME" {
				kept = append(kept, e)
			}
		}
		c["env"] = kept
		return o
	}},
	{"DisruptionBudgetMissing", ".", "ReplicasHaveADisruptionBudgetThatLetsADrainThrough", func(t *testing.T, o []obj) []obj {
		return slices.DeleteFunc(o, func(x obj) bool { return x["kind"] == "PodDisruptionBudget" })
	}},
	{"DisruptionBudgetSelectsOtherPods", ".", "ReplicasHaveADisruptionBudgetThatLetsADrainThrough", func(t *testing.T, o []obj) []obj {
		dig(find(t, o, "PodDisruptionBudget", "config-watcher"), "spec", "selector", "matchLabels").(map[string]any)["app.kubernetes.io/name"] = "webapp"
		return o
	}},
	{"DisruptionBudgetBlocksEveryDrain", ".", "ReplicasHaveADisruptionBudgetThatLetsADrainThrough", func(t *testing.T, o []obj) []obj {
		find(t, o, "PodDisruptionBudget", "config-watcher")["spec"].(map[string]any)["minAvailable"] = 2
		return o
	}},
	{"DisruptionBudgetAllowsBothDown", ".", "ReplicasHaveADisruptionBudgetThatLetsADrainThrough", func(t *testing.T, o []obj) []obj {
		spec := find(t, o, "PodDisruptionBudget", "config-watcher")["spec"].(map[string]any)
		delete(spec, "minAvailable")
		spec["maxUnavailable"] = "100%"
		return o
	}},
	{"AntiAffinityMissing", ".", "ReplicasPreferDifferentNodes", func(t *testing.T, o []obj) []obj {
		delete(podSpec(t, o, "config-watcher"), "affinity")
		return o
	}},
	{"AntiAffinityRequired", ".", "ReplicasPreferDifferentNodes", func(t *testing.T, o []obj) []obj {
		anti := dig(podSpec(t, o, "config-watcher"), "affinity", "podAntiAffinity").(map[string]any)
		var terms []any
		for _, p := range list(anti, "preferredDuringSchedulingIgnoredDuringExecution") {
			terms = append(terms, dig(p, "podAffinityTerm"))
		}
		anti["requiredDuringSchedulingIgnoredDuringExecution"] = terms
		delete(anti, "preferredDuringSchedulingIgnoredDuringExecution")
		return o
	}},
	{"AntiAffinityPerZone", ".", "ReplicasPreferDifferentNodes", func(t *testing.T, o []obj) []obj {
		for _, p := range list(podSpec(t, o, "config-watcher"), "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution") {
			dig(p, "podAffinityTerm").(map[string]any)["topologyKey"] = "topology.kubernetes.io/zone"
		}
		return o
	}},
	{"SelectorMatchesNoPod", "demo", "DemoSelectorMatchesWebappPods", func(t *testing.T, o []obj) []obj {
		dig(find(t, o, "ConfigMap", "webapp-config"), "metadata", "annotations").(map[string]any)[deleteSelector] = "app=web"
		return o
	}},
	{"SelectorAnnotationMissing", "demo", "DemoSelectorMatchesWebappPods", func(t *testing.T, o []obj) []obj {
		delete(dig(find(t, o, "ConfigMap", "webapp-config"), "metadata").(map[string]any), "annotations")
		return o
	}},
	{"WebappIgnoresConfigMap", "demo", "DemoSelectorMatchesWebappPods", func(t *testing.T, o []obj) []obj {
		delete(container(t, o, "app"), "env")
		return o
	}},
	{"WebappIgnoresSecret", "demo", "DemoSelectorMatchesWebappPods", func(t *testing.T, o []obj) []obj {
		c := container(t, o, "app")
		c["env"] = slices.DeleteFunc(list(c, "env"), func(e any) bool { return str(e, "valueFrom", "secretKeyRef", "name") != "" })
		return o
	}},
	{"SecretSelectorMatchesNoPod", "demo", "DemoSelectorMatchesWebappPods", func(t *testing.T, o []obj) []obj {
		dig(find(t, o, "Secret", "webapp-credentials"), "metadata", "annotations").(map[string]any)[deleteSelector] = "app=web"
		return o
	}},
}

// TestChecksCatchViolations ensures each check reports a manifest broken in the way it
// guards against: a check that cannot fail is no check.
func TestChecksCatchViolations(t *testing.T) {
	rendered := map[string][]obj{".": render(t, "."), "demo": render(t, "demo"), "cluster-wide": render(t, "cluster-wide")}
	checks := map[string]check{}
	for _, c := range append(slices.Clone(baseChecks), demoChecks...) {
		checks[c.name] = c
	}
	for _, v := range violations {
		t.Run(v.name, func(t *testing.T) {
			c, ok := checks[v.check]
			require.True(t, ok, "no check named %s", v.check)
			require.Empty(t, c.fn(rendered[v.dir]), "precondition: %s passes on %s as rendered", v.check, v.dir)
			broken := v.mutate(t, deepCopy(t, rendered[v.dir]))
			assert.NotEmpty(t, c.fn(broken), "%s did not notice %s", v.check, v.name)
		})
	}
}

// TestEveryCheckHasAViolation ensures no check goes without a case proving it can fail.
func TestEveryCheckHasAViolation(t *testing.T) {
	covered := map[string]bool{}
	for _, v := range violations {
		covered[v.check] = true
	}
	for _, c := range append(slices.Clone(baseChecks), demoChecks...) {
		assert.True(t, covered[c.name], "check %s has no violation case", c.name)
	}
}

// --- checks --------------------------------------------------------------------------

func checkNonRoot(objs []obj) []string {
	var bad []string
	for _, c := range containers(objs) {
		if v, _ := c.effective("runAsNonRoot").(bool); !v {
			bad = append(bad, c.where+": runAsNonRoot is not true")
		}
		// Numeric IDs: the kubelet can then verify runAsNonRoot without reading the
		// image's /etc/passwd, and images that default to root (kubectl's) are overridden.
		for _, key := range []string{"runAsUser", "runAsGroup"} {
			if id, ok := c.effective(key).(float64); !ok || id == 0 {
				bad = append(bad, fmt.Sprintf("%s: %s is %v, want a non-zero number", c.where, key, c.effective(key)))
			}
		}
	}
	return bad
}

func checkReadOnlyRoot(objs []obj) []string {
	var bad []string
	for _, c := range containers(objs) {
		if v, _ := dig(c.c, "securityContext", "readOnlyRootFilesystem").(bool); !v {
			bad = append(bad, c.where+": readOnlyRootFilesystem is not true")
		}
	}
	return bad
}

func checkNoEscalation(objs []obj) []string {
	var bad []string
	for _, c := range containers(objs) {
		if v, ok := dig(c.c, "securityContext", "allowPrivilegeEscalation").(bool); !ok || v {
			bad = append(bad, c.where+": allowPrivilegeEscalation is not false")
		}
		if v, _ := dig(c.c, "securityContext", "privileged").(bool); v {
			bad = append(bad, c.where+": privileged")
		}
	}
	return bad
}

func checkDropAll(objs []obj) []string {
	var bad []string
	for _, c := range containers(objs) {
		if !slices.Contains(strs(list(c.c, "securityContext", "capabilities", "drop")), "ALL") {
			bad = append(bad, c.where+": capabilities.drop lacks ALL")
		}
		if add := list(c.c, "securityContext", "capabilities", "add"); len(add) > 0 {
			bad = append(bad, fmt.Sprintf("%s: adds capabilities %v", c.where, add))
		}
	}
	return bad
}

func checkSeccomp(objs []obj) []string {
	var bad []string
	for _, c := range containers(objs) {
		if p := str(c.effective("seccompProfile"), "type"); p != "RuntimeDefault" {
			bad = append(bad, fmt.Sprintf("%s: seccompProfile %q, want RuntimeDefault", c.where, p))
		}
	}
	return bad
}

func checkResources(objs []obj) []string {
	var bad []string
	for _, c := range containers(objs) {
		for _, path := range [][]string{{"requests", "cpu"}, {"requests", "memory"}, {"limits", "memory"}} {
			if str(c.c, append([]string{"resources"}, path...)...) == "" {
				bad = append(bad, c.where+": no resources."+strings.Join(path, "."))
			}
		}
	}
	return bad
}

func checkPinnedImages(objs []obj) []string {
	var bad []string
	for _, c := range containers(objs) {
		image := str(c.c, "image")
		if strings.Contains(image, "@sha256:") {
			continue
		}
		// The tag follows the last path element; a registry may carry a port.
		_, tag, ok := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
		if !ok || tag == "" || tag == "latest" {
			bad = append(bad, fmt.Sprintf("%s: image %q is not pinned to a tag or digest", c.where, image))
		}
	}
	return bad
}

func checkVersionNotInSelectors(objs []obj) []string {
	var bad []string
	for _, o := range objs {
		for _, path := range [][]string{{"spec", "selector", "matchLabels"}, {"spec", "selector"}, {"spec", "template", "metadata", "labels"}} {
			if labels, ok := dig(o, path...).(map[string]any); ok && labels[versionLabel] != nil {
				bad = append(bad, fmt.Sprintf("%s %s: %s holds %s", o["kind"], nameOf(o), strings.Join(path, "."), versionLabel))
			}
		}
	}
	return bad
}

func checkRoleRules(objs []obj) []string {
	var bad []string
	granted := map[string]bool{}
	for _, o := range objs {
		if o["kind"] != "Role" {
			continue
		}
		for _, r := range list(o, "rules") {
			if len(list(r, "nonResourceURLs")) > 0 {
				bad = append(bad, "Role grants nonResourceURLs")
			}
			names := ""
			if n := strs(list(r, "resourceNames")); len(n) > 0 {
				names = " @" + strings.Join(n, ",")
			}
			for _, g := range strs(list(r, "apiGroups")) {
				for _, res := range strs(list(r, "resources")) {
					for _, verb := range strs(list(r, "verbs")) {
						rule := g + " " + res + " " + verb + names
						if g == "*" || res == "*" || verb == "*" {
							bad = append(bad, fmt.Sprintf("Role %s grants a wildcard: %q", nameOf(o), rule))
						}
						granted[rule] = true
					}
				}
			}
		}
	}
	for rule := range granted {
		if !slices.Contains(allowedRules, rule) {
			bad = append(bad, fmt.Sprintf("Role grants %q, which the controller does not use", rule))
		}
	}
	for _, rule := range allowedRules {
		if !granted[rule] {
			bad = append(bad, fmt.Sprintf("Role lacks %q, which the controller needs", rule))
		}
	}
	slices.Sort(bad)
	return bad
}

func checkNoClusterRBAC(objs []obj) []string {
	var bad []string
	for _, o := range objs {
		switch o["kind"] {
		case "ClusterRole", "ClusterRoleBinding":
			bad = append(bad, fmt.Sprintf("%s %s in the base", o["kind"], nameOf(o)))
		case "RoleBinding":
			if k := str(o, "roleRef", "kind"); k != "Role" {
				bad = append(bad, fmt.Sprintf("RoleBinding %s refers to a %s (%s), want a Role", nameOf(o), k, str(o, "roleRef", "name")))
			}
		}
	}
	return bad
}

func checkServiceAccountBound(objs []obj) []string {
	var bad []string
	for _, p := range pods(objs) {
		sa := str(p.spec, "serviceAccountName")
		if sa == "" {
			bad = append(bad, p.owner+": no serviceAccountName (would run as `default`)")
			continue
		}
		if !has(objs, "ServiceAccount", sa) {
			bad = append(bad, fmt.Sprintf("%s: ServiceAccount %s is not in the manifests", p.owner, sa))
		}
		bound := false
		for _, o := range objs {
			if o["kind"] != "RoleBinding" || !has(objs, "Role", str(o, "roleRef", "name")) {
				continue
			}
			for _, s := range list(o, "subjects") {
				bound = bound || (str(s, "kind") == "ServiceAccount" && str(s, "name") == sa)
			}
		}
		if !bound {
			bad = append(bad, fmt.Sprintf("%s: no RoleBinding binds ServiceAccount %s to the Role", p.owner, sa))
		}
	}
	return bad
}

func checkAmbassadorLoopback(objs []obj) []string {
	var bad []string
	ambassadors := 0
	for _, c := range containers(objs) {
		if !isProxy(c.c) {
			continue
		}
		ambassadors++
		if addr, _ := flag(c.c, "--address"); addr != "127.0.0.1" {
			bad = append(bad, fmt.Sprintf("%s: --address=%q, want 127.0.0.1", c.where, addr))
		}
		hosts, ok := flag(c.c, "--accept-hosts")
		if !ok {
			bad = append(bad, c.where+": no explicit --accept-hosts")
		}
		for _, h := range strings.Split(hosts, ",") {
			if ok && !slices.Contains(loopbackHosts, h) {
				bad = append(bad, fmt.Sprintf("%s: --accept-hosts admits %q", c.where, h))
			}
		}
		if ports := list(c.c, "ports"); len(ports) > 0 {
			bad = append(bad, c.where+": declares ports; the proxy is for the pod's own containers")
		}
		// On the host network, 127.0.0.1 is the node's loopback, open to every process there.
		if v, _ := c.pod["hostNetwork"].(bool); v {
			bad = append(bad, c.where+": hostNetwork makes loopback the node's")
		}
	}
	if ambassadors != 1 {
		bad = append(bad, fmt.Sprintf("%d kubectl proxy containers, want 1", ambassadors))
	}
	return bad
}

// controllerPaths are the paths of every request the controller makes in
// the namespaces it watches, as apiclient builds them: the ambassador must
// let each through, and every branch of its --accept-paths must be one of them.
var controllerPaths = []string{
	apiclient.CorePath("team-a", "configmaps", ""),
	apiclient.CorePath("team-a", "configmaps", "webapp-config"),                     // the record (PATCH)
	apiclient.CorePath("team-a", "configmaps", "config-watcher-secret.credentials"), // a Secret's state
	apiclient.CorePath("team-a", "secrets", ""),
	apiclient.CorePath("team-a", "pods", ""), apiclient.CorePath("team-a", "pods", "webapp-7466656dc8-x2x9z"),
	apiclient.CorePath("team-a", "pods", "webapp-7466656dc8-x2x9z") + "/eviction",
	apiclient.CorePath("team-a", "events", ""),
	apiclient.GroupPath("apps", "v1", "team-a", "replicasets", "webapp-7466656dc8") + "/scale",
	apiclient.GroupPath("apps", "v1", "team-a", "statefulsets", "db") + "/scale",
	apiclient.CorePath("team-a", "replicationcontrollers", "legacy") + "/scale",
	apiclient.ObjectPath("example.com/v1", "team-a", "widgets", "w") + "/scale", // a custom owner kind
	apiclient.DiscoveryPath("example.com/v1"), apiclient.DiscoveryPath("v1"),
	apiclient.GroupPath("coordination.k8s.io", "v1", "team-a", "leases", ""),
	apiclient.GroupPath("coordination.k8s.io", "v1", "team-a", "leases", "config-watcher"),
	"/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", // WATCH_SECRETS: what the token may read
}

// clusterPaths are the collections the controller lists and watches across
// namespaces, with WATCH_NAMESPACE="*" only (the cluster-wide overlay): every
// other build's ambassador must refuse them.
var clusterPaths = []string{
	apiclient.CoreClusterPath("configmaps"), apiclient.CoreClusterPath("secrets"),
	apiclient.CoreClusterPath("namespaces"), // NAMESPACE_SELECTOR
}

// refusedPaths are what the token may reach but the controller never asks:
// the ambassador must refuse them.
var refusedPaths = []string{
	"/api/v1/namespaces/team-a/secrets/db-password", // a Secret by name
	"/api/v1/namespaces/team-a/pods/webapp-1/exec", "/api/v1/namespaces/team-a/pods/webapp-1/attach",
	"/api/v1/namespaces/team-a/pods/webapp-1/log", "/api/v1/namespaces/team-a/pods/webapp-1/portforward",
	"/api/v1/namespaces/team-a/pods/webapp-1/proxy/x", "/api/v1/namespaces/team-a/services/web:80/proxy/",
	"/api/v1/namespaces/team-a", "/api/v1/nodes", "/api/v1/namespaces/team-a/serviceaccounts/default/token",
	"/apis/apps/v1/namespaces/team-a/deployments/webapp", "/apis/apps/v1/namespaces/team-a/replicasets/webapp-1",
	"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", "/api/v1/namespaces/team-a/configmaps/a/b",
	"/metrics", "/openapi/v2", "/version",
}

// checkAmbassadorPaths: the ambassador passes each path the controller
// requests in this build (the cluster-scope collections only where it watches
// every namespace) and nothing else: each branch of each --accept-paths
// regexp is taken by one of those requests, and the paths it must never
// reach are refused.
func checkAmbassadorPaths(objs []obj) []string {
	var bad []string
	want, refuse := controllerPaths, append(slices.Clone(refusedPaths), clusterPaths...)
	for _, c := range containers(objs) {
		if isController(c.c) && env(c.c, "WATCH_NAMESPACE") == "*" {
			want, refuse = append(slices.Clone(controllerPaths), clusterPaths...), refusedPaths
		}
	}
	for _, c := range containers(objs) {
		if !isProxy(c.c) {
			continue
		}
		accept, ok := flag(c.c, "--accept-paths")
		if !ok {
			bad = append(bad, c.where+": no --accept-paths: the proxy passes every path")
			continue
		}
		var res []*regexp.Regexp
		for _, p := range strings.Split(accept, ",") {
			re, err := regexp.Compile(p)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s: --accept-paths %q: %v", c.where, p, err))
				continue
			}
			res = append(res, re)
		}
		accepted := func(path string) bool {
			return slices.ContainsFunc(res, func(re *regexp.Regexp) bool { return re.MatchString(path) })
		}
		for _, p := range want {
			if !accepted(p) {
				bad = append(bad, fmt.Sprintf("%s: --accept-paths refuses %s, which the controller requests", c.where, p))
			}
		}
		for _, re := range res {
			switch unused, err := UnusedBranches(re.String(), want); {
			case err != nil:
				bad = append(bad, fmt.Sprintf("%s: --accept-paths %s: %v", c.where, re, err))
			case len(unused) > 0:
				bad = append(bad, fmt.Sprintf("%s: --accept-paths %s admits %s, which no request of the controller takes", c.where, re, unused[0]))
			}
		}
		for _, p := range refuse {
			if accepted(p) {
				bad = append(bad, fmt.Sprintf("%s: --accept-paths admits %s, which the controller never requests", c.where, p))
			}
		}
		methods, _ := flag(c.c, "--reject-methods")
		re, err := regexp.Compile(methods)
		for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
			if err == nil && methods != "" && re.MatchString(m) {
				bad = append(bad, fmt.Sprintf("%s: --reject-methods refuses %s, which the controller sends", c.where, m))
			}
		}
		for _, m := range []string{"CONNECT", "TRACE", "OPTIONS"} {
			if err != nil || methods == "" || !re.MatchString(m) {
				bad = append(bad, fmt.Sprintf("%s: --reject-methods admits %s, which the controller never sends", c.where, m))
			}
		}
	}
	return bad
}

func checkAPIURL(objs []obj) []string {
	var bad []string
	proxyPort := ""
	for _, c := range containers(objs) {
		if isProxy(c.c) {
			proxyPort, _ = flag(c.c, "--port")
		}
	}
	for _, c := range containers(objs) {
		if !isController(c.c) {
			continue
		}
		raw := env(c.c, "API_URL")
		u, err := url.Parse(raw)
		if err != nil || u.Scheme != "http" || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost") || u.Port() != proxyPort {
			bad = append(bad, fmt.Sprintf("%s: API_URL %q is not the ambassador on loopback port %q", c.where, raw, proxyPort))
		}
	}
	return bad
}

func checkTokenOnlyInAmbassador(objs []obj) []string {
	var bad []string
	for _, p := range pods(objs) {
		if v, ok := p.spec["automountServiceAccountToken"].(bool); !ok || v {
			bad = append(bad, p.owner+": automountServiceAccountToken is not false: every container gets the token")
		}
		tokenVolumes := map[string]bool{}
		for _, v := range list(p.spec, "volumes") {
			for _, src := range list(v, "projected", "sources") {
				if dig(src, "serviceAccountToken") != nil {
					tokenVolumes[str(v, "name")] = true
				}
			}
		}
		if len(tokenVolumes) == 0 {
			bad = append(bad, p.owner+": no projected token volume for the ambassador")
		}
		for _, c := range p.containers() {
			for _, m := range list(c.c, "volumeMounts") {
				if tokenVolumes[str(m, "name")] && !isProxy(c.c) {
					bad = append(bad, fmt.Sprintf("%s: mounts token volume %s", c.where, str(m, "name")))
				}
			}
		}
	}
	return bad
}

func checkLeaderElection(objs []obj) []string {
	var bad []string
	for _, o := range objs {
		if o["kind"] != "Deployment" || nameOf(o) != "config-watcher" {
			continue
		}
		n, _ := dig(o, "spec", "replicas").(float64)
		rolled := str(o, "spec", "strategy", "type") != "Recreate"
		for _, c := range containers([]obj{o}) {
			if !isController(c.c) {
				continue
			}
			elect := env(c.c, "LEADER_ELECT") == "true"
			if (n != 1 || rolled) && !elect {
				bad = append(bad, fmt.Sprintf("Deployment %s: %v replicas, strategy %q, but LEADER_ELECT is not true: two controllers would act on the same change", nameOf(o), n, str(o, "spec", "strategy", "type")))
			}
			if elect && !hasEnvFrom(c.c, "POD_NAME", "metadata.name") {
				bad = append(bad, fmt.Sprintf("Deployment %s: LEADER_ELECT needs POD_NAME from metadata.name (the replica's identity)", nameOf(o)))
			}
		}
	}
	return bad
}

func hasEnvFrom(c map[string]any, name, fieldPath string) bool {
	for _, e := range list(c, "env") {
		if m, ok := e.(map[string]any); ok && m["name"] == name {
			return str(m, "valueFrom", "fieldRef", "fieldPath") == fieldPath
		}
	}
	return false
}

func checkProbes(objs []obj) []string {
	var bad []string
	seen := false
	for _, c := range containers(objs) {
		if !isController(c.c) {
			continue
		}
		seen = true
		ports := map[string]bool{}
		for _, p := range list(c.c, "ports") {
			ports[str(p, "name")] = true
		}
		for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
			get := dig(c.c, probe, "httpGet")
			if got := str(get, "path"); got != path {
				bad = append(bad, fmt.Sprintf("%s: %s path %q, want httpGet %s", c.where, probe, got, path))
			}
			if port := str(get, "port"); !ports[port] {
				bad = append(bad, fmt.Sprintf("%s: %s port %q is not a named port of the container", c.where, probe, port))
			}
		}
	}
	if !seen {
		bad = append(bad, "no container runs "+controllerImage)
	}
	return bad
}

func checkDownwardAPI(objs []obj) []string {
	var bad []string
	want := map[string]string{"WATCH_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid"}
	for _, c := range containers(objs) {
		if !isController(c.c) {
			continue
		}
		for name, field := range want {
			got := ""
			for _, e := range list(c.c, "env") {
				if str(e, "name") == name {
					got = str(e, "valueFrom", "fieldRef", "fieldPath")
				}
			}
			if got != field {
				bad = append(bad, fmt.Sprintf("%s: %s from fieldRef %q, want %q", c.where, name, got, field))
			}
		}
	}
	return bad
}

// controllerDeployment returns the controller's Deployment, its replicas and its pods' labels.
func controllerDeployment(objs []obj) (d obj, replicas float64, labels any) {
	for _, o := range objs {
		if o["kind"] == "Deployment" && nameOf(o) == "config-watcher" {
			replicas, _ = dig(o, "spec", "replicas").(float64)
			return o, replicas, dig(o, "spec", "template", "metadata", "labels")
		}
	}
	return nil, 0, nil
}

// selects reports whether a matchLabels selector selects pods labelled labels.
func selects(selector, labels any) bool {
	want, ok := dig(selector, "matchLabels").(map[string]any)
	if !ok || len(want) == 0 || len(list(selector, "matchExpressions")) > 0 {
		return false // this check models matchLabels only
	}
	for k, v := range want {
		if str(labels, k) != v {
			return false
		}
	}
	return true
}

// checkDisruptionBudget: one PodDisruptionBudget covers the replicas, keeps one
// available through a drain, and still lets one go (minAvailable 1 of 2): a budget
// that allows no disruption would hold every drain up for good.
func checkDisruptionBudget(objs []obj) []string {
	d, replicas, labels := controllerDeployment(objs)
	if d == nil {
		return []string{"no Deployment config-watcher"}
	}
	var bad []string
	budgets := 0
	for _, o := range objs {
		if o["kind"] != "PodDisruptionBudget" || !selects(dig(o, "spec", "selector"), labels) {
			continue
		}
		budgets++
		minAvailable, ok := dig(o, "spec", "minAvailable").(float64)
		if !ok || minAvailable < 1 || minAvailable >= replicas {
			bad = append(bad, fmt.Sprintf("PodDisruptionBudget %s: minAvailable %v of %v replicas; want a number from 1 to %v", nameOf(o), dig(o, "spec", "minAvailable"), replicas, replicas-1))
		}
	}
	if budgets != 1 {
		bad = append(bad, fmt.Sprintf("%d PodDisruptionBudgets select the controller's pods, want 1", budgets))
	}
	return bad
}

// checkAntiAffinity: the replicas prefer different nodes, and only prefer it: a
// required rule would leave the second Pending on a one-node cluster.
func checkAntiAffinity(objs []obj) []string {
	d, _, labels := controllerDeployment(objs)
	if d == nil {
		return []string{"no Deployment config-watcher"}
	}
	anti := dig(d, "spec", "template", "spec", "affinity", "podAntiAffinity")
	var bad []string
	if len(list(anti, "requiredDuringSchedulingIgnoredDuringExecution")) > 0 {
		bad = append(bad, "required pod anti-affinity: on a cluster of one node the second replica would never run")
	}
	spread := slices.ContainsFunc(list(anti, "preferredDuringSchedulingIgnoredDuringExecution"), func(p any) bool {
		term := dig(p, "podAffinityTerm")
		return str(term, "topologyKey") == "kubernetes.io/hostname" && selects(dig(term, "labelSelector"), labels)
	})
	if !spread {
		bad = append(bad, "no preferred pod anti-affinity on kubernetes.io/hostname selecting the controller's own pods")
	}
	return bad
}

// keyRefs are the env sources that read an object of each kind the controller watches.
var keyRefs = map[string]string{"ConfigMap": "configMapKeyRef", "Secret": "secretKeyRef"}

func checkDemoSelector(objs []obj) []string {
	var bad []string
	for _, cm := range objs {
		keyRef, watched := keyRefs[fmt.Sprint(cm["kind"])]
		if !watched {
			continue
		}
		sel := str(cm, "metadata", "annotations", deleteSelector)
		if sel == "" {
			bad = append(bad, fmt.Sprintf("%s %s lacks the %s annotation", cm["kind"], nameOf(cm), deleteSelector))
			continue
		}
		want, err := equalitySelector(sel)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s %s: %v", cm["kind"], nameOf(cm), err))
			continue
		}
		matched := false
		for _, p := range pods(objs) {
			if !labelsMatch(dig(p.template, "metadata", "labels"), want) {
				continue
			}
			for _, c := range p.containers() {
				for _, e := range list(c.c, "env") {
					matched = matched || str(e, "valueFrom", keyRef, "name") == nameOf(cm)
				}
			}
		}
		if !matched {
			bad = append(bad, fmt.Sprintf("%s %s: selector %q matches no pod template that reads it", cm["kind"], nameOf(cm), sel))
		}
	}
	return bad
}

// --- rendering -----------------------------------------------------------------------

// render runs `kubectl kustomize dir` and turns its YAML into objects. kubectl has no
// JSON output for kustomize; an empty merge patch applied --local re-prints each object
// unchanged as JSON without contacting a server (create --dry-run=client would).
func render(t *testing.T, dir string) []obj {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: cannot render the manifests")
	}
	touchInputs(t, kubectl, dir)
	yaml := run(t, kubectl, nil, "kustomize", dir)
	out := run(t, kubectl, yaml, "patch", "--local", "-f", "-", "--type=merge", "-p", "{}", "-o", "json")
	var objs []obj
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var o obj
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err, "decode kubectl output")
		}
		if o["kind"] == "List" {
			for _, it := range list(o, "items") {
				objs = append(objs, it.(map[string]any))
			}
			continue
		}
		objs = append(objs, o)
	}
	return objs
}

// touchInputs reads what kubectl will read. go test caches a package's result keyed by
// the files the test itself opened; files opened only by the kubectl child process
// would not invalidate it, and an edited manifest would pass from the cache.
func touchInputs(t *testing.T, kubectl, dir string) {
	t.Helper()
	_, err := os.Stat(kubectl)
	require.NoError(t, err)
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		_, err = os.ReadFile(path)
		return err
	}))
}

func run(t *testing.T, kubectl string, stdin []byte, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(kubectl, args...)
	// No kubeconfig: nothing here may reach a cluster.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+os.DevNull)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), stderr.String())
	return out
}

func deepCopy(t *testing.T, objs []obj) []obj {
	t.Helper()
	b, err := json.Marshal(objs)
	require.NoError(t, err)
	var out []obj
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

// --- navigating objects --------------------------------------------------------------

// dig walks nested maps; it returns nil where a key is missing.
func dig(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func str(v any, path ...string) string {
	s, _ := dig(v, path...).(string)
	return s
}

func list(v any, path ...string) []any {
	l, _ := dig(v, path...).([]any)
	return l
}

func strs(l []any) []string {
	out := make([]string, 0, len(l))
	for _, v := range l {
		out = append(out, fmt.Sprint(v))
	}
	return out
}

func nameOf(o obj) string { return str(o, "metadata", "name") }

func has(objs []obj, kind, name string) bool {
	return slices.ContainsFunc(objs, func(o obj) bool { return o["kind"] == kind && nameOf(o) == name })
}

// pod is the pod template of a workload.
type pod struct {
	owner    string
	template map[string]any // metadata + spec
	spec     map[string]any
}

// containerRef is one container with the pod spec it inherits security settings from.
type containerRef struct {
	where string
	pod   map[string]any
	c     map[string]any
}

// effective is a securityContext field as the kubelet applies it: the container's
// value, else the pod's.
func (c containerRef) effective(key string) any {
	if v := dig(c.c, "securityContext", key); v != nil {
		return v
	}
	return dig(c.pod, "securityContext", key)
}

func pods(objs []obj) []pod {
	var out []pod
	for _, o := range objs {
		var tmpl any
		switch o["kind"] {
		case "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job":
			tmpl = dig(o, "spec", "template")
		case "CronJob":
			tmpl = dig(o, "spec", "jobTemplate", "spec", "template")
		case "Pod":
			tmpl = o
		default:
			continue
		}
		m, _ := tmpl.(map[string]any)
		spec, _ := dig(m, "spec").(map[string]any)
		out = append(out, pod{owner: fmt.Sprintf("%s/%s", o["kind"], nameOf(o)), template: m, spec: spec})
	}
	return out
}

func (p pod) containers() []containerRef {
	var out []containerRef
	for _, field := range []string{"initContainers", "containers"} {
		for _, c := range list(p.spec, field) {
			m := c.(map[string]any)
			out = append(out, containerRef{where: p.owner + " " + str(m, "name"), pod: p.spec, c: m})
		}
	}
	return out
}

func containers(objs []obj) []containerRef {
	var out []containerRef
	for _, p := range pods(objs) {
		out = append(out, p.containers()...)
	}
	return out
}

// args is a container's command line as the runtime sees it (image entrypoint aside).
func args(c map[string]any) []string {
	return append(strs(list(c, "command")), strs(list(c, "args"))...)
}

// isProxy tells the ambassador: a container running `kubectl proxy`.
func isProxy(c map[string]any) bool {
	a := args(c)
	return slices.Contains(a, "proxy") && strings.Contains(str(c, "image")+strings.Join(a, " "), "kubectl")
}

func isController(c map[string]any) bool {
	return strings.HasPrefix(str(c, "image"), controllerImage+":") || strings.HasPrefix(str(c, "image"), controllerImage+"@")
}

// flag finds --name=value or --name value on a container's command line.
func flag(c map[string]any, name string) (string, bool) {
	a := args(c)
	for i, s := range a {
		if v, ok := strings.CutPrefix(s, name+"="); ok {
			return v, true
		}
		if s == name && i+1 < len(a) {
			return a[i+1], true
		}
	}
	return "", false
}

func env(c map[string]any, name string) string {
	for _, e := range list(c, "env") {
		if str(e, "name") == name {
			return str(e, "value")
		}
	}
	return ""
}

// equalitySelector parses the equality-based subset of the label selector grammar
// (k=v, k==v, comma-separated), which is all the demo needs.
func equalitySelector(sel string) (map[string]string, error) {
	want := map[string]string{}
	for _, term := range strings.Split(sel, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(term), "=")
		v = strings.TrimPrefix(v, "=")
		if !ok || k == "" || strings.ContainsAny(k+v, "!() ") {
			return nil, fmt.Errorf("selector %q: term %q is not key=value", sel, term)
		}
		want[k] = v
	}
	return want, nil
}

func labelsMatch(labels any, want map[string]string) bool {
	for k, v := range want {
		if str(labels, k) != v {
			return false
		}
	}
	return true
}

// --- mutating objects (violation cases) ----------------------------------------------

func find(t *testing.T, objs []obj, kind, name string) obj {
	t.Helper()
	for _, o := range objs {
		if o["kind"] == kind && nameOf(o) == name {
			return o
		}
	}
	require.FailNow(t, "not found", "%s %s", kind, name)
	return nil
}

func container(t *testing.T, objs []obj, name string) map[string]any {
	t.Helper()
	for _, c := range containers(objs) {
		if str(c.c, "name") == name {
			return c.c
		}
	}
	require.FailNow(t, "not found", "container %s", name)
	return nil
}

func podSpec(t *testing.T, objs []obj, deployment string) map[string]any {
	t.Helper()
	spec, ok := dig(find(t, objs, "Deployment", deployment), "spec", "template", "spec").(map[string]any)
	require.True(t, ok, "Deployment %s has no pod spec", deployment)
	return spec
}

func secCtx(t *testing.T, c map[string]any) map[string]any {
	t.Helper()
	sc, ok := c["securityContext"].(map[string]any)
	require.True(t, ok, "container %s has no securityContext", str(c, "name"))
	return sc
}

func podSecCtx(t *testing.T, objs []obj, deployment string) map[string]any {
	t.Helper()
	sc, ok := podSpec(t, objs, deployment)["securityContext"].(map[string]any)
	require.True(t, ok, "Deployment %s has no pod securityContext", deployment)
	return sc
}

func addRule(t *testing.T, objs []obj, rule map[string]any) {
	t.Helper()
	role := find(t, objs, "Role", "config-watcher")
	role["rules"] = append(list(role, "rules"), rule)
}

func setFlag(t *testing.T, c map[string]any, name, value string) {
	t.Helper()
	for _, field := range []string{"command", "args"} {
		l := list(c, field)
		for i, s := range l {
			if strings.HasPrefix(fmt.Sprint(s), name+"=") {
				l[i] = name + "=" + value
				return
			}
		}
	}
	c["args"] = append(list(c, "args"), name+"="+value)
}

func setEnv(t *testing.T, c map[string]any, name, value string) {
	t.Helper()
	for _, e := range list(c, "env") {
		if m := e.(map[string]any); m["name"] == name {
			delete(m, "valueFrom")
			m["value"] = value
			return
		}
	}
	require.FailNow(t, "not found", "env %s", name)
}

// TestClusterWideOverlay ensures manifests/cluster-wide/ watches every
// namespace with exactly the base's rules split in two: the Lease rule stays
// in a namespaced Role, everything else moves to a ClusterRole; and its pod
// is hardened like the base's.
func TestClusterWideOverlay(t *testing.T) {
	objs := render(t, "cluster-wide")
	require.NotEmpty(t, objs)
	for _, c := range containerChecks {
		t.Run(c.name, func(t *testing.T) { assert.Empty(t, c.fn(objs)) })
	}
	rules := func(kind string) []string { return grants(objs, kind) }
	var leases, others []string
	for _, r := range allowedRules {
		if strings.Contains(r, "leases") {
			leases = append(leases, r)
		} else {
			others = append(others, r)
		}
	}
	others = append(others, "* */scale get", " namespaces list", " namespaces watch") // cluster-wide only: custom owner kinds' scale, the Namespaces that opted in
	slices.Sort(leases)
	slices.Sort(others)
	assert.Equal(t, leases, rules("Role"), "the Role keeps the Lease rule only")
	assert.Equal(t, others, rules("ClusterRole"), "the ClusterRole grants the rest, nothing more")
	assert.True(t, has(objs, "ClusterRoleBinding", "config-watcher"))

	c := container(t, objs, "config-watcher")
	assert.Equal(t, "*", env(c, "WATCH_NAMESPACE"))
	assert.True(t, hasEnvFrom(c, "LEASE_NAMESPACE", "metadata.namespace"), "the Lease lives in the controller's namespace")
	assert.True(t, hasEnvFrom(c, "POD_NAMESPACE", "metadata.namespace") && hasEnvFrom(c, "POD_UID", "metadata.uid"), "its own pod and standby spared")
	assert.Equal(t, "config-watcher.k8spatterns.io/enabled=true", env(c, "NAMESPACE_SELECTOR"), "only Namespaces that opt in")
	assert.Equal(t, "config-watcher.k8spatterns.io/restart=true", env(c, "POD_OPT_IN_LABEL"), "only pods that opt in")
	for _, ch := range baseChecks {
		if ch.name == "AmbassadorAcceptsOnlyTheControllersPaths" {
			t.Run(ch.name, func(t *testing.T) { assert.Empty(t, ch.fn(objs)) })
		}
	}
}
