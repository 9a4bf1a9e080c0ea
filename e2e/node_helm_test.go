//go:build e2e && e2enode

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
// with the admin kubeconfig and returns its output.
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
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.kubeconfig)
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
