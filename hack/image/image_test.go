package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func controllerSpec(t *testing.T) Spec {
	t.Helper()
	return Spec{
		Files: []File{
			{Src: writeTemp(t, "bin", "binary"), Dst: "/config-watcher", Mode: 0o755},
			{Src: writeTemp(t, "ca", "certs"), Dst: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644},
		},
		Entrypoint: []string{"/config-watcher"},
		User:       "65532:65532",
		Ports:      []string{"8080/tcp"},
		Created:    time.Unix(0, 0).UTC(),
	}
}

// layerEntries lists the single layer's tar headers by name.
func layerEntries(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1)
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	entries := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return entries
		}
		require.NoError(t, err)
		entries[h.Name] = h
	}
}

// TestBuildIsReproducible ensures the same files and spec give the same digest, so a
// rebuilt image is recognisably the same image.
func TestBuildIsReproducible(t *testing.T) {
	spec := controllerSpec(t)
	a, err := Build(spec, "amd64")
	require.NoError(t, err)
	b, err := Build(spec, "amd64")
	require.NoError(t, err)
	da, err := a.Digest()
	require.NoError(t, err)
	db, err := b.Digest()
	require.NoError(t, err)
	assert.Equal(t, da, db)

	changed := spec
	changed.Files = append([]File(nil), spec.Files...)
	changed.Files[0].Src = writeTemp(t, "bin2", "other binary")
	c, err := Build(changed, "amd64")
	require.NoError(t, err)
	dc, err := c.Digest()
	require.NoError(t, err)
	assert.NotEqual(t, da, dc, "a different binary must give a different digest")
}

// TestBuildConfigRunsAsNonRoot ensures entrypoint, numeric user, port and platform reach
// the image config, which is what the runtime and runAsNonRoot read.
func TestBuildConfigRunsAsNonRoot(t *testing.T) {
	img, err := Build(controllerSpec(t), "amd64")
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []string{"/config-watcher"}, cf.Config.Entrypoint)
	assert.Equal(t, "65532:65532", cf.Config.User)
	assert.Contains(t, cf.Config.ExposedPorts, "8080/tcp")
	assert.Equal(t, "linux", cf.OS)
	assert.Equal(t, "amd64", cf.Architecture)
}

// TestBuildLayerHoldsOnlyTheFiles ensures the layer has the given files with their modes,
// their parent directories, root ownership and the fixed timestamp, and nothing else.
func TestBuildLayerHoldsOnlyTheFiles(t *testing.T) {
	img, err := Build(controllerSpec(t), "amd64")
	require.NoError(t, err)
	entries := layerEntries(t, img)
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	assert.ElementsMatch(t, []string{"config-watcher", "etc/", "etc/ssl/", "etc/ssl/certs/", "etc/ssl/certs/ca-certificates.crt"}, names)
	assert.Equal(t, int64(0o755), entries["config-watcher"].Mode)
	assert.Equal(t, int64(0o644), entries["etc/ssl/certs/ca-certificates.crt"].Mode)
	for n, h := range entries {
		assert.Zero(t, h.Uid, n)
		assert.Zero(t, h.Gid, n)
		assert.True(t, h.ModTime.Equal(time.Unix(0, 0)), "%s: mtime %s", n, h.ModTime)
	}
}

