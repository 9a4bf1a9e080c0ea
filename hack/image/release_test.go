package main

import (
	"bytes"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// wantPlatforms are the linux platforms hack/release.sh builds, with the ELF machine of
// each one's binary.
var wantPlatforms = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// TestCABundleHoldsEveryUnconstrainedRootOnce ensures the images' CA bundle is the
// pinned NSS roots without a distrust date, each a parseable CA certificate, once.
func TestCABundleHoldsEveryUnconstrainedRootOnce(t *testing.T) {
	want := map[string]bool{}
	constrained := 0
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			constrained++
			continue
		}
		want[string(root.Certificate)] = true
	}
	require.NotZero(t, constrained, "precondition: the pinned bundle has constrained roots to leave out")

	pemData, err := caBundle()
	require.NoError(t, err)
	got := map[string]bool{}
	for rest := pemData; len(bytes.TrimSpace(rest)) > 0; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		require.NotNil(t, block, "undecodable PEM after %d certificates", len(got))
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		assert.True(t, c.IsCA, c.Subject.String())
		assert.False(t, got[string(block.Bytes)], "%s twice", c.Subject)
		got[string(block.Bytes)] = true
	}
	assert.Equal(t, want, got)
}

func sampleBuildInfo() *debug.BuildInfo {
	return &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Path:      "github.com/k8spatterns/config-watcher",
		Deps: []*debug.Module{
			{Path: "github.com/tidwall/gjson", Version: "v1.20.2", Sum: "h1:x"},
			{Path: "github.com/cenkalti/backoff/v4", Version: "v4.3.0", Sum: "h1:y"},
			{Path: "example.com/old", Version: "v1.0.0", Replace: &debug.Module{Path: "example.com/new", Version: "v1.0.1"}},
		},
	}
}

// TestSBOMListsTheLinkedModules ensures the SPDX document describes the binary at the
// release version, depends on the standard library and every module (a replacement
// under its own name), sorted, and is the same bytes for the same input.
func TestSBOMListsTheLinkedModules(t *testing.T) {
	created := time.Unix(1700000000, 0)
	out, err := sbom(sampleBuildInfo(), "v1.2.3", "https://example.com/cw", "sha256:abc", created)
	require.NoError(t, err)
	again, err := sbom(sampleBuildInfo(), "v1.2.3", "https://example.com/cw", "sha256:abc", created)
	require.NoError(t, err)
	assert.Equal(t, out, again)

	var doc spdxDoc
	require.NoError(t, json.Unmarshal(out, &doc))
	var names []string
	for _, p := range doc.Packages {
		names = append(names, p.Name+"@"+p.VersionInfo)
	}
	assert.Equal(t, []string{"github.com/k8spatterns/config-watcher@v1.2.3", "stdlib@1.26.8",
		"example.com/new@v1.0.1", "github.com/cenkalti/backoff/v4@v4.3.0", "github.com/tidwall/gjson@v1.20.2"}, names)
	assert.Equal(t, "2023-11-14T22:13:20Z", doc.CreationInfo.Created)
	assert.Equal(t, "https://example.com/cw/spdx/v1.2.3/abc", doc.DocumentNamespace)
	assert.Equal(t, spdxRelationship{"SPDXRef-DOCUMENT", "DESCRIBES", doc.Packages[0].SPDXID}, doc.Relationships[0])
	for i, r := range doc.Relationships[1:] {
		assert.Equal(t, spdxRelationship{doc.Packages[0].SPDXID, "DEPENDS_ON", doc.Packages[i+1].SPDXID}, r)
	}
}

// TestReadBuildInfoReadsAGoBinary ensures the build information comes from the binary
// (here the test binary itself) and that a file that is no Go binary is refused.
func TestReadBuildInfoReadsAGoBinary(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	bi, err := readBuildInfo([]platformBinary{{"amd64", self}, {"arm64", self}})
	require.NoError(t, err)
	assert.Equal(t, "github.com/k8spatterns/config-watcher/hack/image", bi.Path)

	_, err = readBuildInfo([]platformBinary{{"amd64", writeTemp(t, "x", "not a binary")}})
	assert.Error(t, err)
	_, err = readBuildInfo(nil)
	assert.Error(t, err)
}

