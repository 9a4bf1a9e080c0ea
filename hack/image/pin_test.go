package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeCraneLog, set, makes this test binary a fake crane: `crane digest REF`
// prints a digest made from REF (fakeDigest) and appends REF to the file;
// a REF that fakeCraneFail names fails, as an unknown tag does.
const (
	fakeCraneLog  = "CW_FAKE_CRANE_LOG"
	fakeCraneFail = "CW_FAKE_CRANE_FAIL"
)

func TestMain(m *testing.M) {
	if log := os.Getenv(fakeCraneLog); log != "" {
		os.Exit(fakeCrane(log, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeCrane(log string, args []string) int {
	if len(args) != 2 || args[0] != "digest" {
		fmt.Fprintf(os.Stderr, "fake crane: unexpected arguments %q\n", args)
		return 2
	}
	f, err := os.OpenFile(log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	fmt.Fprintln(f, args[1])
	if args[1] == os.Getenv(fakeCraneFail) {
		fmt.Fprintf(os.Stderr, "Error: fetching manifest %s: MANIFEST_UNKNOWN\n", args[1])
		return 1
	}
	fmt.Println(fakeDigest(args[1]))
	return 0
}

// fakeDigest is the fake crane's digest of ref.
func fakeDigest(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// imageHolders are where an install or a build reads an image name from,
// listed here and not taken from pin.go, so that a file pin.go leaves out
// shows as a reference left unpinned: every YAML file under the
// directories, and the files.
var imageHolders = []string{"manifests", "charts", "Dockerfile", "docker-compose.yaml", lockFile}

// pinCopy copies the repository's imageHolders into a fresh directory and
// returns it.
func pinCopy(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for _, h := range imageHolders {
		require.NoError(t, filepath.WalkDir(filepath.Join(repoRoot, h), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && (p == filepath.Join(repoRoot, h) || strings.HasSuffix(p, ".yaml")) {
				paths = append(paths, p)
			}
			return err
		}))
	}
	for _, p := range paths {
		rel, err := filepath.Rel(repoRoot, p)
		require.NoError(t, err)
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(rel)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, rel), b, 0o644))
	}
	return dir
}

// fakeCraneEnv makes pinImages' crane, the test binary, the fake crane.
func fakeCraneEnv(t *testing.T, fail string) (crane, log string) {
	t.Helper()
	log = filepath.Join(t.TempDir(), "crane.log")
	t.Setenv(fakeCraneLog, log)
	t.Setenv(fakeCraneFail, fail)
	crane, err := os.Executable()
	require.NoError(t, err)
	return crane, log
}

// tree is every file under dir, by path relative to it.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		files[rel] = string(b)
		return err
	}))
	return files
}

var (
	// Every image reference as a reader of the file finds it, independently
	// of pin.go: an image: line (compose's default inside ${...}), a FROM, a
	// kustomization's images: entry (name, newTag, maybe digest).
	anyImageLine = regexp.MustCompile(`(?m)^\s*(?:- )?image:\s*(?:\$\{[A-Z0-9_]+:-)?([^\s}]+)\}?\s*$`)
	anyFrom      = regexp.MustCompile(`(?m)^FROM\s+(?:--\S+\s+)*(\S+)`)
	anyEntry     = regexp.MustCompile(`(?m)^\s*- name:\s*(\S+)\n\s+newTag:\s*(\S+)\n(?:\s+digest:\s*(\S+)\n)?`)
	anyValue     = regexp.MustCompile(`(?m)^\s*repository:\s*(\S+)\n\s+tag:\s*(\S+)\n\s+digest:\s*(\S+)\n`)
	goVersionArg = regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`)
)

// references are the image references of the files of dir, name:tag →
// the digests they carry ("" for none), the repository's own image left out.
func references(t *testing.T, dir string) map[string][]string {
	t.Helper()
	refs := map[string][]string{}
	add := func(ref, digest string) {
		if strings.HasPrefix(ref, ownImage+":") || strings.Contains(ref, "${VERSION") {
			return
		}
		if !slices.Contains(refs[ref], digest) {
			refs[ref] = append(refs[ref], digest)
		}
	}
	for rel, content := range tree(t, dir) {
		switch {
		case rel == lockFile:
		case rel == "Dockerfile":
			goVersion := goVersionArg.FindStringSubmatch(content)
			require.NotNil(t, goVersion, "no ARG GO_VERSION in the Dockerfile")
			for _, m := range anyFrom.FindAllStringSubmatch(content, -1) {
				ref, digest, _ := strings.Cut(strings.ReplaceAll(m[1], "${GO_VERSION}", goVersion[1]), "@")
				add(ref, digest)
			}
		default:
			for _, m := range anyImageLine.FindAllStringSubmatch(content, -1) {
				ref, digest, _ := strings.Cut(m[1], "@")
				add(ref, digest)
			}
			for _, m := range anyEntry.FindAllStringSubmatch(content, -1) {
				add(m[1]+":"+m[2], m[3])
			}
			for _, m := range anyValue.FindAllStringSubmatch(content, -1) {
				if tag := strings.Trim(m[2], `"`); tag != "" {
					add(m[1]+":"+tag, strings.Trim(m[3], `"`))
				}
			}
		}
	}
	return refs
}

