package main

import (
	"archive/tar"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// What dist/ holds, named in one place: release writes these, the release tests and
// the workflows read them.
const (
	ociLayoutFile  = "config-watcher.oci.tar"   // OCI layout whose index.json is the image index: crane push --index
	ctrArchiveFile = "config-watcher.ctr.tar"   // OCI archive naming the index by tag and digest: ctr import, kind load
	sbomFile       = "config-watcher.spdx.json" // SPDX 2.3 of the binary's modules
	// The chart's OCI layout (hack/helm package writes it beside config-watcher-X.Y.Z.tgz):
	// one manifest, Helm's, whose layer is that .tgz: crane push without --index.
	chartLayoutFile = "config-watcher-chart.oci.tar"
	sumsFile        = "SHA256SUMS"
	versionLabel    = "app.kubernetes.io/version"
	defaultImage    = "ghcr.io/k8spatterns/config-watcher"
	// The namespace both install files install into; install.yaml watches it,
	// install-cluster-wide.yaml every namespace. Set on every object, so that
	// `kubectl apply -f` lands there whatever the context's namespace is.
	installNamespace = "default"
)

// dockerArchiveFile is the docker-archive of one platform: docker load, kind load
// image-archive (by tag).
func dockerArchiveFile(arch string) string { return "config-watcher-linux-" + arch + ".docker.tar" }

// install is one install file: the kustomization under manifests/ it renders, with
// the components under manifests/ it adds.
type install struct {
	file, dir  string
	components []string
	watches    string
}

// installs are the install files. An optional part (a kustomize component) becomes one
// more row: a whole install of its own, with the same objects as the file it extends,
// so that applying one over the other switches between them.
var installs = []install{
	{"install.yaml", ".", nil, "the namespace " + installNamespace},
	{"install-cluster-wide.yaml", "cluster-wide", nil, "every namespace"},
	{"install-secrets.yaml", ".", []string{"secrets"}, "the namespace " + installNamespace + ", Secrets included"},
	{"install-cluster-wide-secrets.yaml", "cluster-wide", []string{"cluster-wide/secrets"}, "every namespace, Secrets included"},
}

// semver: what `make release VERSION=` accepts, and what a tag v* must look like.
var semver = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// platformBinary is one platform's controller binary.
type platformBinary struct{ arch, path string }

type release struct {
	version, image, source, revision string
	// manifests is the repository's manifests/: the install files name the
	// other images as it does, by digest once make pin-images ran (pin.go).
	manifests string
	bins      []platformBinary
	created   time.Time
}

// runRelease is `image release`: it writes dist/ (-o) from the controller binaries
// already built for each platform.
func runRelease(args []string) error {
	fs := flag.NewFlagSet("image release", flag.ContinueOnError)
	var r release
	fs.StringVar(&r.version, "version", "", "release version, vX.Y.Z")
	fs.StringVar(&r.image, "image", defaultImage, "image repository the install files name")
	fs.StringVar(&r.source, "source", "https://github.com/k8spatterns/config-watcher", "source repository URL (labels, SBOM)")
	fs.StringVar(&r.revision, "revision", "", "commit the binaries were built from (label)")
	fs.StringVar(&r.manifests, "manifests", "", "the repository's manifests/ directory")
	out := fs.String("o", "", "directory to write (replaced as a whole)")
	var bins listFlag
	fs.Var(&bins, "bin", "ARCH=PATH of a linux controller binary (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if !semver.MatchString(r.version) {
		return fmt.Errorf("-version %q: want vMAJOR.MINOR.PATCH", r.version)
	}
	if *out == "" || r.manifests == "" || r.revision == "" {
		return errors.New("-o, -manifests and -revision are required")
	}
	if _, err := name.NewRepository(r.image, name.StrictValidation); err != nil || strings.ToLower(r.image) != r.image {
		return fmt.Errorf("-image %q: want a lower-case repository such as %s", r.image, defaultImage)
	}
	for _, b := range bins {
		arch, path, ok := strings.Cut(b, "=")
		if !ok || arch == "" || path == "" {
			return fmt.Errorf("-bin %q: want ARCH=PATH", b)
		}
		r.bins = append(r.bins, platformBinary{arch, path})
	}
	if len(r.bins) == 0 {
		return errors.New("no -bin given")
	}
	var err error
	if r.created, err = sourceDateEpoch(); err != nil {
		return err
	}
	// Written beside the target and renamed, so that a failed run leaves the previous
	// dist/ or none, never a mixture.
	tmp := *out + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := r.write(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.RemoveAll(*out); err != nil {
		return err
	}
	return os.Rename(tmp, *out)
}

func (r release) write(dist string) error {
	if err := os.MkdirAll(dist, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "config-watcher-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	idx, images, err := r.index(work)
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	tag, err := name.NewTag(r.image+":"+r.version, name.StrictValidation)
	if err != nil {
		return err
	}

	// crane push --index pushes index.json itself, so index.json is the image index.
	oci := filepath.Join(work, "oci")
	if _, err := layout.Write(oci, idx); err != nil {
		return fmt.Errorf("OCI layout: %w", err)
	}
	// ctr import names an image after the annotations of index.json's entries: the
	// index once by tag and once by digest, so that install.yaml's reference (by
	// digest) is found without a pull.
	ctr := filepath.Join(work, "ctr")
	lp, err := layout.Write(ctr, mutate.IndexMediaType(empty.Index, types.OCIImageIndex))
	if err != nil {
		return fmt.Errorf("ctr archive: %w", err)
	}
	for _, ref := range []string{tag.Name(), tag.Context().Digest(digest.String()).Name()} {
		if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
			"io.containerd.image.name":          ref,
			"org.opencontainers.image.ref.name": r.version,
		})); err != nil {
			return fmt.Errorf("ctr archive: %w", err)
		}
	}
	for file, dir := range map[string]string{ociLayoutFile: oci, ctrArchiveFile: ctr} {
		if err := tarDir(filepath.Join(dist, file), dir, r.created); err != nil {
			return err
		}
	}
	for i, img := range images {
		if err := tarball.WriteToFile(filepath.Join(dist, dockerArchiveFile(r.bins[i].arch)), tag, img); err != nil {
			return fmt.Errorf("docker archive: %w", err)
		}
	}
	for _, in := range installs {
		y, err := r.render(in, digest.String())
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dist, in.file), y, 0o644); err != nil {
			return err
		}
	}
	bi, err := readBuildInfo(r.bins)
	if err != nil {
		return err
	}
	s, err := sbom(bi, r.version, r.source, digest.String(), r.created)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dist, sbomFile), s, 0o644); err != nil {
		return err
	}
	return writeSums(dist)
}

