package main

import (
	"fmt"
	"maps"
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
	RunName     string            `yaml:"run-name"`
	On          map[string]any    `yaml:"on"`
	Permissions any               `yaml:"permissions"`
	Jobs        map[string]job    `yaml:"jobs"`
	Env         map[string]string `yaml:"env"`
}

type job struct {
	If          string            `yaml:"if"`
	Needs       any               `yaml:"needs"`
	RunsOn      any               `yaml:"runs-on"`
	Environment any               `yaml:"environment"`
	Permissions any               `yaml:"permissions"`
	Env         map[string]string `yaml:"env"`
	Outputs     map[string]string `yaml:"outputs"`
	Steps       []step            `yaml:"steps"`
}

type step struct {
	ID   string            `yaml:"id"`
	Uses string            `yaml:"uses"`
	Run  string            `yaml:"run"`
	With map[string]string `yaml:"with"`
	Env  map[string]string `yaml:"env"`
}

var (
	makeTarget = regexp.MustCompile(`\bmake ([a-z0-9-]+)`)
	repoPath   = regexp.MustCompile(`\b(?:hack|\.ci|dist|manifests|docs)/[A-Za-z0-9._/-]*[A-Za-z0-9_]`)
	// An action by the commit its version's tag names (a tag can be moved to
	// other code); the version stays in a comment on the line.
	pinnedUses = regexp.MustCompile(`^[\w.-]+/[\w./-]+@[0-9a-f]{40}$`)
	usesLine   = regexp.MustCompile(`(?m)^\s*(?:- )?uses:\s*(\S+)(.*)$`)
	goRun      = regexp.MustCompile(`go run ([\w./-]+)@(v[\w.-]+)`)
	// A build runs code of the repository or of a module: a make target, the go
	// command building or running code, or a script.
	buildCommand = regexp.MustCompile(`\bmake [a-z0-9-]+|\bgo (?:run|build|install|generate|test)\b|[\w./-]+\.sh\b`)
	// craneRelease is the prebuilt crane of a go-containerregistry release.
	craneRelease = regexp.MustCompile(`go-containerregistry/releases/download/(v[\w.-]+)/go-containerregistry_Linux_x86_64\.tar\.gz`)
)

