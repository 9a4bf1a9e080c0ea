package main

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	release "helm.sh/helm/v4/pkg/release/v1"
)

// The release and namespace a render installs as: those of the kustomize install, whose
// objects are named config-watcher in the namespace default.
const (
	releaseName      = "config-watcher"
	releaseNamespace = "default"
)

// kubeVersion is the cluster a render assumes: the one the test suites run (README,
// "Install"); the chart asks for 1.35 or later.
var kubeVersion = &common.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}

// render is `helm template`: the chart with vals over its values.yaml, checked against its
// values.schema.json, as release releaseName in releaseNamespace, with no cluster.
func render(dir string, vals map[string]any) (*release.Release, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	in := action.NewInstall(action.NewConfiguration())
	in.DryRunStrategy = action.DryRunClient
	in.ReleaseName = releaseName
	in.Namespace = releaseNamespace
	in.Replace = true
	in.KubeVersion = kubeVersion
	r, err := in.Run(ch, vals)
	if err != nil {
		return nil, err
	}
	rel, ok := r.(*release.Release)
	if !ok {
		return nil, fmt.Errorf("render: a %T, not a v1 release", r)
	}
	return rel, nil
}

// The lines of values.yaml a release rewrites: the controller's image and the
// ambassador's digest. Anchored on the keys above them, so that a reordered values.yaml
// fails the release instead of pinning the wrong image.
var (
	imageBlock      = regexp.MustCompile(`(?m)^image:\n  repository: .*\n  tag: .*\n  digest: .*\n`)
	ambassadorBlock = regexp.MustCompile(`(?m)^(ambassador:\n  image:\n    repository: .*\n    tag: .*\n)    digest: .*\n`)
	sha256Digest    = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	semver          = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)
)

// pack is a release's chart: version vX.Y.Z as the chart's X.Y.Z and its appVersion, the
// image as image@digest (and the ambassador's by digest when one is given), every file
// dated at modTime so that the same commit gives the same bytes. It writes
// config-watcher-X.Y.Z.tgz into out and returns its path.
func pack(dir, version, image, digest, ambassadorDigest string, modTime time.Time, out string) (string, error) {
	if !semver.MatchString(version) {
		return "", fmt.Errorf("version %q: want vMAJOR.MINOR.PATCH", version)
	}
	if !sha256Digest.MatchString(digest) {
		return "", fmt.Errorf("digest %q: want sha256: and 64 lower-case hex digits", digest)
	}
	if ambassadorDigest != "" && !sha256Digest.MatchString(ambassadorDigest) {
		return "", fmt.Errorf("ambassador digest %q: want sha256: and 64 lower-case hex digits", ambassadorDigest)
	}
	if image == "" || strings.ContainsAny(image, "@ \n") {
		return "", fmt.Errorf("image %q: want a repository", image)
	}
	ch, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("load %s: %w", dir, err)
	}
	ch.Metadata.Version = strings.TrimPrefix(version, "v")
	ch.Metadata.AppVersion = version
	var values *common.File
	for _, f := range ch.Raw {
		if f.Name == chartutil.ValuesfileName {
			values = f
		}
	}
	if values == nil {
		return "", errors.New("the chart has no values.yaml")
	}
	data, err := replaceOnce(values.Data, imageBlock, fmt.Sprintf("image:\n  repository: %s\n  tag: %q\n  digest: %s\n", image, version, digest))
	if err != nil {
		return "", err
	}
	if ambassadorDigest != "" {
		if data, err = replaceOnce(data, ambassadorBlock, "${1}    digest: "+ambassadorDigest+"\n"); err != nil {
			return "", err
		}
	}
	values.Data = data
	if ch.Values, err = common.ReadValues(data); err != nil {
		return "", fmt.Errorf("values.yaml as released: %w", err)
	}
	ch.ModTime, ch.SchemaModTime = modTime, modTime
	for _, files := range [][]*common.File{ch.Raw, ch.Templates, ch.Files} {
		for _, f := range files {
			f.ModTime = modTime
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	return chartutil.Save(ch, out)
}

// replaceOnce replaces the one match of re in data, and fails on none or several.
func replaceOnce(data []byte, re *regexp.Regexp, with string) ([]byte, error) {
	if n := len(re.FindAllIndex(data, -1)); n != 1 {
		return nil, fmt.Errorf("values.yaml: %d matches of %s, want 1", n, re)
	}
	return re.ReplaceAll(data, []byte(with)), nil
}