// index builds each platform's image and the index over them.
func (r release) index(work string) (v1.ImageIndex, []v1.Image, error) {
	ca, err := caBundle()
	if err != nil {
		return nil, nil, err
	}
	caFile := filepath.Join(work, "ca-certificates.crt")
	if err := os.WriteFile(caFile, ca, 0o644); err != nil {
		return nil, nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var images []v1.Image
	for _, b := range r.bins {
		img, err := Build(Spec{
			Files: []File{
				{Src: b.path, Dst: "/config-watcher", Mode: 0o755},
				{Src: caFile, Dst: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644},
			},
			Entrypoint: []string{"/config-watcher"},
			User:       "65532:65532",
			Ports:      []string{"8080/tcp"},
			Labels: map[string]string{
				"org.opencontainers.image.title":    "config-watcher",
				"org.opencontainers.image.source":   r.source,
				"org.opencontainers.image.version":  r.version,
				"org.opencontainers.image.revision": r.revision,
			},
			Created: r.created,
		}, b.arch)
		if err != nil {
			return nil, nil, fmt.Errorf("image for %s: %w", b.arch, err)
		}
		images = append(images, img)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: b.arch}},
		})
	}
	return idx, images, nil
}

var sha256Digest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// render is kustomize (the sigs.k8s.io/kustomize/api that go.mod pins) over
// manifests/in.dir and its components with the image pinned by digest, every object in
// installNamespace and labelled with the version. The label goes on metadata only: a
// selector is immutable, so a version in it would make the next release's apply fail.
func (r release) render(in install, digest string) ([]byte, error) {
	tmp, err := os.MkdirTemp("", "config-watcher-install-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// kustomize takes no absolute path for a base or a component.
	rel := func(dir string) (string, error) {
		abs, err := filepath.Abs(filepath.Join(r.manifests, dir))
		if err != nil {
			return "", err
		}
		p, err := filepath.Rel(tmp, abs)
		return filepath.ToSlash(p), err
	}
	base, err := rel(in.dir)
	if err != nil {
		return nil, err
	}
	components, from := "", "manifests/"+strings.TrimPrefix(in.dir, ".")
	for _, c := range in.components {
		p, err := rel(c)
		if err != nil {
			return nil, err
		}
		components += "- " + p + "\n"
		from += " with manifests/" + c
	}
	if components != "" {
		components = "components:\n" + components
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %s
resources:
- %s
%simages:
- name: %s
  newName: %s
  digest: %s
labels:
- pairs:
    %s: %s
`, installNamespace, base, components, defaultImage, r.image, digest, versionLabel, r.version)
	if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return nil, err
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), tmp)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", from, err)
	}
	y, err := m.AsYaml()
	if err != nil {
		return nil, err
	}
	header := fmt.Sprintf("# config-watcher %s: kubectl apply -f this file. It installs into the namespace %s\n"+
		"# and watches %s.\n# Rendered from %s at %s\n"+
		"# by sigs.k8s.io/kustomize/api %s; the image is pinned by digest.\n",
		r.version, installNamespace, in.watches, from, r.revision, moduleVersion("sigs.k8s.io/kustomize/api"))
	return append([]byte(header), y...), nil
}

// moduleVersion is the version of a module linked into this tool.
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return "(unknown)"
}

// tarDir writes dir as a tar in path order, owned by root, stamped with created, so
// the same directory gives the same bytes.
func tarDir(out, dir string, created time.Time) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: created, Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		st, err := in.Stat()
		if err != nil {
			return err
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, st.Size()
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = io.Copy(tw, in)
		return err
	})
	if err != nil {
		return fmt.Errorf("tar %s: %w", out, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// writeSums writes SHA256SUMS over every other file of dist, in sha256sum's format.
func writeSums(dist string) error {
	entries, err := os.ReadDir(dist)
	if err != nil {
		return err
	}
	var lines []string
	for _, e := range entries {
		if e.Name() == sumsFile {
			continue
		}
		if !e.Type().IsRegular() {
			return fmt.Errorf("%s in dist/ is not a file", e.Name())
		}
		sum, err := fileSHA256(filepath.Join(dist, e.Name()))
		if err != nil {
			return err
		}
		lines = append(lines, sum+"  "+e.Name()+"\n")
	}
	slices.Sort(lines)
	return os.WriteFile(filepath.Join(dist, sumsFile), []byte(strings.Join(lines, "")), 0o644)
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return fmt.Sprintf("%x", h.Sum(nil)), nil
}