// distFiles is what hack/release.sh writes into dist/.
func distFiles() []string {
	files := []string{ociLayoutFile, ctrArchiveFile, chartLayoutFile, sbomFile, sumsFile}
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
				bad = append(bad, fmt.Sprintf("job %s: %q is not pinned to a commit", name, s.Uses))
			}
			if strings.HasPrefix(s.Uses, "actions/checkout@") && s.With["persist-credentials"] != "false" {
				bad = append(bad, fmt.Sprintf("job %s: %s keeps the token in .git/config (persist-credentials: false)", name, s.Uses))
			}
		}
	}
	for _, m := range usesLine.FindAllStringSubmatch(string(data), -1) {
		if !regexp.MustCompile(`^\s*# v\d+\.\d+\.\d+$`).MatchString(m[2]) {
			bad = append(bad, fmt.Sprintf("%s: no version comment (# vX.Y.Z) beside the commit", m[1]))
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
		for _, m := range craneRelease.FindAllStringSubmatch(text, -1) {
			if m[1] != moduleVersion("github.com/google/go-containerregistry") {
				bad = append(bad, fmt.Sprintf("crane of go-containerregistry %s: the release tests use %s", m[1], moduleVersion("github.com/google/go-containerregistry")))
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
	require.Len(t, files, 3, "ci.yml, node.yml and release.yml")
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
		{"ActionOnABranch", "uses: actions/setup-go@main # v5.6.0", `job j: "actions/setup-go@main" is not pinned to a commit`},
		{"ActionOnAMovableTag", "uses: actions/setup-go@v5 # v5.6.0", `job j: "actions/setup-go@v5" is not pinned to a commit`},
		{"CommitWithoutItsVersion", "uses: actions/setup-go@40f1582b2485089dde7abd97c1529aa768e1baff", "no version comment"},
		{"CheckoutKeepsCredentials", "uses: actions/checkout@11d5960a326750d5838078e36cf38b85af677262 # v4.4.0", "persist-credentials: false"},
		{"OtherCrane", "run: go run github.com/google/go-containerregistry/cmd/crane@v0.1.0 push", "github.com/google/go-containerregistry/cmd/crane@v0.1.0"},
		{"OtherPrebuiltCrane", "run: curl -O https://github.com/google/go-containerregistry/releases/download/v0.1.0/go-containerregistry_Linux_x86_64.tar.gz", "crane of go-containerregistry v0.1.0"},
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
	require.NotEmpty(t, versions)
	for _, v := range versions {
		assert.Equal(t, string(m[1]), v, "every job of release.yml that sets up Go")
	}
}

// readWorkflow parses .github/workflows/name.
func readWorkflow(t *testing.T, name string) workflow {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, ".github", "workflows", name))
	require.NoError(t, err)
	var wf workflow
	require.NoError(t, yaml.Unmarshal(data, &wf))
	return wf
}

// selfHosted reports whether a job's runs-on asks for a self-hosted runner.
func selfHosted(j job) bool { return slices.Contains(labels(j), "self-hosted") }

// labels returns the runner labels a job's runs-on asks for.
func labels(j job) []string {
	switch r := j.RunsOn.(type) {
	case string:
		return []string{r}
	case []any:
		var out []string
		for _, l := range r {
			out = append(out, fmt.Sprint(l))
		}
		return out
	}
	return nil
}

const (
	// nodeEnvironment is the GitHub environment whose required reviewers
	// approve each run of the self-hosted job.
	nodeEnvironment = "node-e2e"
	// ephemeralLabel is carried only by runners that take one job and are
	// discarded with their machine (CONTRIBUTING.md, "CI").
	ephemeralLabel = "ephemeral"
	// approvedCommit is the one ref the self-hosted job may check out: a
	// pull request's head by hash, as the labelled event saw it (the run's
	// name shows it to the reviewer), else the pushed or dispatched commit.
	approvedCommit = "${{ github.event.pull_request.head.sha || github.sha }}"
)

// rootJobProblems lists how a workflow lets a pull request's code or
// workflow run on a self-hosted runner (as root) without a maintainer, or
// on a runner that outlives the job.
func rootJobProblems(wf workflow) []string {
	var bad []string
	for name, j := range wf.Jobs {
		if !selfHosted(j) {
			continue
		}
		if _, ok := wf.On["pull_request"]; ok {
			bad = append(bad, "job "+name+": a self-hosted job in a workflow a pull_request triggers runs the pull request's copy of it")
		}
		if _, ok := wf.On["pull_request_target"]; ok && !strings.Contains(j.If, "github.event.label.name == '") {
			bad = append(bad, "job "+name+": pull_request_target without a maintainer's label in its if")
		}
		if !strings.Contains(j.If, "vars.CW_SELF_HOSTED_NODE == 'true'") {
			bad = append(bad, "job "+name+": runs without CW_SELF_HOSTED_NODE")
		}
		if j.Environment != nodeEnvironment {
			bad = append(bad, fmt.Sprintf("job %s: environment %v, not %s: no reviewer approves the run", name, j.Environment, nodeEnvironment))
		}
		if !slices.Contains(labels(j), ephemeralLabel) {
			bad = append(bad, fmt.Sprintf("job %s: runs-on %v lacks %q: a runner that outlives the job could take it", name, labels(j), ephemeralLabel))
		}
		if !strings.Contains(wf.RunName, "github.event.pull_request.head.sha") {
			bad = append(bad, "job "+name+": the run's name does not show the reviewer the commit they approve")
		}
		for _, s := range j.Steps {
			if strings.HasPrefix(s.Uses, "actions/checkout@") && s.With["ref"] != approvedCommit {
				bad = append(bad, fmt.Sprintf("job %s: checks out %q, not %s", name, s.With["ref"], approvedCommit))
			}
		}
	}
	return bad
}

// goCacheProblems lists the setup-go steps that restore or save a Go
// cache: a cache another workflow's run wrote (main's, by any pull request
// merged or tested) would feed the build of a signed release or a root job.
func goCacheProblems(wf workflow) []string {
	var bad []string
	for name, j := range wf.Jobs {
		for _, s := range j.Steps {
			if strings.HasPrefix(s.Uses, "actions/setup-go@") && s.With["cache"] != "false" {
				bad = append(bad, fmt.Sprintf("job %s: setup-go without cache: false", name))
			}
		}
	}
	return bad
}

// TestReleaseAndNodeJobsRestoreNoGoCache ensures every setup-go of
// release.yml and node.yml sets cache: false, and that the check sees a
// step that does not.
func TestReleaseAndNodeJobsRestoreNoGoCache(t *testing.T) {
	for _, name := range []string{"release.yml", "node.yml"} {
		wf := readWorkflow(t, name)
		assert.Empty(t, goCacheProblems(wf), name)
		for jobName, j := range wf.Jobs {
			for i, s := range j.Steps {
				if strings.HasPrefix(s.Uses, "actions/setup-go@") {
					broken := readWorkflow(t, name)
					delete(broken.Jobs[jobName].Steps[i].With, "cache")
					assert.NotEmpty(t, goCacheProblems(broken), "%s: job %s's setup-go with the default cache", name, jobName)
				}
			}
		}
	}
}

// TestContributingSaysHowToRegisterAnEphemeralRunner ensures CONTRIBUTING.md
// names the label and the environment node.yml asks for, and both ways to
// register a runner that takes one job: --ephemeral and a just-in-time
// configuration.
func TestContributingSaysHowToRegisterAnEphemeralRunner(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "CONTRIBUTING.md"))
	require.NoError(t, err)
	for _, want := range []string{"`" + ephemeralLabel + "`", "`" + nodeEnvironment + "`", "--ephemeral", "generate-jitconfig", "--jitconfig"} {
		assert.True(t, strings.Contains(string(doc), want), "CONTRIBUTING.md does not say %s", want)
	}
}

