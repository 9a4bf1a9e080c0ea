//go:build release

// The release tests read a dist/ that hack/release.sh wrote (make release-test sets
// CW_DIST): they judge what a user downloads, not the code that wrote it.

package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func distDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CW_DIST")
	require.NotEmpty(t, dir, "set CW_DIST to a dist/ written by hack/release.sh (make release-test does)")
	return dir
}

// untar extracts a tar of dist into a temporary directory.
func untar(t *testing.T, file string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(distDir(t), file))
	require.NoError(t, err)
	defer f.Close()
	dir := t.TempDir()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return dir
		}
		require.NoError(t, err)
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		require.True(t, strings.HasPrefix(p, dir+string(filepath.Separator)), "entry %q leaves the archive", h.Name)
		if h.Typeflag == tar.TypeDir {
			require.NoError(t, os.MkdirAll(p, 0o755))
			continue
		}
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(p, data, 0o644))
	}
}

// ociIndex is the image index of the OCI layout: index.json itself, as crane push
// --index reads it.
func ociIndex(t *testing.T) (string, v1.ImageIndex) {
	t.Helper()
	dir := untar(t, ociLayoutFile)
	idx, err := layout.ImageIndexFromPath(dir)
	require.NoError(t, err)
	return dir, idx
}

// release is what the ctr archive says was released: the image by tag, and the digest.
func released(t *testing.T) (name.Tag, v1.Hash) {
	t.Helper()
	lp, err := layout.FromPath(untar(t, ctrArchiveFile))
	require.NoError(t, err)
	idx, err := lp.ImageIndex()
	require.NoError(t, err)
	m, err := idx.IndexManifest()
	require.NoError(t, err)
	require.NotEmpty(t, m.Manifests)
	tag, err := name.NewTag(m.Manifests[0].Annotations["io.containerd.image.name"], name.StrictValidation)
	require.NoError(t, err)
	return tag, m.Manifests[0].Digest
}

// objects decodes a multi-document YAML file of dist.
func objects(t *testing.T, file string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(distDir(t), file))
	require.NoError(t, err)
	return decodeYAML(t, data)
}

func decodeYAML(t *testing.T, data []byte) []map[string]any {
	t.Helper()
	var objs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var o map[string]any
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return objs
		}
		require.NoError(t, err)
		objs = append(objs, o)
	}
}

func field(o any, path ...string) any {
	for _, p := range path {
		m, ok := o.(map[string]any)
		if !ok {
			return nil
		}
		o = m[p]
	}
	return o
}

// controllerImages lists the image of every container named config-watcher.
func controllerImages(objs []map[string]any) []string {
	var images []string
	for _, o := range objs {
		cs, _ := field(o, "spec", "template", "spec", "containers").([]any)
		for _, c := range cs {
			if field(c, "name") == "config-watcher" {
				images = append(images, fmt.Sprint(field(c, "image")))
			}
		}
	}
	return images
}

// TestDistImageRunsAsNonRootOnBothPlatforms ensures the index holds exactly linux/amd64
// and linux/arm64, each config says so and runs /config-watcher as 65532, and each
// layer holds a linux binary of that architecture and the CA bundle.
func TestDistImageRunsAsNonRootOnBothPlatforms(t *testing.T) {
	_, idx := ociIndex(t)
	m, err := idx.IndexManifest()
	require.NoError(t, err)
	var seen []string
	for _, desc := range m.Manifests {
		require.NotNil(t, desc.Platform, "index entry %s has no platform", desc.Digest)
		arch := desc.Platform.Architecture
		seen = append(seen, desc.Platform.OS+"/"+arch)
		img, err := idx.Image(desc.Digest)
		require.NoError(t, err)
		cf, err := img.ConfigFile()
		require.NoError(t, err)
		assert.Equal(t, "linux", cf.OS, arch)
		assert.Equal(t, arch, cf.Architecture)
		assert.Equal(t, "65532:65532", cf.Config.User, arch)
		assert.Equal(t, []string{"/config-watcher"}, cf.Config.Entrypoint, arch)
		files := layerFiles(t, img)
		bin, ok := files["config-watcher"]
		require.True(t, ok, "%s: no /config-watcher", arch)
		ef, err := elf.NewFile(bytes.NewReader(bin))
		require.NoError(t, err, "%s: /config-watcher is not a linux (ELF) binary", arch)
		assert.Equal(t, wantPlatforms[arch], ef.Machine, arch)
		assert.Equal(t, elf.ELFOSABI_NONE, ef.OSABI, arch)
		assert.Contains(t, string(files["etc/ssl/certs/ca-certificates.crt"]), "BEGIN CERTIFICATE", arch)
	}
	assert.ElementsMatch(t, []string{"linux/amd64", "linux/arm64"}, seen)
}

