package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of the image: Src on this machine, Dst its absolute path in the image.
type File struct {
	Src  string
	Dst  string
	Mode int64
}

// Spec is everything an image is made of. Two builds of the same Spec from the same
// files give the same digest: every timestamp is Created, every owner is root.
type Spec struct {
	Files      []File
	Entrypoint []string
	Cmd        []string
	User       string
	Env        []string
	Ports      []string // "8080/tcp"
	Labels     map[string]string
	WorkingDir string
	Created    time.Time
}

func (s Spec) validate() error {
	if len(s.Files) == 0 {
		return errors.New("no files: an image needs at least its binary")
	}
	seen := map[string]bool{}
	for _, f := range s.Files {
		if !path.IsAbs(f.Dst) || path.Clean(f.Dst) != f.Dst || f.Dst == "/" {
			return fmt.Errorf("file %s: destination %q must be a clean absolute file path", f.Src, f.Dst)
		}
		if seen[f.Dst] {
			return fmt.Errorf("file %s: destination %s given twice", f.Src, f.Dst)
		}
		seen[f.Dst] = true
		if f.Mode&^0o7777 != 0 {
			return fmt.Errorf("file %s: mode %o is not a permission mode", f.Src, f.Mode)
		}
	}
	if len(s.Entrypoint) == 0 {
		return errors.New("no entrypoint")
	}
	return nil
}

// Build assembles a single-layer linux image for arch from spec, with OCI media types
// throughout, so that it can sit in an OCI image index beside its other platforms.
func Build(spec Spec, arch string) (v1.Image, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	layerTar, err := layerTar(spec.Files, spec.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromReader(bytes.NewReader(layerTar), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: spec.Created}, CreatedBy: "hack/image", Comment: "files: " + dsts(spec.Files)},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = arch
	cf.OS = "linux"
	cf.Created = v1.Time{Time: spec.Created}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.User = spec.User
	cf.Config.Env = spec.Env
	cf.Config.WorkingDir = spec.WorkingDir
	cf.Config.Labels = spec.Labels
	if len(spec.Ports) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range spec.Ports {
			cf.Config.ExposedPorts[p] = struct{}{}
		}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

func dsts(files []File) string {
	var d []string
	for _, f := range files {
		d = append(d, f.Dst)
	}
	sort.Strings(d)
	return strings.Join(d, " ")
}

// layerTar writes files, and the directories above them, into a tar in path order,
// owned by root, all stamped with created.
func layerTar(files []File, created time.Time) ([]byte, error) {
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Dst < sorted[j].Dst })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range sorted {
		if err := writeParents(tw, dirs, path.Dir(f.Dst), created); err != nil {
			return nil, err
		}
		if err := writeFile(tw, f, created); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close layer: %w", err)
	}
	return buf.Bytes(), nil
}

func writeParents(tw *tar.Writer, done map[string]bool, dir string, created time.Time) error {
	if dir == "/" || done[dir] {
		return nil
	}
	if err := writeParents(tw, done, path.Dir(dir), created); err != nil {
		return err
	}
	done[dir] = true
	return tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeDir,
		Name:     strings.TrimPrefix(dir, "/") + "/",
		Mode:     0o755,
		ModTime:  created,
		Format:   tar.FormatPAX,
	})
}

func writeFile(tw *tar.Writer, f File, created time.Time) error {
	in, err := os.Open(f.Src)
	if err != nil {
		return fmt.Errorf("file %s: %w", f.Src, err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return fmt.Errorf("file %s: %w", f.Src, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("file %s: not a regular file", f.Src)
	}
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     strings.TrimPrefix(f.Dst, "/"),
		Mode:     f.Mode,
		Size:     st.Size(),
		ModTime:  created,
		Format:   tar.FormatPAX,
	}); err != nil {
		return fmt.Errorf("file %s: %w", f.Src, err)
	}
	if _, err := io.Copy(tw, in); err != nil {
		return fmt.Errorf("file %s: %w", f.Src, err)
	}
	return nil
}
