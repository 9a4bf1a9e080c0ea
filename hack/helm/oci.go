package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/registry"
)

// ociLayout writes the packaged chart tgz as an OCI image layout in a tar,
// config-watcher-chart.oci.tar in out, and returns its path: the manifest Helm's
// registry client pushes for `helm push` (its media types, its config, its annotations;
// registry.Client.Push), with created at modTime instead of now, so that the same chart
// gives the same bytes. The release workflow pushes it with crane, which sends the
// manifest as it is: the chart the registry serves is this one.
func ociLayout(tgz string, modTime time.Time, out string) (string, error) {
	data, err := os.ReadFile(tgz)
	if err != nil {
		return "", err
	}
	ch, err := loader.LoadArchive(bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("load %s: %w", tgz, err)
	}
	meta := ch.Metadata
	config, err := json.Marshal(meta)
	if err != nil {
		return "", err
	}
	// The chart's own annotations, then Helm's from its metadata over them.
	annotations := map[string]string{}
	for k, v := range meta.Annotations {
		annotations[k] = v
	}
	for k, v := range map[string]string{
		ocispec.AnnotationCreated:     modTime.UTC().Format(time.RFC3339),
		ocispec.AnnotationDescription: meta.Description,
		ocispec.AnnotationTitle:       meta.Name,
		ocispec.AnnotationVersion:     meta.Version,
		ocispec.AnnotationURL:         meta.Home,
	} {
		if strings.TrimSpace(v) != "" {
			annotations[k] = v
		}
	}
	if len(meta.Sources) > 0 && strings.TrimSpace(meta.Sources[0]) != "" {
		annotations[ocispec.AnnotationSource] = meta.Sources[0]
	}
	var authors []string
	for _, m := range meta.Maintainers {
		a := m.Name
		if m.Email != "" {
			a += " (" + m.Email + ")"
		}
		authors = append(authors, a)
	}
	if len(authors) > 0 {
		annotations[ocispec.AnnotationAuthors] = strings.Join(authors, ", ")
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned:   specs.Versioned{SchemaVersion: 2},
		Config:      descriptor(registry.ConfigMediaType, config),
		Layers:      []ocispec.Descriptor{descriptor(registry.ChartLayerMediaType, data)},
		Annotations: annotations,
	})
	if err != nil {
		return "", err
	}
	manifestDesc := descriptor(ocispec.MediaTypeImageManifest, manifest)
	manifestDesc.Annotations = map[string]string{ocispec.AnnotationRefName: meta.Version}
	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manifestDesc},
	})
	if err != nil {
		return "", err
	}
	layoutFile, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return "", err
	}

	// Directories first (tar -x and the release tests make no parents), then the files.
	type file struct {
		name string
		body []byte // nil: a directory
	}
	files := []file{{"blobs/", nil}, {"blobs/sha256/", nil}, {"oci-layout", layoutFile}, {"index.json", index}}
	for _, b := range [][]byte{config, data, manifest} {
		files = append(files, file{"blobs/sha256/" + digest.FromBytes(b).Encoded(), b})
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f.body)), ModTime: modTime, Format: tar.FormatPAX}
		if f.body == nil {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			return "", err
		}
		if _, err := tw.Write(f.body); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	path := filepath.Join(out, meta.Name+"-chart.oci.tar")
	return path, os.WriteFile(path, buf.Bytes(), 0o644)
}

func descriptor(mediaType string, b []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
}

// runPull is `helm pull --version V oci://…` as a user's `helm install` fetches the chart
// (Helm's chart downloader and registry client, the tag the version names), writing the
// .tgz into -o and printing its path.
func runPull(args []string) error {
	fs := flag.NewFlagSet("helm pull", flag.ContinueOnError)
	plainHTTP := fs.Bool("plain-http", false, "HTTP, not HTTPS: a registry on loopback")
	version := fs.String("version", "", "the chart's version (X.Y.Z)")
	out := fs.String("o", "", "directory to write the .tgz into")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || !strings.HasPrefix(fs.Arg(0), "oci://") || *version == "" || *out == "" {
		return errors.New("want -version X.Y.Z, -o DIR and one oci://REGISTRY/REPOSITORY")
	}
	opts := []registry.ClientOption{registry.ClientOptWriter(os.Stderr)}
	if *plainHTTP {
		opts = append(opts, registry.ClientOptPlainHTTP())
	}
	rc, err := registry.NewClient(opts...)
	if err != nil {
		return err
	}
	cfg := action.NewConfiguration()
	cfg.RegistryClient = rc
	p := action.NewPull(action.WithConfig(cfg))
	p.Settings = cli.New()
	p.Version = *version
	p.PlainHTTP = *plainHTTP
	p.DestDir = *out
	if msg, err := p.Run(fs.Arg(0)); err != nil {
		return fmt.Errorf("pull %s %s: %s%w", fs.Arg(0), *version, msg, err)
	}
	entries, err := filepath.Glob(filepath.Join(*out, "*.tgz"))
	if err != nil || len(entries) != 1 {
		return fmt.Errorf("pull wrote %v into %s, want one .tgz", entries, *out)
	}
	fmt.Println(entries[0])
	return nil
}
