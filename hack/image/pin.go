package main

// `image pin` is `make pin-images`: every image the repository names but does
// not build, in manifests/, the Dockerfile and docker-compose.yaml, pinned to
// the digest its tag names in the registry now (crane digest), written to
// hack/images.lock, then to each reference as name:tag@sha256:… (the Helm
// chart's values.yaml: its image's digest:, beside its tag:). The tags
// stay where they are written; the digests have one place of truth, the lock,
// and one writer, this command; TestImagesNameTheLockedDigests keeps every
// reference equal to the lock.

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// lockFile is the one place of the digests, relative to the repository.
const lockFile = "hack/images.lock"

const lockHeader = `# The digest each image tag the repository names (manifests/, Dockerfile, docker-compose.yaml,
# the chart's values.yaml)
# pointed to when ` + "`make pin-images`" + ` last ran: name:tag, then its digest. Written by that target
# only (hack/image/pin.go), which then writes each reference as name:tag@digest; the release
# workflow runs it before make release. Change a tag where it is written, then run it.
`

// pinned are the files whose image references are pinned, relative to the
// repository; manifests/ is walked for *.yaml.
var pinnedFiles = []string{"Dockerfile", "docker-compose.yaml", chartValues}

// chartValues are the Helm chart's defaults: an image is a repository:,
// tag: and digest: line each, in that order (the release's packaged chart
// overrides the controller's and the ambassador's digests; a chart
// installed from the source tree names the digests written here).
const chartValues = "charts/config-watcher/values.yaml"

// ownImage is built by the repository: make release pins it by the index's
// digest, and docker compose builds it.
const ownImage = "ghcr.io/k8spatterns/config-watcher"

var (
	// An image: line of a manifest or of docker-compose.yaml; compose's
	// ${VAR:-default} names the default.
	imageLine = regexp.MustCompile(`^(\s*(?:- )?image:\s*)(\S+)\s*$`)
	// A Dockerfile's FROM, with the flags before the image and the stage name after.
	fromLine = regexp.MustCompile(`^(FROM\s+(?:--\S+\s+)*)(\S+)(.*)$`)
	argLine  = regexp.MustCompile(`^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)\s*$`)
	// An entry of a kustomization's images: its name, then newTag, then a digest.
	kustomizeName   = regexp.MustCompile(`^(\s*)- name:\s*(\S+)\s*$`)
	kustomizeTag    = regexp.MustCompile(`^\s+newTag:\s*(\S+)\s*$`)
	kustomizeDigest = regexp.MustCompile(`^\s+digest:\s*(\S+)\s*$`)
	// An image of the chart's values: repository:, tag:, then digest: ("" for none).
	valuesRepository = regexp.MustCompile(`^(\s*)repository:\s*(\S+)\s*$`)
	valuesTag        = regexp.MustCompile(`^\s+tag:\s*"?([^"\s]*)"?\s*$`)
	valuesDigest     = regexp.MustCompile(`^(\s+digest:\s*)"?([^"\s]*)"?\s*$`)
	composeDefault   = regexp.MustCompile(`^\$\{([A-Za-z_][A-Za-z0-9_]*):-(.+)\}$`)
	variable         = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)
)

// pinFunc is given each reference of a file (name:tag, variables replaced
// by their defaults) and the digest it carries ("" if none) and returns the
// digest to write ("" for none).
type pinFunc func(ref, digest string) (string, error)

