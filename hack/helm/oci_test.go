package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v4/pkg/registry"
)

// TestOCILayoutIsHelmsManifestOfThePackage ensures the chart's OCI layout is one manifest
// with Helm's media types and annotations, whose layer is the packaged .tgz byte for byte
// and whose config is the chart's metadata, and is the same bytes when written again.
func TestOCILayoutIsHelmsManifestOfThePackage(t *testing.T) {
	when := time.Unix(1700000000, 0).UTC()
	tgz, err := pack(chartPath, "v1.2.3", "ghcr.io/fork/config-watcher", "sha256:"+strings.Repeat("ab", 32), "", when, t.TempDir())
	require.NoError(t, err)
	a, err := ociLayout(tgz, when, t.TempDir())
	require.NoError(t, err)
	b, err := ociLayout(tgz, when, t.TempDir())
	require.NoError(t, err)
	assert.Equal(t, "config-watcher-chart.oci.tar", filepath.Base(a))
	ab, err := os.ReadFile(a)
	require.NoError(t, err)
	bb, err := os.ReadFile(b)
	require.NoError(t, err)
	assert.Equal(t, ab, bb, "two layouts of the same chart differ")

	files := untar(t, a)
	assert.JSONEq(t, `{"imageLayoutVersion":"1.0.0"}`, string(files["oci-layout"]))
	var index ocispec.Index
	require.NoError(t, json.Unmarshal(files["index.json"], &index))
	require.Len(t, index.Manifests, 1)
	md := index.Manifests[0]
	assert.Equal(t, ocispec.MediaTypeImageManifest, md.MediaType)
	var m ocispec.Manifest
	require.NoError(t, json.Unmarshal(blob(t, files, md), &m))
	assert.Equal(t, registry.ConfigMediaType, m.Config.MediaType)
	var meta struct{ Name, Version, AppVersion string }
	require.NoError(t, json.Unmarshal(blob(t, files, m.Config), &meta))
	assert.Equal(t, struct{ Name, Version, AppVersion string }{"config-watcher", "1.2.3", "v1.2.3"}, meta)
	require.Len(t, m.Layers, 1)
	assert.Equal(t, registry.ChartLayerMediaType, m.Layers[0].MediaType)
	data, err := os.ReadFile(tgz)
	require.NoError(t, err)
	assert.Equal(t, data, blob(t, files, m.Layers[0]), "the layer is not the packaged chart")
	assert.Equal(t, "2023-11-14T22:13:20Z", m.Annotations[ocispec.AnnotationCreated])
	assert.Equal(t, "1.2.3", m.Annotations[ocispec.AnnotationVersion])
	assert.Equal(t, "config-watcher", m.Annotations[ocispec.AnnotationTitle])
}

// blob is the layout's blob desc names, checked against its digest and size.
func blob(t *testing.T, files map[string][]byte, desc ocispec.Descriptor) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+desc.Digest.Encoded()]
	require.True(t, ok, "no blob %s", desc.Digest)
	assert.Equal(t, desc.Digest, digest.FromBytes(b))
	assert.Equal(t, desc.Size, int64(len(b)))
	return b
}

// untar is a tar's regular files by name.
func untar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	files := map[string][]byte{}
	r := tar.NewReader(f)
	for {
		h, err := r.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		require.NoError(t, err)
		if h.Typeflag == tar.TypeReg {
			files[h.Name], err = io.ReadAll(r)
			require.NoError(t, err)
		}
	}
}