// TestNodeJobNeverRunsAPullRequestsWorkflow ensures the self-hosted, root
// e2e-node job runs for a push to main, a manual run, or a pull request a
// maintainer labelled (this file as main has it), never from a workflow a
// pull request triggers; that each run waits for a reviewer of the
// environment node-e2e, tests the commit its name shows by hash, on a runner
// labelled ephemeral; and that the check sees each way of breaking that.
func TestNodeJobNeverRunsAPullRequestsWorkflow(t *testing.T) {
	found := 0
	for _, name := range []string{"ci.yml", "node.yml", "release.yml"} {
		wf := readWorkflow(t, name)
		assert.Empty(t, rootJobProblems(wf), name)
		for _, j := range wf.Jobs {
			if selfHosted(j) {
				found++
			}
		}
	}
	require.Equal(t, 1, found, "one self-hosted job: e2e-node")
	node := readWorkflow(t, "node.yml")
	assert.ElementsMatch(t, []string{"push", "workflow_dispatch", "pull_request_target"}, slices.Collect(maps.Keys(node.On)))

	broken := readWorkflow(t, "node.yml")
	broken.On["pull_request"] = nil
	assert.NotEmpty(t, rootJobProblems(broken), "a pull_request trigger")
	broken = readWorkflow(t, "node.yml")
	j := broken.Jobs["e2e-node"]
	j.If = "vars.CW_SELF_HOSTED_NODE == 'true'"
	broken.Jobs["e2e-node"] = j
	assert.NotEmpty(t, rootJobProblems(broken), "no label required")
	for _, tc := range []struct {
		name   string
		mutate func(wf *workflow, j *job)
	}{
		{"no environment", func(_ *workflow, j *job) { j.Environment = nil }},
		{"a persistent runner", func(_ *workflow, j *job) { j.RunsOn = []any{"self-hosted", "linux", "cgroup-v1"} }},
		{"the pull request's branch", func(_ *workflow, j *job) {
			j.Steps[0].With["ref"] = "${{ github.event.pull_request.head.ref || github.sha }}"
		}},
		{"a run name without the commit", func(wf *workflow, _ *job) { wf.RunName = "node e2e" }},
	} {
		broken := readWorkflow(t, "node.yml")
		j := broken.Jobs["e2e-node"]
		tc.mutate(&broken, &j)
		broken.Jobs["e2e-node"] = j
		assert.NotEmpty(t, rootJobProblems(broken), tc.name)
	}
}

// permissions returns the write scopes of p (a map of scope → level, or a
// string such as write-all), sorted.
func writes(p any) []string {
	var out []string
	switch p := p.(type) {
	case string:
		if p != "read-all" && p != "" {
			out = append(out, p)
		}
	case map[string]any:
		for scope, level := range p {
			if level == "write" {
				out = append(out, scope)
			}
		}
	}
	slices.Sort(out)
	return out
}