// editRefs rewrites each third-party image reference of the file path (its
// content in b) with the digest pin returns.
func editRefs(path string, b []byte, pin pinFunc) ([]byte, error) {
	lines := strings.SplitAfter(string(b), "\n")
	args := map[string]string{} // a Dockerfile's ARG defaults so far
	dockerfile := filepath.Base(path) == "Dockerfile"
	kustomization := filepath.Base(path) == "kustomization.yaml"
	values := strings.HasSuffix(filepath.ToSlash(path), chartValues)
	var out []string
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		body, nl := strings.CutSuffix(line, "\n")
		suffix := ""
		if nl {
			suffix = "\n"
		}
		switch {
		case dockerfile && argLine.MatchString(body):
			m := argLine.FindStringSubmatch(body)
			args[m[1]] = m[2]
		case dockerfile && fromLine.MatchString(body):
			m := fromLine.FindStringSubmatch(body)
			text, err := pinText(m[2], func(s string) string {
				return variable.ReplaceAllStringFunc(s, func(v string) string { return args[variable.FindStringSubmatch(v)[1]] })
			}, pin)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
			}
			line = m[1] + text + m[3] + suffix
		case !dockerfile && imageLine.MatchString(body):
			m := imageLine.FindStringSubmatch(body)
			text, err := pinText(m[2], func(s string) string { return s }, pin)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
			}
			line = m[1] + text + suffix
		case kustomization && kustomizeName.MatchString(body) && i+1 < len(lines) && kustomizeTag.MatchString(strings.TrimSuffix(lines[i+1], "\n")):
			name := kustomizeName.FindStringSubmatch(body)[2]
			tagLine := lines[i+1]
			tag := kustomizeTag.FindStringSubmatch(strings.TrimSuffix(tagLine, "\n"))[1]
			indent := kustomizeName.FindStringSubmatch(body)[1] + "  "
			old, skip := "", 2
			if i+2 < len(lines) && kustomizeDigest.MatchString(strings.TrimSuffix(lines[i+2], "\n")) {
				old, skip = kustomizeDigest.FindStringSubmatch(strings.TrimSuffix(lines[i+2], "\n"))[1], 3
			}
			out = append(out, line, tagLine)
			if !strings.HasSuffix(tagLine, "\n") {
				out[len(out)-1] += "\n"
			}
			digest := old
			if name != ownImage {
				var err error
				if digest, err = pin(name+":"+tag, old); err != nil {
					return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
				}
			}
			if digest != "" {
				out = append(out, indent+"digest: "+digest+"\n")
			}
			i += skip - 1
			continue
		case values && i+2 < len(lines) && valuesRepository.MatchString(body) &&
			valuesTag.MatchString(strings.TrimSuffix(lines[i+1], "\n")) && valuesDigest.MatchString(strings.TrimSuffix(lines[i+2], "\n")):
			name := valuesRepository.FindStringSubmatch(body)[2]
			tag := valuesTag.FindStringSubmatch(strings.TrimSuffix(lines[i+1], "\n"))[1]
			digestLine, nl2 := strings.CutSuffix(lines[i+2], "\n")
			m := valuesDigest.FindStringSubmatch(digestLine)
			out = append(out, line, lines[i+1])
			i += 2
			if name == ownImage || tag == "" { // built here; its tag is the chart's appVersion
				out = append(out, lines[i])
				continue
			}
			digest, err := pin(name+":"+tag, m[2])
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, i-1, err)
			}
			if digest == "" {
				digest = `""`
			}
			line = m[1] + digest
			if nl2 {
				line += "\n"
			}
		}
		out = append(out, line)
	}
	return []byte(strings.Join(out, "")), nil
}

// pinText is text (an image reference as written, maybe compose's
// ${VAR:-default}) with the digest pin returns for it; expand replaces the
// variables a Dockerfile's reference holds.
func pinText(text string, expand func(string) string, pin pinFunc) (string, error) {
	quote := ""
	if len(text) > 1 && (text[0] == '"' || text[0] == '\'') && text[len(text)-1] == text[0] {
		quote, text = text[:1], text[1:len(text)-1]
	}
	prefix, ref, end := "", text, ""
	if m := composeDefault.FindStringSubmatch(text); m != nil {
		prefix, ref, end = "${"+m[1]+":-", m[2], "}"
	}
	ref, old, _ := strings.Cut(ref, "@")
	concrete := expand(ref)
	name, _ := splitTag(concrete)
	if strings.Contains(concrete, "$") || name == ownImage {
		return quote + text + quote, nil // built here, or named by a variable: not pinned
	}
	if !strings.Contains(concrete[strings.LastIndex(concrete, "/")+1:], ":") {
		return "", fmt.Errorf("image %s names no tag to pin", concrete)
	}
	digest, err := pin(concrete, old)
	if err != nil {
		return "", err
	}
	if digest != "" {
		ref += "@" + digest
	}
	return quote + prefix + ref + end + quote, nil
}