func layerFiles(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	layers, err := img.Layers()
	require.NoError(t, err)
	files := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		require.NoError(t, err)
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			data, err := io.ReadAll(tr)
			require.NoError(t, err)
			files[h.Name] = data
		}
		rc.Close()
	}
	return files
}

// TestDistInstallNamesTheIndexDigest ensures both install files run exactly the image
// index that the OCI layout holds and the ctr archive names, by digest.
func TestDistInstallNamesTheIndexDigest(t *testing.T) {
	dir, idx := ociIndex(t)
	digest, err := idx.Digest()
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(dir, "index.json"))
	require.NoError(t, err)
	// crane push --index sends index.json as it is: its hash is what the registry keeps.
	want, _, err := v1.SHA256(bytes.NewReader(raw))
	require.NoError(t, err)
	require.Equal(t, want, digest)
	tag, ctrDigest := released(t)
	assert.Equal(t, digest, ctrDigest, "the ctr archive holds another index")
	for _, in := range installs {
		t.Run(in.file, func(t *testing.T) {
			assert.Equal(t, []string{tag.Context().Digest(digest.String()).Name()}, controllerImages(objects(t, in.file)))
		})
	}
}

// TestDistNamesEveryImageByDigest ensures every container of every install
// file (init containers included) names its image by digest: the
// controller the index's (TestDistInstallNamesTheIndexDigest says which),
// every other the one hack/images.lock holds for its tag. Only a tree
// make pin-images never ran on (a lock that pins nothing: no registry
// reached) keeps their tags, and the test says so; the release workflow
// pins before make release, so a published bundle never does.
func TestDistNamesEveryImageByDigest(t *testing.T) {
	lock, err := readLock(repoRoot)
	require.NoError(t, err)
	for _, in := range installs {
		t.Run(in.file, func(t *testing.T) {
			var images []string
			for _, o := range objects(t, in.file) {
				for _, list := range []string{"initContainers", "containers"} {
					cs, _ := field(o, "spec", "template", "spec", list).([]any)
					for _, c := range cs {
						images = append(images, fmt.Sprint(field(c, "image")))
					}
				}
			}
			require.NotEmpty(t, images)
			for _, image := range images {
				ref, digest, _ := strings.Cut(image, "@")
				switch {
				case strings.HasSuffix(ref, "/config-watcher"):
					assert.Regexp(t, `^sha256:[0-9a-f]{64}$`, digest, "%s: the controller by digest", image)
				case len(lock) == 0:
					t.Logf("%s: by tag: hack/images.lock pins nothing (make pin-images needs a registry)", image)
				default:
					assert.Equal(t, lock[ref], digest, "%s: the digest of hack/images.lock", image)
					assert.NotEmpty(t, digest, "%s: no digest; run make pin-images", image)
				}
			}
		})
	}
}

// TestDistDockerArchivesHoldThePlatformImages ensures each docker-archive carries the
// tag and the same image (config) as the index's entry for its platform.
func TestDistDockerArchivesHoldThePlatformImages(t *testing.T) {
	_, idx := ociIndex(t)
	tag, _ := released(t)
	m, err := idx.IndexManifest()
	require.NoError(t, err)
	for _, desc := range m.Manifests {
		arch := desc.Platform.Architecture
		t.Run(arch, func(t *testing.T) {
			want, err := idx.Image(desc.Digest)
			require.NoError(t, err)
			got, err := tarball.ImageFromPath(filepath.Join(distDir(t), dockerArchiveFile(arch)), &tag)
			require.NoError(t, err)
			wantID, err := want.ConfigName()
			require.NoError(t, err)
			gotID, err := got.ConfigName()
			require.NoError(t, err)
			assert.Equal(t, wantID, gotID)
		})
	}
}