// builds returns what in a job builds or runs code of the repository or of a
// module: a make target, go run (or build, install, generate, test), a
// script, in a step or in an environment variable a step expands; and a
// checkout, which puts the repository's code on disk to be run.
func builds(j job) []string {
	var texts []string
	for _, v := range j.Env {
		texts = append(texts, v)
	}
	var out []string
	for _, s := range j.Steps {
		texts = append(texts, s.Run)
		for _, v := range s.Env {
			texts = append(texts, v)
		}
		if strings.HasPrefix(s.Uses, "actions/checkout@") {
			out = append(out, "a checkout")
		}
	}
	for _, text := range texts {
		out = append(out, buildCommand.FindAllString(text, -1)...)
	}
	return out
}

// TestReleaseSplitsBuildFromPublish ensures release.yml grants nothing at the
// top, builds in a job that may write nothing, and holds contents, packages
// and id-token write in one job that builds nothing (no make, go run or
// script, no checkout) and installs a pinned cosign; and that the check
// counts go run and a script as builds.
func TestReleaseSplitsBuildFromPublish(t *testing.T) {
	wf := readWorkflow(t, "release.yml")
	assert.Empty(t, writes(wf.Permissions), "no permission for every job")
	var writers []string
	for name, j := range wf.Jobs {
		w := writes(j.Permissions)
		if j.Permissions == nil {
			w = []string{"(the defaults)"}
		}
		switch {
		case len(w) == 0:
			continue
		case len(builds(j)) > 0:
			assert.Failf(t, "a build job may write", "job %s builds (%v) with %v", name, builds(j), w)
		}
		writers = append(writers, name)
		assert.Equal(t, []string{"contents", "id-token", "packages"}, w, "job %s", name)
		var cosign string
		for _, s := range j.Steps {
			if strings.HasPrefix(s.Uses, "sigstore/cosign-installer@") {
				cosign = s.With["cosign-release"]
			}
		}
		assert.Regexp(t, `^v\d+\.\d+\.\d+$`, cosign, "job %s: cosign-installer without a pinned cosign-release", name)
	}
	assert.Equal(t, []string{"publish"}, writers, "one job holds the write permissions")

	for _, run := range []string{
		"go run github.com/google/go-containerregistry/cmd/crane@v0.22.1 push",
		"bash hack/changelog.sh v1", "./hack/anything.sh", "make release",
	} {
		assert.NotEmpty(t, builds(job{Steps: []step{{Run: run}}}), "%q is a build", run)
		assert.NotEmpty(t, builds(job{Env: map[string]string{"TOOL": run}, Steps: []step{{Run: "$TOOL"}}}), "%q in an environment variable is a build", run)
	}
	assert.Empty(t, builds(job{Steps: []step{{Run: "tools/crane push --index bin/oci x"}, {Uses: "actions/download-artifact@x"}}}))
}

// TestReleasePublishesWithACheckedPrebuiltCrane ensures crane comes
// prebuilt, from the go-containerregistry release the release tests use,
// checked against a pinned checksum in a job that holds no permission and
// checks out nothing, and that the publish job checks the binary against
// that job's output before it runs it: no build of crane where the write
// permissions are, and no binary another job could have swapped.
func TestReleasePublishesWithACheckedPrebuiltCrane(t *testing.T) {
	wf := readWorkflow(t, "release.yml")
	var fetcher string
	for name, j := range wf.Jobs {
		for _, s := range j.Steps {
			if !craneRelease.MatchString(s.Run) {
				continue
			}
			fetcher = name
			assert.NotNil(t, j.Permissions, "job %s: the default permissions", name)
			assert.Empty(t, writes(j.Permissions), "job %s downloads crane with write permissions", name)
			assert.Empty(t, builds(j), "job %s builds", name)
			assert.Regexp(t, `echo "[0-9a-f]{64}  crane\.tar\.gz" \| sha256sum -c -`, s.Run, "job %s: the tarball against a pinned checksum", name)
			assert.Contains(t, s.Run, "$GITHUB_OUTPUT", "job %s: the binary's hash as its output", name)
			assert.Equal(t, "${{ steps."+s.ID+".outputs.sha256 }}", j.Outputs["sha256"], "job %s outputs the hash", name)
		}
	}
	require.NotEmpty(t, fetcher, "no job downloads crane prebuilt")
	require.NotEqual(t, "publish", fetcher)

	publish := wf.Jobs["publish"]
	assert.Contains(t, fmt.Sprint(publish.Needs), fetcher)
	checked := false
	for _, s := range publish.Steps {
		if s.Env["CRANE_SHA256"] == "${{ needs."+fetcher+".outputs.sha256 }}" && strings.Contains(s.Run, `sha256sum -c -`) {
			checked = true
		}
		if strings.Contains(s.Run, "tools/crane ") && !strings.Contains(s.Run, "sha256sum") {
			assert.True(t, checked, "publish runs crane before it checks the binary")
		}
	}
	assert.True(t, checked, "publish never checks crane against the hash of job %s", fetcher)
}