// splitTag splits name:tag (a registry's port is part of the name).
func splitTag(ref string) (name, tag string) {
	slash := strings.LastIndex(ref, "/")
	if colon := strings.LastIndex(ref, ":"); colon > slash {
		return ref[:colon], ref[colon+1:]
	}
	return ref, ""
}

// pinnedPaths are the files of repo whose image references are pinned.
func pinnedPaths(repo string) ([]string, error) {
	var paths []string
	err := filepath.WalkDir(filepath.Join(repo, "manifests"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") {
			paths = append(paths, p)
		}
		return err
	})
	for _, f := range pinnedFiles {
		paths = append(paths, filepath.Join(repo, f))
	}
	return paths, err
}

// imageRefs are the references (name:tag) of the pinned files of repo, each
// with the digest it carries ("" if none).
func imageRefs(repo string) (map[string][]string, error) {
	paths, err := pinnedPaths(repo)
	if err != nil {
		return nil, err
	}
	refs := map[string][]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		if _, err := editRefs(p, b, func(ref, digest string) (string, error) {
			if !slices.Contains(refs[ref], digest) {
				refs[ref] = append(refs[ref], digest)
			}
			return digest, nil
		}); err != nil {
			return nil, err
		}
	}
	return refs, nil
}

// readLock reads repo's hack/images.lock: name:tag → digest.
func readLock(repo string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(repo, lockFile))
	if err != nil {
		return nil, err
	}
	lock := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || !sha256Digest.MatchString(f[1]) {
			return nil, fmt.Errorf("%s:%d: want name:tag sha256:<64 hex digits>, got %q", lockFile, i+1, line)
		}
		lock[f[0]] = f[1]
	}
	return lock, nil
}

// pinImages resolves every reference of repo's pinned files with crane,
// writes the lock, then every reference; it changes nothing unless every
// digest was resolved.
func pinImages(repo, crane string) error {
	refs, err := imageRefs(repo)
	if err != nil {
		return err
	}
	lock := map[string]string{}
	for ref := range refs {
		out, err := exec.Command(crane, "digest", ref).Output()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(exit.Stderr))
		}
		if err != nil {
			return fmt.Errorf("crane digest %s: %w", ref, err)
		}
		digest := strings.TrimSpace(string(out))
		if !sha256Digest.MatchString(digest) {
			return fmt.Errorf("crane digest %s: %q is no sha256 digest", ref, digest)
		}
		lock[ref] = digest
	}
	names := make([]string, 0, len(lock))
	for ref := range lock {
		names = append(names, ref)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(lockHeader)
	for _, ref := range names {
		fmt.Fprintf(&b, "%s %s\n", ref, lock[ref])
	}
	if err := os.WriteFile(filepath.Join(repo, lockFile), []byte(b.String()), 0o644); err != nil {
		return err
	}
	paths, err := pinnedPaths(repo)
	if err != nil {
		return err
	}
	for _, p := range paths {
		old, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		pinned, err := editRefs(p, old, func(ref, _ string) (string, error) { return lock[ref], nil })
		if err != nil {
			return err
		}
		if !bytes.Equal(pinned, old) {
			if err := os.WriteFile(p, pinned, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// runPin is `image pin`.
func runPin(args []string) error {
	fs := flag.NewFlagSet("image pin", flag.ContinueOnError)
	repo := fs.String("repo", "", "the repository's root")
	crane := fs.String("crane", "crane", "crane, which resolves a tag to its digest")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 || *repo == "" {
		return errors.New("usage: image pin -repo DIR [-crane PATH]")
	}
	return pinImages(*repo, *crane)
}