// TestDistVersionLabelOnMetadataOnly ensures every object carries the version label in
// its metadata and no selector or pod template does (a selector is immutable: a
// version in it would make the next release's apply fail), and that every namespaced
// object, and the RoleBinding's subject, is in the install namespace.
func TestDistVersionLabelOnMetadataOnly(t *testing.T) {
	tag, _ := released(t)
	for _, in := range installs {
		t.Run(in.file, func(t *testing.T) {
			objs := objects(t, in.file)
			require.NotEmpty(t, objs)
			for _, o := range objs {
				what := fmt.Sprintf("%v %v", o["kind"], field(o, "metadata", "name"))
				assert.Equal(t, tag.TagStr(), field(o, "metadata", "labels", versionLabel), what)
				for _, p := range [][]string{{"spec", "selector", "matchLabels"}, {"spec", "template", "metadata", "labels"}} {
					labels, _ := field(o, p...).(map[string]any)
					assert.NotContains(t, labels, versionLabel, "%s: %s", what, strings.Join(p, "."))
				}
				switch o["kind"] {
				case "ClusterRole", "ClusterRoleBinding", "Namespace":
				default:
					assert.Equal(t, installNamespace, field(o, "metadata", "namespace"), what)
				}
				subjects, _ := o["subjects"].([]any)
				for _, s := range subjects {
					assert.Equal(t, installNamespace, field(s, "namespace"), "%s: subject", what)
				}
			}
		})
	}
}

// releasedIdentities are the kinds, names and selectors a release has promised: the
// next release applied over one must find the same objects (a selector cannot change).
// Changing one is a breaking change that CHANGELOG.md must explain with a migration.
// A file with components has those of the file it extends: a component adds no
// object, so applying one over the other switches between them.
var releasedIdentities = map[string][]string{
	"install.yaml":                      namespacedIdentities,
	"install-secrets.yaml":              namespacedIdentities,
	"install-cluster-wide.yaml":         clusterWideIdentities,
	"install-cluster-wide-secrets.yaml": clusterWideIdentities,
}

var namespacedIdentities = []string{
	"Deployment/config-watcher selector={\"matchLabels\":{\"app.kubernetes.io/name\":\"config-watcher\"}}",
	"PodDisruptionBudget/config-watcher selector={\"matchLabels\":{\"app.kubernetes.io/name\":\"config-watcher\"}}",
	"Role/config-watcher selector=null",
	"RoleBinding/config-watcher selector=null",
	"ServiceAccount/config-watcher selector=null",
}

var clusterWideIdentities = []string{
	"ClusterRole/config-watcher selector=null",
	"ClusterRoleBinding/config-watcher selector=null",
	"Deployment/config-watcher selector={\"matchLabels\":{\"app.kubernetes.io/name\":\"config-watcher\"}}",
	"PodDisruptionBudget/config-watcher selector={\"matchLabels\":{\"app.kubernetes.io/name\":\"config-watcher\"}}",
	"Role/config-watcher selector=null",
	"RoleBinding/config-watcher selector=null",
	"ServiceAccount/config-watcher selector=null",
}

// TestDistUpgradesInPlace ensures the install files have the kinds, names and selectors
// that releases promise, and those of manifests/ as a user applies it (components add
// no object): the next
// release applied over this one then updates the same objects instead of failing or
// duplicating them.
func TestDistUpgradesInPlace(t *testing.T) {
	for _, in := range installs {
		t.Run(in.file, func(t *testing.T) {
			got := identities(objects(t, in.file))
			assert.Equal(t, releasedIdentities[in.file], got)
			m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join("..", "..", "manifests", in.dir))
			require.NoError(t, err)
			y, err := m.AsYaml()
			require.NoError(t, err)
			assert.Equal(t, identities(decodeYAML(t, y)), got)
		})
	}
}

