package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// The workflows cannot run here (make vet lints them with actionlint); these tests
// check that what they name exists: make targets, repository files, dist/ files, and
// that they use the tools and Go version the release was built and tested with.

const repoRoot = "../.."

type workflow struct {
	Jobs map[string]struct {
		Steps []struct {
			Uses string            `yaml:"uses"`
			Run  string            `yaml:"run"`
			With map[string]string `yaml:"with"`
		} `yaml:"steps"`
	} `yaml:"jobs"`
	Env map[string]string `yaml:"env"`
}

var (
	makeTarget = regexp.MustCompile(`\bmake ([a-z0-9-]+)`)
	repoPath   = regexp.MustCompile(`\b(?:hack|\.ci|dist|manifests|docs)/[A-Za-z0-9._/-]*[A-Za-z0-9_]`)
	pinnedUses = regexp.MustCompile(`^[\w.-]+/[\w./-]+@v\d+(\.\d+)*$`)
	goRun      = regexp.MustCompile(`go run ([\w./-]+)@(v[\w.-]+)`)
)

// distFiles is what hack/release.sh writes into dist/.
func distFiles() []string {
	files := []string{ociLayoutFile, ctrArchiveFile, sbomFile, sumsFile}
	for arch := range wantPlatforms {
		files = append(files, dockerArchiveFile(arch))
	}
	for _, in := range installs {
		files = append(files, in.file)
	}
	return files
}

// makeTargets are the targets the Makefile defines.
func makeTargets(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	require.NoError(t, err)
	var targets []string
	for _, m := range regexp.MustCompile(`(?m)^([a-z0-9-]+):`).FindAllStringSubmatch(string(data), -1) {
		targets = append(targets, m[1])
	}
	return targets
}

// workflowProblems lists what a workflow names that does not exist.
func workflowProblems(t *testing.T, data []byte, targets []string) []string {
	t.Helper()
	var wf workflow
	require.NoError(t, yaml.Unmarshal(data, &wf))
	require.NotEmpty(t, wf.Jobs)
	var texts []string
	for _, v := range wf.Env {
		texts = append(texts, v)
	}
	var bad []string
	for name, job := range wf.Jobs {
		for _, s := range job.Steps {
			texts = append(texts, s.Run)
			for _, v := range s.With {
				texts = append(texts, v)
			}
			if s.Uses != "" && !pinnedUses.MatchString(s.Uses) {
				bad = append(bad, fmt.Sprintf("job %s: %q is not pinned to a version", name, s.Uses))
			}
		}
	}
	for _, text := range texts {
		for _, m := range makeTarget.FindAllStringSubmatch(text, -1) {
			if !slices.Contains(targets, m[1]) {
				bad = append(bad, "no make target "+m[1])
			}
		}
		for _, p := range repoPath.FindAllString(text, -1) {
			if f, ok := strings.CutPrefix(p, "dist/"); ok {
				if !slices.Contains(distFiles(), f) {
					bad = append(bad, "make release writes no "+p)
				}
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot, p)); err != nil {
				bad = append(bad, "no file "+p)
			}
		}
		for _, m := range goRun.FindAllStringSubmatch(text, -1) {
			if strings.HasPrefix(m[1], "github.com/google/go-containerregistry/") && m[2] != moduleVersion("github.com/google/go-containerregistry") {
				bad = append(bad, fmt.Sprintf("%s@%s: the release tests use go-containerregistry %s", m[1], m[2], moduleVersion("github.com/google/go-containerregistry")))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

// TestWorkflowsNameWhatExists ensures every make target, repository file and dist/
// file the workflows name exists, every action is pinned to a version, and crane is
// the go-containerregistry the release tests push with.
func TestWorkflowsNameWhatExists(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot, ".github", "workflows", "*.yml"))
	require.NoError(t, err)
	require.Len(t, files, 2, "ci.yml and release.yml")
	targets := makeTargets(t)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			require.NoError(t, err)
			assert.Empty(t, workflowProblems(t, data, targets))
		})
	}
}

// TestWorkflowProblemsAreFound ensures the check above reports each kind of dangling
// name: a check that cannot fail is no check.
func TestWorkflowProblemsAreFound(t *testing.T) {
	tests := []struct{ name, step, want string }{
		{"MissingMakeTarget", "run: make relase", "no make target relase"},
		{"MissingScript", "run: bash hack/no-such.sh", "no file hack/no-such.sh"},
		{"MissingDistFile", "run: gh release upload v1 dist/install.yml", "make release writes no dist/install.yml"},
		{"ActionOnABranch", "uses: actions/checkout@main", `job j: "actions/checkout@main" is not pinned to a version`},
		{"OtherCrane", "run: go run github.com/google/go-containerregistry/cmd/crane@v0.1.0 push", "github.com/google/go-containerregistry/cmd/crane@v0.1.0"},
	}
	targets := makeTargets(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wf := "jobs:\n  j:\n    steps:\n    - " + tt.step + "\n"
			problems := workflowProblems(t, []byte(wf), targets)
			require.Len(t, problems, 1, "%v", problems)
			assert.Contains(t, problems[0], tt.want)
		})
	}
}

// TestReleaseBuildsWithTheDockerfilesGo ensures release.yml builds with exactly the Go
// version the Dockerfile names: the digests depend on it.
func TestReleaseBuildsWithTheDockerfilesGo(t *testing.T) {
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`).FindSubmatch(dockerfile)
	require.NotNil(t, m, "no ARG GO_VERSION in the Dockerfile")
	data, err := os.ReadFile(filepath.Join(repoRoot, ".github", "workflows", "release.yml"))
	require.NoError(t, err)
	var wf workflow
	require.NoError(t, yaml.Unmarshal(data, &wf))
	var versions []string
	for _, job := range wf.Jobs {
		for _, s := range job.Steps {
			if strings.HasPrefix(s.Uses, "actions/setup-go@") {
				versions = append(versions, s.With["go-version"])
			}
		}
	}
	assert.Equal(t, []string{string(m[1])}, versions)
}
