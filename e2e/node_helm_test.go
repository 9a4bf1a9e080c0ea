//go:build e2e && e2enode

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of this file install the release's packaged chart ($CW_RELEASE_DIST/
// config-watcher-*.tgz, the one `make release` writes) on the real node, each in a
// namespace of its own beside the install.yaml install of the namespace default, through
// hack/helm (Helm 4's Go module, as `helm install` and `helm upgrade` run it). The images
// are the release's, imported by hack/node.sh as for install.yaml: the chart names the
// controller by the digest install.yaml names.

const chartRelease = "config-watcher" // the release name; the chart's objects are named so whatever it is

var (
	helmOnce sync.Once
	helmBin  string
	helmErr  error
)

// helm runs hack/helm (built once, from the module's cache: GOPROXY is off on the node)
// with the admin kubeconfig, and a fixed time for the files of a chart it packages, and
// returns its output.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	helmOnce.Do(func() {
		dir, err := os.MkdirTemp("", "config-watcher-e2e-helm-")
		if err != nil {
			helmErr = err
			return
		}
		helmBin = filepath.Join(dir, "helm")
		build := exec.Command("go", "build", "-o", helmBin, ".")
		build.Dir = filepath.Join(repoRoot, "hack", "helm")
		if out, err := build.CombinedOutput(); err != nil {
			helmErr = fmt.Errorf("go build hack/helm: %w\n%s", err, out)
		}
	})
	require.NoError(t, helmErr)
	cmd := exec.Command(helmBin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.kubeconfig, "SOURCE_DATE_EPOCH=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "helm %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// releaseChart returns the path of the chart the release packaged.
func releaseChart(t *testing.T) string {
	t.Helper()
	charts, err := filepath.Glob(filepath.Join(os.Getenv("CW_RELEASE_DIST"), "config-watcher-*.tgz"))
	require.NoError(t, err)
	require.Len(t, charts, 1, "the release's packaged charts in $CW_RELEASE_DIST")
	return charts[0]
}

// valuesJSON is values as -set-json takes them.
func valuesJSON(t *testing.T, values map[string]any) string {
	t.Helper()
	b, err := json.Marshal(values)
	require.NoError(t, err)
	return string(b)
}

// TestNodeChartInstallRestartsTheDemoOnChange ensures that the release's packaged chart,
// installed with its defaults, runs on the kubelet (both replicas Ready, the image the
// one install.yaml names by digest) and that the demo beside it works: a changed message
// has each old webapp pod deleted once by the chart's ServiceAccount and the new pods
// serve the new message.
func TestNodeChartInstallRestartsTheDemoOnChange(t *testing.T) {
	requireNode(t)
	ns := newNamespace(t)
	t.Log(helm(t, "install", "-namespace", ns, chartRelease, releaseChart(t)))

	install, err := os.ReadFile(filepath.Join(os.Getenv("CW_RELEASE_DIST"), "install.yaml"))
	require.NoError(t, err)
	for _, p := range waitReadyPodsIn(t, ns, controllerSel, 2) {
		for _, c := range p.Spec.Containers {
			if c.Name == "config-watcher" {
				assert.Contains(t, c.Image, "@sha256:", "image of %s", p.Metadata.Name)
				assert.Contains(t, string(install), "image: "+c.Image+"\n", "image of %s", p.Metadata.Name)
			}
		}
	}
	kubectl(t, "apply", "-n", ns, "-k", filepath.Join(repoRoot, "manifests", "demo"))
	demoServesTheNewMessage(t, ns, "system:serviceaccount:"+ns+":config-watcher")
}

// The controller's image and the ambassador's digest as install.yaml names them.
var (
	controllerImage  = regexp.MustCompile(`image: (\S+/config-watcher)@(sha256:[0-9a-f]{64})\n`)
	ambassadorDigest = regexp.MustCompile(`image: \S+/kubectl:\S+@(sha256:[0-9a-f]{64})\n`)
)

// earlierChart packages the release's chart again as the lowest version there is,
// v0.0.0-0, with the release's images, as `make release` does: the chart an upgrade comes
// from. It returns the archive's path.
func earlierChart(t *testing.T) string {
	t.Helper()
	install, err := os.ReadFile(filepath.Join(os.Getenv("CW_RELEASE_DIST"), "install.yaml"))
	require.NoError(t, err)
	m := controllerImage.FindSubmatch(install)
	require.NotNil(t, m, "install.yaml names no config-watcher image by digest")
	args := []string{"package", "-version", "v0.0.0-0", "-image", string(m[1]), "-digest", string(m[2]), "-o", t.TempDir()}
	if a := ambassadorDigest.FindSubmatch(install); a != nil {
		args = append(args, "-ambassador-digest", string(a[1]))
	}
	// package prints the archive's path, then the OCI layout's.
	out, _, _ := strings.Cut(strings.TrimSpace(helm(t, append(args, releaseChart(t))...)), "\n")
	require.FileExists(t, out)
	require.True(t, strings.HasSuffix(out, ".tgz"), "package printed %q first", out)
	return out
}

// installState is what an upgrade or an adoption must leave as it was: every pod (uid and
// container restarts), the controller's Deployment's generation and spec, the digest key Secret
// (uid and key), and the controller's records on the demo's ConfigMap and on the state
// ConfigMap of its Secret.
type installState struct {
	pods       map[string]string
	generation int64
	deployment string // its spec, to show what changed
	digestKey  string
	records    map[string]string
}

func stateOf(t *testing.T, ns string) installState {
	t.Helper()
	s := installState{pods: map[string]string{}, records: map[string]string{}}
	for _, sel := range []string{controllerSel, webappSel} {
		for _, p := range nodePodsIn(t, ns, sel) {
			restarts := 0
			for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				restarts += c.RestartCount
			}
			s.pods[p.Metadata.Name] = fmt.Sprintf("uid %s, %d container restarts", p.Metadata.UID, restarts)
		}
	}
	var d struct {
		Metadata struct {
			Generation int64 `json:"generation"`
		} `json:"metadata"`
		Spec json.RawMessage `json:"spec"`
	}
	getJSON(t, ns, &d, "deployment", "config-watcher")
	s.generation = d.Metadata.Generation
	var spec bytes.Buffer
	require.NoError(t, json.Indent(&spec, d.Spec, "", "  "))
	s.deployment = spec.String()
	var key struct {
		Metadata objectMeta        `json:"metadata"`
		Data     map[string]string `json:"data"`
	}
	getJSON(t, ns, &key, "secret", "config-watcher-digest-key")
	s.digestKey = key.Metadata.UID + " " + key.Data["key"]
	for _, name := range []string{"webapp-config", stateNameOf(nodeSecret)} {
		for k, v := range getConfigMap(t, ns, name).Metadata.Annotations {
			if strings.HasPrefix(k, controllerAnnotations) {
				s.records[name+" "+k] = v
			}
		}
	}
	return s
}