// TestReleaseVerifiesTheAmbassadorsSignatureBeforeRelease ensures the build
// job, after make pin-images and before make release, has cosign (pinned)
// verify the signature of the ambassador's digest hack/images.lock holds,
// with the identity and issuer of Kubernetes' release process, not just any
// signature.
func TestReleaseVerifiesTheAmbassadorsSignatureBeforeRelease(t *testing.T) {
	build := readWorkflow(t, "release.yml").Jobs["build"]
	verify := regexp.MustCompile(`cosign verify "registry\.k8s\.io/kubectl@\$digest" \\\s+` +
		`--certificate-identity krel-trust@k8s-releng-prod\.iam\.gserviceaccount\.com \\\s+` +
		`--certificate-oidc-issuer https://accounts\.google\.com\b`)
	cosign, pinned := false, false
	for _, s := range build.Steps {
		if strings.HasPrefix(s.Uses, "sigstore/cosign-installer@") {
			assert.Regexp(t, `^v\d+\.\d+\.\d+$`, s.With["cosign-release"], "a pinned cosign")
			cosign = true
		}
		if strings.Contains(s.Run, "make pin-images") {
			pinned = true
		}
		require.NotContains(t, s.Run, "make release", "make release runs before cosign verified the ambassador's digest")
		if !verify.MatchString(s.Run) {
			continue
		}
		require.True(t, cosign, "cosign verify before cosign is installed")
		require.True(t, pinned, "cosign verifies a digest make pin-images has not written yet")
		assert.Contains(t, s.Run, `digest="$(awk -v ref="registry.k8s.io/kubectl:$tag" '$1 == ref { print $2 }' hack/images.lock)"`,
			"the digest verified is the one hack/images.lock holds")
		return
	}
	t.Fatal("the build job verifies no signature of the ambassador's digest with Kubernetes' release identity")
}

// TestReleasePinsEveryImageBeforeMakeRelease ensures the release's build
// job runs make pin-images with the crane the crane job checked (its hash
// checked first, as the publish job does) before make release, and then
// checks that the install files name every image by digest: a published
// bundle names no image by its tag alone.
func TestReleasePinsEveryImageBeforeMakeRelease(t *testing.T) {
	build := readWorkflow(t, "release.yml").Jobs["build"]
	assert.Contains(t, fmt.Sprint(build.Needs), "crane")
	checked, pinned, released := false, false, false
	for _, s := range build.Steps {
		switch {
		case s.Env["CRANE_SHA256"] == "${{ needs.crane.outputs.sha256 }}" && strings.Contains(s.Run, `sha256sum -c -`):
			checked = true
		case strings.Contains(s.Run, "make pin-images"):
			assert.True(t, checked, "make pin-images runs crane before its hash is checked")
			assert.Contains(t, s.Run, `CRANE="$PWD/tools/crane"`, "the checked crane")
			pinned = true
		case strings.Contains(s.Run, "make release"):
			assert.True(t, pinned, "make release runs before make pin-images")
			released = true
		case strings.Contains(s.Run, "TestDistNamesEveryImageByDigest"):
			assert.True(t, released, "the install files are checked before make release writes them")
			assert.Contains(t, s.Run, `CW_DIST="$GITHUB_WORKSPACE/dist"`)
			return
		}
	}
	t.Fatal("the build job never checks that the install files name every image by digest")
}

// TestVerifyCommandNamesTheExactIdentity ensures docs/deployment.md's cosign
// verify names the release workflow of one tag exactly: an unanchored
// regexp would take a certificate of any workflow whose identity merely
// contains it (a fork's, another repository's).
func TestVerifyCommandNamesTheExactIdentity(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "deployment.md"))
	require.NoError(t, err)
	text := string(doc)
	assert.False(t, strings.Contains(text, "--certificate-identity-regexp"), "docs/deployment.md: an identity regexp")
	assert.True(t, strings.Contains(text, "--certificate-identity https://github.com/k8spatterns/config-watcher/.github/workflows/release.yml@refs/tags/vX.Y.Z"), "docs/deployment.md: the exact identity")
	assert.True(t, strings.Contains(text, "--certificate-oidc-issuer https://token.actions.githubusercontent.com"), "docs/deployment.md: the issuer")
}
