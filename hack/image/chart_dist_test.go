//go:build release

package main

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDistChartIsTheRelease ensures dist/ holds the Helm chart packaged at the release's
// version (chart X.Y.Z, appVersion vX.Y.Z) naming the index by the digest install.yaml
// names; TestDistSumsCoverEveryFile covers its line in SHA256SUMS.
func TestDistChartIsTheRelease(t *testing.T) {
	tag, digest := released(t)
	version := tag.TagStr()
	path := filepath.Join(distDir(t), "config-watcher-"+strings.TrimPrefix(version, "v")+".tgz")
	f, err := os.Open(path)
	require.NoError(t, err, "no chart in dist/")
	defer f.Close()
	z, err := gzip.NewReader(f)
	require.NoError(t, err)
	files := map[string]string{}
	r := tar.NewReader(z)
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		b, err := io.ReadAll(r)
		require.NoError(t, err)
		files[h.Name] = string(b)
	}
	assert.Contains(t, files["config-watcher/Chart.yaml"], "\nversion: "+strings.TrimPrefix(version, "v")+"\n")
	assert.Contains(t, files["config-watcher/Chart.yaml"], "\nappVersion: "+version+"\n")
	assert.Contains(t, files["config-watcher/values.yaml"], "\n  repository: "+tag.Context().Name()+"\n")
	assert.Contains(t, files["config-watcher/values.yaml"], "\n  digest: "+digest.String()+"\n")
}