// identities are each object's kind, name and selector.
func identities(objs []map[string]any) []string {
	var ids []string
	for _, o := range objs {
		sel, _ := json.Marshal(field(o, "spec", "selector"))
		ids = append(ids, fmt.Sprintf("%v/%v selector=%s", o["kind"], field(o, "metadata", "name"), sel))
	}
	slices.Sort(ids)
	return ids
}

// TestDistPushesToARegistryAndPullsBackByDigest ensures the OCI layout, pushed the way
// release.yml pushes it (crane push --index: the layout's index.json as the index), to
// a registry on loopback, is served back by the digest install.yaml names, both
// platforms included.
func TestDistPushesToARegistryAndPullsBackByDigest(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	released, digest := released(t)

	dir, _ := ociIndex(t)
	// What crane push --index does with a directory (cmd/crane/cmd/push.go, v0.22.1).
	idx, err := layout.ImageIndexFromPath(dir)
	require.NoError(t, err)
	tag, err := name.NewTag(host+"/"+released.RepositoryStr()+":"+released.TagStr(), name.Insecure)
	require.NoError(t, err)
	require.NoError(t, remote.WriteIndex(tag, idx))

	pulled, err := remote.Index(tag.Context().Digest(digest.String()))
	require.NoError(t, err)
	got, err := pulled.Digest()
	require.NoError(t, err)
	assert.Equal(t, digest, got)
	m, err := pulled.IndexManifest()
	require.NoError(t, err)
	require.Len(t, m.Manifests, len(wantPlatforms))
	for _, desc := range m.Manifests {
		img, err := pulled.Image(desc.Digest)
		require.NoError(t, err)
		cf, err := img.ConfigFile()
		require.NoError(t, err, desc.Platform.Architecture)
		assert.Equal(t, desc.Platform.Architecture, cf.Architecture)
		// Every blob came back, not only the manifests.
		_, ok := layerFiles(t, img)["config-watcher"]
		assert.True(t, ok, desc.Platform.Architecture)
	}
	byTag, err := remote.Index(tag)
	require.NoError(t, err)
	tagDigest, err := byTag.Digest()
	require.NoError(t, err)
	assert.Equal(t, digest, tagDigest, "the tag names another index than the digest")
}

// TestDistSumsCoverEveryFile ensures SHA256SUMS lists every other file of dist/ with
// its hash, as `sha256sum -c` checks it.
func TestDistSumsCoverEveryFile(t *testing.T) {
	dir := distDir(t)
	f, err := os.Open(filepath.Join(dir, sumsFile))
	require.NoError(t, err)
	defer f.Close()
	listed := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, file, ok := strings.Cut(sc.Text(), "  ")
		require.True(t, ok, "line %q", sc.Text())
		listed[file] = sum
	}
	require.NoError(t, sc.Err())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var files []string
	for _, e := range entries {
		if e.Name() != sumsFile {
			files = append(files, e.Name())
		}
	}
	assert.ElementsMatch(t, files, keys(listed))
	for file, sum := range listed {
		got, err := fileSHA256(filepath.Join(dir, file))
		require.NoError(t, err)
		assert.Equal(t, sum, got, file)
	}
}

func keys(m map[string]string) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	return k
}

// TestDistSBOMDescribesTheRelease ensures the SPDX document names the released version,
// the Go version and the modules of the binary in the images.
func TestDistSBOMDescribesTheRelease(t *testing.T) {
	tag, _ := released(t)
	data, err := os.ReadFile(filepath.Join(distDir(t), sbomFile))
	require.NoError(t, err)
	var doc spdxDoc
	require.NoError(t, json.Unmarshal(data, &doc))
	assert.Equal(t, "SPDX-2.3", doc.SPDXVersion)
	versions := map[string]string{}
	for _, p := range doc.Packages {
		versions[p.Name] = p.VersionInfo
	}
	assert.Equal(t, tag.TagStr(), versions["github.com/k8spatterns/config-watcher"])
	assert.NotEmpty(t, versions["stdlib"])
	for _, mod := range []string{"github.com/tidwall/gjson", "github.com/cenkalti/backoff/v4"} {
		assert.NotEmpty(t, versions[mod], mod)
	}
	assert.Len(t, doc.Relationships, len(doc.Packages), "one DESCRIBES and a DEPENDS_ON per dependency")
}