// TestTarDirIsReproducible ensures a directory tars to the same bytes whatever its
// files' times and modes, in path order.
func TestTarDirIsReproducible(t *testing.T) {
	created := time.Unix(1700000000, 0)
	tarOf := func(mtime time.Time, mode os.FileMode) []byte {
		dir := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o700))
		for _, f := range []string{"index.json", "blobs/sha256/b", "blobs/sha256/a"} {
			p := filepath.Join(dir, f)
			require.NoError(t, os.WriteFile(p, []byte(f), mode))
			require.NoError(t, os.Chtimes(p, mtime, mtime))
		}
		out := filepath.Join(t.TempDir(), "x.tar")
		require.NoError(t, tarDir(out, dir, created))
		data, err := os.ReadFile(out)
		require.NoError(t, err)
		return data
	}
	a := tarOf(time.Unix(1, 0), 0o600)
	assert.Equal(t, a, tarOf(time.Now(), 0o644))
	names := tarNames(t, a)
	assert.Equal(t, []string{"blobs/", "blobs/sha256/", "blobs/sha256/a", "blobs/sha256/b", "index.json"}, names)
}

// TestRunReleaseRefusesBadFlags ensures bad input fails before anything is written.
func TestRunReleaseRefusesBadFlags(t *testing.T) {
	bin := writeTemp(t, "bin", "binary")
	good := func(extra ...string) []string {
		return append([]string{"-revision", "abc", "-manifests", "../../manifests"}, extra...)
	}
	tests := []struct {
		name string
		args []string
	}{
		{"VersionWithoutV", good("-version", "1.2.3", "-bin", "amd64="+bin)},
		{"VersionNotSemver", good("-version", "v1.2", "-bin", "amd64="+bin)},
		{"VersionLeadingZero", good("-version", "v1.02.3", "-bin", "amd64="+bin)},
		{"ImageUpperCase", good("-version", "v1.2.3", "-image", "ghcr.io/K8sPatterns/config-watcher", "-bin", "amd64="+bin)},
		{"ImageWithTag", good("-version", "v1.2.3", "-image", "ghcr.io/k8spatterns/config-watcher:v1", "-bin", "amd64="+bin)},
		{"NoBinary", good("-version", "v1.2.3")},
		{"BinaryWithoutArch", good("-version", "v1.2.3", "-bin", bin)},
		{"NoRevision", []string{"-version", "v1.2.3", "-manifests", "../../manifests", "-bin", "amd64=" + bin}},
		{"NotAGoBinary", good("-version", "v1.2.3", "-bin", "amd64="+bin)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "dist")
			assert.Error(t, runRelease(append([]string{"-o", out}, tt.args...)))
			_, err := os.Stat(out)
			assert.True(t, os.IsNotExist(err), "dist written despite the error")
			_, err = os.Stat(out + ".tmp")
			assert.True(t, os.IsNotExist(err), "temporary dist left behind")
		})
	}
}

// TestRenderGrantsSecretsOnlyInTheSecretsInstalls ensures every install file renders
// from the repository's manifests, and that exactly those whose name says so (the
// secrets component) grant anything on secrets and turn WATCH_SECRETS on.
func TestRenderGrantsSecretsOnlyInTheSecretsInstalls(t *testing.T) {
	r := release{version: "v1.2.3", image: defaultImage, revision: "abc", manifests: "../../manifests"}
	digest := "sha256:" + strings.Repeat("0", 64)
	for _, in := range installs {
		t.Run(in.file, func(t *testing.T) {
			y, err := r.render(in, digest)
			require.NoError(t, err)
			secrets := strings.HasSuffix(in.file, "-secrets.yaml")
			assert.Equal(t, secrets, strings.Contains(string(y), "\n  - secrets\n"), "a rule on secrets")
			assert.Equal(t, secrets, strings.Contains(string(y), "name: WATCH_SECRETS"), "WATCH_SECRETS")
			assert.Contains(t, string(y), "image: "+defaultImage+"@"+digest)
		})
	}
}

// TestRenderNamesThePinnedImages ensures the install files of a tree make
// pin-images pinned name the ambassador by its tag and the digest of
// hack/images.lock: the release workflow pins before make release.
func TestRenderNamesThePinnedImages(t *testing.T) {
	const ambassador = "registry.k8s.io/kubectl:v1.37.2"
	digest := "sha256:" + strings.Repeat("0", 64)
	pinned := pinCopy(t)
	crane, _ := fakeCraneEnv(t, "")
	require.NoError(t, pinImages(pinned, crane))
	for _, in := range installs {
		t.Run(in.file, func(t *testing.T) {
			r := release{version: "v1.2.3", image: defaultImage, revision: "abc", manifests: filepath.Join(pinned, "manifests")}
			y, err := r.render(in, digest)
			require.NoError(t, err)
			assert.Contains(t, string(y), "image: "+ambassador+"@"+fakeDigest(ambassador)+"\n")
		})
	}
}
