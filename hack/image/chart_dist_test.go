//go:build release

package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDistChartIsTheRelease ensures dist/ holds the Helm chart packaged at the release's
// version (chart X.Y.Z, appVersion vX.Y.Z) naming the index by the digest install.yaml
// names; TestDistSumsCoverEveryFile covers its line in SHA256SUMS.
func TestDistChartIsTheRelease(t *testing.T) {
	tag, digest := released(t)
	version := tag.TagStr()
	files := chartFiles(t, filepath.Join(distDir(t), "config-watcher-"+strings.TrimPrefix(version, "v")+".tgz"))
	assert.Contains(t, files["config-watcher/Chart.yaml"], "\nversion: "+strings.TrimPrefix(version, "v")+"\n")
	assert.Contains(t, files["config-watcher/Chart.yaml"], "\nappVersion: "+version+"\n")
	assert.Contains(t, files["config-watcher/values.yaml"], "\n  repository: "+tag.Context().Name()+"\n")
	assert.Contains(t, files["config-watcher/values.yaml"], "\n  digest: "+digest.String()+"\n")
}

// chartFiles is the content of a packaged chart, by path in the archive.
func chartFiles(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err, "no chart at %s", path)
	defer f.Close()
	z, err := gzip.NewReader(f)
	require.NoError(t, err)
	files := map[string]string{}
	r := tar.NewReader(z)
	for {
		h, err := r.Next()
		if err == io.EOF {
			return files
		}
		require.NoError(t, err)
		b, err := io.ReadAll(r)
		require.NoError(t, err)
		files[h.Name] = string(b)
	}
}

// TestDistChartLayoutPushesAndHelmInstallsItsChart ensures the chart's OCI layout of dist/,
// pushed the way release.yml pushes it (crane push without --index: the layout's one
// manifest, as its bytes are) to a registry on loopback, is what Helm's registry client
// fetches for `helm install oci://… --version X.Y.Z` (hack/helm pull, CW_HELM): Helm's
// media types, and the .tgz of dist/ byte for byte, at the release's version.
func TestDistChartLayoutPushesAndHelmInstallsItsChart(t *testing.T) {
	helm := os.Getenv("CW_HELM")
	require.NotEmpty(t, helm, "set CW_HELM to hack/helm's binary (make release-test does)")
	released, _ := released(t)
	version := strings.TrimPrefix(released.TagStr(), "v")
	srv := httptest.NewServer(registry.New())
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	repo := host + "/" + released.RepositoryStr()[:strings.LastIndex(released.RepositoryStr(), "/")+1] + "charts/config-watcher"

	// What crane push does with a directory and no --index (cmd/crane/cmd/push.go, v0.22.1).
	l, err := layout.ImageIndexFromPath(untar(t, chartLayoutFile))
	require.NoError(t, err)
	im, err := l.IndexManifest()
	require.NoError(t, err)
	require.Len(t, im.Manifests, 1, "crane push without --index takes a layout of one manifest")
	require.True(t, im.Manifests[0].MediaType.IsImage(), "crane push without --index takes an image manifest")
	img, err := l.Image(im.Manifests[0].Digest)
	require.NoError(t, err)
	tag, err := name.NewTag(repo+":"+version, name.Insecure)
	require.NoError(t, err)
	require.NoError(t, remote.Write(tag, img))

	desc, err := remote.Get(tag)
	require.NoError(t, err)
	assert.Equal(t, im.Manifests[0].Digest, desc.Digest, "the registry keeps another manifest than the layout's")
	var m struct {
		Config struct {
			MediaType string `json:"mediaType"`
		} `json:"config"`
		Layers []struct {
			MediaType string `json:"mediaType"`
			Digest    string `json:"digest"`
		} `json:"layers"`
	}
	require.NoError(t, json.Unmarshal(desc.Manifest, &m))
	assert.Equal(t, "application/vnd.cncf.helm.config.v1+json", m.Config.MediaType)
	require.Len(t, m.Layers, 1)
	assert.Equal(t, "application/vnd.cncf.helm.chart.content.v1.tar+gzip", m.Layers[0].MediaType)

	tgz := filepath.Join(distDir(t), "config-watcher-"+version+".tgz")
	want, err := os.ReadFile(tgz)
	require.NoError(t, err)
	sum := sha256.Sum256(want)
	assert.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), m.Layers[0].Digest, "the layer is not dist/'s .tgz")

	home, out := t.TempDir(), t.TempDir()
	pull := exec.Command(helm, "pull", "-plain-http", "-version", version, "-o", out, "oci://"+repo)
	pull.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	stdout, err := pull.Output()
	require.NoError(t, err, "helm pull: %s", stdout)
	got, err := os.ReadFile(strings.TrimSpace(string(stdout)))
	require.NoError(t, err)
	assert.Equal(t, want, got, "helm pulls another chart than dist/'s .tgz")
	assert.Contains(t, chartFiles(t, strings.TrimSpace(string(stdout)))["config-watcher/Chart.yaml"], "\nversion: "+version+"\n")
}