// installDemo applies the demo in ns and waits until its pods are Ready and the
// controller has recorded its ConfigMap and its Secret.
func installDemo(t *testing.T, ns string) {
	t.Helper()
	kubectl(t, "apply", "-n", ns, "-k", filepath.Join(repoRoot, "manifests", "demo"))
	waitReadyPodsIn(t, ns, webappSel, 2)
	waitRestartedFor(t, ns, "webapp-config", "")
	waitSecretRecordWithin(t, nodeTimeout, ns, nodeSecret, "")
}

// digestKey is a fresh digest key, as the chart takes it: 32 random bytes, base64.
func digestKey(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(writeDigestKey(t))
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

// TestNodeChartUpgradeKeepsTheKeyAndTheRecordsAndRestartsNoPod ensures that upgrading an
// install of an earlier chart (a lower version, another value: MAX_UNAVAILABLE) to the
// release's rolls the controller to the new settings and nothing else: the digest key
// Secret the chart made is the same object with the same key, the new controller keeps
// the records on the demo's ConfigMap and Secret as they were (a new key would rewrite
// the Secret's), deletes no pod, and restarts each webapp pod once for the next change of
// the Secret.
func TestNodeChartUpgradeKeepsTheKeyAndTheRecordsAndRestartsNoPod(t *testing.T) {
	requireNode(t)
	ns := newNamespace(t)
	sa := "system:serviceaccount:" + ns + ":config-watcher"
	// One worker: a sentinel adopted means every earlier event was handled (Settle).
	values := map[string]any{
		"secrets":  map[string]any{"enabled": true, "digestKey": map[string]any{"key": digestKey(t)}},
		"settings": map[string]any{"workers": 1},
	}
	earlier := map[string]any{"settings": map[string]any{"workers": 1, "maxUnavailable": "50%"}, "secrets": values["secrets"]}
	t.Log(helm(t, "install", "-namespace", ns, "-set-json", valuesJSON(t, earlier), chartRelease, earlierChart(t)))
	waitReadyPodsIn(t, ns, controllerSel, 2)
	installDemo(t, ns)
	before := stateOf(t, ns)
	oldControllers := nodePodsIn(t, ns, controllerSel)

	t.Log(helm(t, "upgrade", "-namespace", ns, "-set-json", valuesJSON(t, values), chartRelease, releaseChart(t)))
	controllers := waitReplaced(t, ns, controllerSel, oldControllers)
	version := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(releaseChart(t)), "config-watcher-"), ".tgz")
	assert.Equal(t, "config-watcher-"+version, strings.TrimSpace(kubectl(t, "get", "deployment", "config-watcher", "-n", ns,
		"-o", `jsonpath={.metadata.labels.helm\.sh/chart}`)), "the Deployment's chart")
	assert.NotContains(t, kubectl(t, "get", "deployment", "config-watcher", "-n", ns, "-o", "jsonpath={.spec.template.spec.containers[*].env[*].name}"),
		"MAX_UNAVAILABLE", "the earlier chart's value is still set")
	eventually(t, nodeTimeout, "a leader among the new controller pods", func() (bool, string) {
		leader := strings.TrimSpace(kubectl(t, "get", "lease", "config-watcher", "-n", ns, "-o", "jsonpath={.spec.holderIdentity}"))
		for _, p := range controllers {
			if p.Metadata.Name == leader {
				return true, ""
			}
		}
		return false, fmt.Sprintf("holder %q", leader)
	})
	// Sentinels, one per watch: once they are adopted the new leader has handled the
	// demo's ConfigMap and Secret as it found them.
	settle := "e2e-settle-" + randomSuffix()
	createFromFile(t, ns, secretJSON(settle, "Opaque", map[string]string{"purpose": "sentinel"},
		map[string]string{selectorAnnotation: "e2e.k8spatterns.io/settle=" + settle}))
	apply(t, ns, fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  annotations:\n    %s: e2e.k8spatterns.io/settle=%s\n", settle, selectorAnnotation, settle))
	waitSecretRecordWithin(t, nodeTimeout, ns, settle, "")
	waitRestartedFor(t, ns, settle, "")

	after := stateOf(t, ns)
	assert.Equal(t, before.digestKey, after.digestKey, "the digest key Secret (uid, key)")
	assert.Equal(t, before.records, after.records, "the records")
	for name, p := range before.pods {
		if strings.HasPrefix(name, "webapp-") {
			assert.Equal(t, p, after.pods[name], "webapp pod %s", name)
		}
	}
	assert.Empty(t, deletesByPod(podDeletes(t, ns, sa)), "pods deleted by %s", sa)

	old := waitReadyPodsIn(t, ns, webappSel, 2)
	kubectl(t, "patch", "secret", nodeSecret, "-n", ns, "--type=merge", "-p", fmt.Sprintf(`{"stringData":{%q:%q}}`, nodeSecretKey, "rotated "+randomSuffix()))
	waitReplaced(t, ns, webappSel, old)
	n := deletesByPod(podDeletes(t, ns, sa))
	for _, o := range old {
		assert.Equal(t, 1, n[o.Metadata.Name], "deletions of %s by %s", o.Metadata.Name, sa)
	}
	assert.Len(t, n, len(old), "pods deleted by %s: %v", sa, n)
}