// TestBuildRefusesBadSpecs ensures bad input is an error that names it, not an image.
func TestBuildRefusesBadSpecs(t *testing.T) {
	good := writeTemp(t, "bin", "binary")
	tests := []struct {
		name string
		spec Spec
	}{
		{"NoFiles", Spec{Entrypoint: []string{"/x"}}},
		{"NoEntrypoint", Spec{Files: []File{{Src: good, Dst: "/x", Mode: 0o755}}}},
		{"RelativeDestination", Spec{Entrypoint: []string{"/x"}, Files: []File{{Src: good, Dst: "x", Mode: 0o755}}}},
		{"UncleanDestination", Spec{Entrypoint: []string{"/x"}, Files: []File{{Src: good, Dst: "/a/../x", Mode: 0o755}}}},
		{"DuplicateDestination", Spec{Entrypoint: []string{"/x"}, Files: []File{{Src: good, Dst: "/x", Mode: 0o755}, {Src: good, Dst: "/x", Mode: 0o755}}}},
		{"ModeWithTypeBits", Spec{Entrypoint: []string{"/x"}, Files: []File{{Src: good, Dst: "/x", Mode: 0o100755}}}},
		{"MissingSource", Spec{Entrypoint: []string{"/x"}, Files: []File{{Src: filepath.Join(t.TempDir(), "nope"), Dst: "/x", Mode: 0o755}}}},
		{"SourceIsADirectory", Spec{Entrypoint: []string{"/x"}, Files: []File{{Src: t.TempDir(), Dst: "/x", Mode: 0o755}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, err := Build(tt.spec, "amd64")
			assert.Error(t, err)
			assert.Nil(t, img)
		})
	}
}

// TestRunWritesALoadableTarball ensures the command writes a tarball that reads back
// under its tag with the same digest it printed, and leaves no temporary file.
func TestRunWritesALoadableTarball(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "img.tar")
	bin := writeTemp(t, "bin", "binary")
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	require.NoError(t, run([]string{"-ref", "ghcr.io/k8spatterns/config-watcher:v0.1.0", "-o", out,
		"-entrypoint", "/config-watcher", "-user", "65532:65532", "-file", bin + "=/config-watcher:0755",
		"-label", "org.opencontainers.image.version=v0.1.0"}))
	img, err := tarball.ImageFromPath(out, nil)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, "v0.1.0", cf.Config.Labels["org.opencontainers.image.version"])
	assert.True(t, cf.Created.Time.Equal(time.Unix(1700000000, 0)))
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(out) })
	require.NoError(t, err)
	require.Len(t, m, 1)
	assert.Equal(t, []string{"ghcr.io/k8spatterns/config-watcher:v0.1.0"}, m[0].RepoTags)
	_, err = os.Stat(out + ".tmp")
	assert.True(t, os.IsNotExist(err), "temporary file left behind")
}

// TestRunRefusesBadFlags ensures bad flags fail before anything is written.
func TestRunRefusesBadFlags(t *testing.T) {
	bin := writeTemp(t, "bin", "binary")
	tests := []struct {
		name string
		args []string
		env  string
	}{
		{"MissingRef", []string{"-entrypoint", "/x", "-file", bin + "=/x"}, ""},
		{"InvalidRef", []string{"-ref", "UPPER/case:tag", "-entrypoint", "/x", "-file", bin + "=/x"}, ""},
		{"FileWithoutDestination", []string{"-ref", "a/b:c", "-entrypoint", "/x", "-file", bin}, ""},
		{"NonOctalMode", []string{"-ref", "a/b:c", "-entrypoint", "/x", "-file", bin + "=/x:rwx"}, ""},
		{"LabelWithoutValue", []string{"-ref", "a/b:c", "-entrypoint", "/x", "-file", bin + "=/x", "-label", "k"}, ""},
		{"BadSourceDateEpoch", []string{"-ref", "a/b:c", "-entrypoint", "/x", "-file", bin + "=/x"}, "yesterday"},
		{"StrayArgument", []string{"-ref", "a/b:c", "-entrypoint", "/x", "-file", bin + "=/x", "extra"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("SOURCE_DATE_EPOCH", tt.env)
			out := filepath.Join(t.TempDir(), "img.tar")
			err := run(append([]string{"-o", out}, tt.args...))
			assert.Error(t, err)
			_, statErr := os.Stat(out)
			assert.True(t, os.IsNotExist(statErr), "tarball written despite the error")
		})
	}
}

func tarNames(t *testing.T, data []byte) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		require.NoError(t, err)
		names = append(names, h.Name)
	}
}