// TestPinImagesRewritesEveryReference ensures make pin-images asks crane
// once for each image tag of manifests/, the Dockerfile and
// docker-compose.yaml (the repository's own image aside), writes each
// digest to the lock, and names every reference by tag and that digest:
// the kustomization's images: entries (kustomize then renders name:tag@digest),
// compose's defaults, the Dockerfile's FROMs (its GO_VERSION's included) and
// the chart's values (a digest: beside each tag:).
func TestPinImagesRewritesEveryReference(t *testing.T) {
	dir := pinCopy(t)
	crane, log := fakeCraneEnv(t, "")
	before := references(t, dir)
	require.Contains(t, before, "registry.k8s.io/kubectl:v1.37.2", "the ambassador's image")

	require.NoError(t, pinImages(dir, crane))

	asked, err := os.ReadFile(log)
	require.NoError(t, err)
	var want []string
	for ref := range before {
		want = append(want, ref)
	}
	assert.ElementsMatch(t, want, strings.Fields(string(asked)), "crane digest once for each tag")
	lock, err := readLock(dir)
	require.NoError(t, err)
	after := references(t, dir)
	assert.ElementsMatch(t, want, refNames(after), "the same tags, pinned")
	for ref, digests := range after {
		assert.Equal(t, []string{fakeDigest(ref)}, digests, "%s: every reference by the digest crane gave", ref)
		assert.Equal(t, fakeDigest(ref), lock[ref], "%s in the lock", ref)
	}
	assert.Len(t, lock, len(want), "the lock holds the tags named, and no other")
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		out, err := exec.Command(kubectl, "kustomize", filepath.Join(dir, "manifests")).Output()
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`(?m)^\s*image:\s*(\S+)$`).FindAllStringSubmatch(string(out), -1) {
			if !strings.HasPrefix(m[1], ownImage+":") {
				assert.Regexp(t, `^[^@]+:[^@]+@sha256:[0-9a-f]{64}$`, m[1], "kubectl kustomize manifests")
			}
		}
	}
}

// TestPinImagesIsIdempotent ensures a second make pin-images with the
// registry unchanged changes no file: a digest already written is replaced,
// never appended to.
func TestPinImagesIsIdempotent(t *testing.T) {
	dir := pinCopy(t)
	crane, _ := fakeCraneEnv(t, "")
	require.NoError(t, pinImages(dir, crane))
	once := tree(t, dir)
	require.NoError(t, pinImages(dir, crane))
	assert.Equal(t, once, tree(t, dir))
}

// TestPinImagesChangesNothingWhenATagIsUnknown ensures a tag crane cannot
// resolve fails make pin-images, naming it, with no file written: the
// references and the lock never disagree.
func TestPinImagesChangesNothingWhenATagIsUnknown(t *testing.T) {
	dir := pinCopy(t)
	crane, _ := fakeCraneEnv(t, "rancher/k3s:v1.37.0-k3s1")
	before := tree(t, dir)
	err := pinImages(dir, crane)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rancher/k3s:v1.37.0-k3s1")
	assert.Contains(t, err.Error(), "MANIFEST_UNKNOWN")
	assert.Equal(t, before, tree(t, dir))
}

// TestImagesNameTheLockedDigests ensures the repository's references agree
// with hack/images.lock, the one place of their digests: a tag the lock
// pins is named by its digest everywhere, one it does not pin by no digest
// (a digest written by hand), and the lock pins no tag nothing names.
func TestImagesNameTheLockedDigests(t *testing.T) {
	lock, err := readLock(repoRoot)
	require.NoError(t, err)
	refs := references(t, pinCopy(t))
	for ref, digests := range refs {
		want := lock[ref]
		assert.Equal(t, []string{want}, digests, "%s: the digest hack/images.lock has (%q); run make pin-images", ref, want)
	}
	for ref := range lock {
		assert.Contains(t, refs, ref, "hack/images.lock pins %s, which nothing names; run make pin-images", ref)
	}
	// The same reader as pin.go's.
	mine, err := imageRefs(repoRoot)
	require.NoError(t, err)
	assert.ElementsMatch(t, refNames(refs), refNames(mine), "pin.go and this test find the same references")
}

func refNames[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