// TestNodeChartAdoptsAKustomizeInstallRestartingNoPod ensures that a kustomize install
// (the release's install-secrets.yaml, in a namespace of its own, with the digest key
// Secret made as manifests/secrets says) is adopted by `helm install` once its objects
// carry Helm's meta.helm.sh annotations and managed-by label, as Helm's documentation
// says: the install succeeds, the Deployment's pod template is left as it was (its
// generation unchanged), no pod is restarted or deleted, the digest key Secret and the
// records are as they were, and the adopted install restarts the demo's pods once for
// the next change.
func TestNodeChartAdoptsAKustomizeInstallRestartingNoPod(t *testing.T) {
	requireNode(t)
	ns := newNamespace(t)
	sa := "system:serviceaccount:" + ns + ":config-watcher"
	b, err := os.ReadFile(filepath.Join(os.Getenv("CW_RELEASE_DIST"), "install-secrets.yaml"))
	require.NoError(t, err)
	// install-secrets.yaml installs into the namespace default: the same objects in ns.
	manifest := strings.ReplaceAll(string(b), "namespace: default\n", "namespace: "+ns+"\n")
	require.NotEqual(t, string(b), manifest)
	require.NotContains(t, manifest, ": default\n", "install-secrets.yaml names the namespace default elsewhere")
	file := filepath.Join(t.TempDir(), "install-secrets.yaml")
	require.NoError(t, os.WriteFile(file, []byte(manifest), 0o644))
	kubectl(t, "create", "secret", "generic", "config-watcher-digest-key", "-n", ns, "--from-literal=key="+digestKey(t))
	kubectl(t, "apply", "-f", file)
	waitReadyPodsIn(t, ns, controllerSel, 2)
	installDemo(t, ns)

	// The Deployment's new annotations bump its generation (the API server copies them to
	// the ReplicaSet): the state to keep is the one after them.
	kubectl(t, "annotate", "-f", file, "--overwrite", "meta.helm.sh/release-name="+chartRelease, "meta.helm.sh/release-namespace="+ns)
	kubectl(t, "label", "-f", file, "--overwrite", "app.kubernetes.io/managed-by=Helm")
	before := stateOf(t, ns)
	values := map[string]any{"secrets": map[string]any{"enabled": true, "digestKey": map[string]any{"existingSecret": "config-watcher-digest-key"}}}
	t.Log(helm(t, "install", "-namespace", ns, "-set-json", valuesJSON(t, values), chartRelease, releaseChart(t)))
	assert.NotEmpty(t, strings.TrimSpace(kubectl(t, "get", "deployment", "config-watcher", "-n", ns,
		"-o", `jsonpath={.metadata.labels.helm\.sh/chart}`)), "the Deployment carries no chart label: not adopted")

	after := stateOf(t, ns)
	assert.Equal(t, before, after, "the install's state before and after the adoption")
	assert.Empty(t, deletesByPod(podDeletes(t, ns, sa)), "pods deleted by %s", sa)
	demoServesTheNewMessage(t, ns, sa)
}
