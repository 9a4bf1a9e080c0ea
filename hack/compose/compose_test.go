package compose

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repo is the repository's root, seen from this package's directory.
const repo = "../.."

// The profiles `docker compose` is run with: none, and --profile sandbox.
const (
	noProfile = ""
	sandbox   = "sandbox"
)

// loadProject loads docker-compose.yaml as `docker compose [--profile PROFILE] config`
// does: the Compose specification's schema, interpolation, normalization, profiles and
// the consistency of depends_on. Offline (no remote include or extends is fetched), and
// with no variable from this process's environment and no .env file, so that what is
// checked is the file with the defaults it writes, whoever runs the test.
func loadProject(profile string) (*types.Project, error) {
	var profiles []string
	if profile != noProfile {
		profiles = []string{profile}
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(repo, "docker-compose.yaml")},
		cli.WithWorkingDirectory(repo),
		cli.WithProfiles(profiles),
	)
	if err != nil {
		return nil, fmt.Errorf("compose options: %w", err)
	}
	return opts.LoadProject(context.Background())
}

// load is loadProject for the checks. Its error is TestComposeFileLoads's to report:
// compose-go's can be long (an interpolation error quotes the whole value).
func load(t *testing.T, profile string) *types.Project {
	t.Helper()
	p, err := loadProject(profile)
	if err != nil {
		t.Fatalf("docker-compose.yaml does not load (%s): TestComposeFileLoads says why", profileName(profile))
	}
	return p
}

// TestComposeFileLoads ensures that the file is valid Compose, without a profile and
// with the profile sandbox: what `docker compose config` checks.
func TestComposeFileLoads(t *testing.T) {
	for _, profile := range []string{noProfile, sandbox} {
		t.Run(profileName(profile), func(t *testing.T) {
			p, err := loadProject(profile)
			require.NoError(t, err, "docker-compose.yaml does not load (%s)", profileName(profile))
			assert.NotEmpty(t, p.Services, "no service is enabled")
		})
	}
}

// A check is one thing the schema cannot know, for the profiles it concerns. It
// returns what it found wrong, each problem a sentence; nothing when all is well.
type check struct {
	name     string
	profiles []string
	problems func(t *testing.T, p *types.Project) []string
}

var checks = []check{{
	name:     "UpWithoutAProfileStartsTheControllerAlone",
	profiles: []string{noProfile},
	problems: func(_ *testing.T, p *types.Project) []string {
		return want("services", serviceNames(p), []string{"config-watcher"})
	},
}, {
	name:     "ControllerIsHardened",
	profiles: []string{noProfile, sandbox},
	problems: func(_ *testing.T, p *types.Project) []string {
		s, ok := p.Services["config-watcher"]
		if !ok {
			return []string{"no service config-watcher"}
		}
		var bad []string
		if s.User != "65532:65532" {
			bad = append(bad, fmt.Sprintf("config-watcher: user %q, want 65532:65532 (non-root, the distroless image's nonroot)", s.User))
		}
		if !s.ReadOnly {
			bad = append(bad, "config-watcher: read_only is not true")
		}
		if !slices.Contains(s.CapDrop, "ALL") {
			bad = append(bad, fmt.Sprintf("config-watcher: cap_drop %q lacks ALL", s.CapDrop))
		}
		if !slices.Contains(s.SecurityOpt, "no-new-privileges:true") {
			bad = append(bad, fmt.Sprintf("config-watcher: security_opt %q lacks no-new-privileges:true", s.SecurityOpt))
		}
		if s.Privileged {
			bad = append(bad, "config-watcher: privileged")
		}
		return bad
	},
}, {
	name:     "ControllerReachesTheAmbassadorOnTheHostsLoopback",
	profiles: []string{noProfile, sandbox},
	problems: func(_ *testing.T, p *types.Project) []string {
		s, ok := p.Services["config-watcher"]
		if !ok {
			return []string{"no service config-watcher"}
		}
		var bad []string
		if s.NetworkMode != "host" {
			bad = append(bad, fmt.Sprintf("config-watcher: network_mode %q, want host (the ambassador is on the host's loopback)", s.NetworkMode))
		}
		if got := env(s, "API_URL"); got != "http://localhost:8001" {
			bad = append(bad, fmt.Sprintf("config-watcher: API_URL %q, want http://localhost:8001", got))
		}
		if got := env(s, "HTTP_ADDR"); !strings.HasPrefix(got, "127.0.0.1:") {
			bad = append(bad, fmt.Sprintf("config-watcher: HTTP_ADDR %q, want 127.0.0.1:PORT (on the host network, any other address is open to the network)", got))
		}
		return bad
	},
}, {
	name:     "SandboxHasItsServices",
	profiles: []string{sandbox},
	problems: func(_ *testing.T, p *types.Project) []string {
		return want("services", serviceNames(p), []string{"ambassador", "config-watcher", "demo", "k3s", "setup"})
	},
}, {
	name:     "SandboxPublishesOnlyTheAmbassadorOnTheHostsLoopback",
	profiles: []string{sandbox},
	problems: func(_ *testing.T, p *types.Project) []string {
		var published []string
		for _, name := range serviceNames(p) {
			for _, port := range p.Services[name].Ports {
				ip := port.HostIP
				if ip == "" {
					ip = "every interface"
				}
				published = append(published, fmt.Sprintf("%s %s on %s", name, port.Published, ip))
			}
		}
		return want("published ports", published, []string{"ambassador 8001 on 127.0.0.1"})
	},
}, {
	name:     "OnlyK3sIsPrivileged",
	profiles: []string{sandbox},
	problems: func(_ *testing.T, p *types.Project) []string {
		var privileged []string
		for _, name := range serviceNames(p) {
			if p.Services[name].Privileged {
				privileged = append(privileged, name)
			}
		}
		return want("privileged services", privileged, []string{"k3s"})
	},
}, {
	name:     "SandboxStartsInOrder",
	profiles: []string{sandbox},
	problems: func(_ *testing.T, p *types.Project) []string {
		var bad []string
		for _, d := range []struct{ service, on, condition string }{
			{"config-watcher", "ambassador", types.ServiceConditionHealthy},
			{"ambassador", "setup", types.ServiceConditionCompletedSuccessfully},
			{"setup", "k3s", types.ServiceConditionHealthy},
			{"demo", "ambassador", types.ServiceConditionHealthy},
		} {
			if got := p.Services[d.service].DependsOn[d.on].Condition; got != d.condition {
				bad = append(bad, fmt.Sprintf("%s waits for %s until %q, want %q", d.service, d.on, got, d.condition))
			}
		}
		return bad
	},
}, {
	name:     "SandboxRunsTheKubectlImageOfManifests",
	profiles: []string{sandbox},
	problems: func(t *testing.T, p *types.Project) []string {
		var images []string
		for _, s := range p.Services {
			if strings.HasPrefix(s.Image, "registry.k8s.io/kubectl") {
				images = append(images, s.Image)
			}
		}
		slices.Sort(images)
		return want("kubectl images", slices.Compact(images), manifestsKubectlImages(t))
	},
}, {
	name:     "OneShotScriptsParseAndPassShellcheck",
	profiles: []string{sandbox},
	problems: func(t *testing.T, p *types.Project) []string {
		var bad []string
		for _, name := range []string{"setup", "demo"} {
			bad = append(bad, scriptProblems(t, name, p.Services[name])...)
		}
		return bad
	},
}}

// TestComposeFile runs every check on docker-compose.yaml, for each profile it concerns.
func TestComposeFile(t *testing.T) {
	for _, c := range checks {
		for _, profile := range c.profiles {
			t.Run(c.name+"/"+profileName(profile), func(t *testing.T) {
				for _, problem := range c.problems(t, load(t, profile)) {
					t.Error(problem)
				}
			})
		}
	}
}

// TestEveryCheckHasAViolation ensures that each check can fail: on the loaded file,
// changed in the one way the check is about, it reports a problem.
func TestEveryCheckHasAViolation(t *testing.T) {
	violations := map[string]func(p *types.Project){
		"UpWithoutAProfileStartsTheControllerAlone": func(p *types.Project) {
			p.Services["k3s"] = types.ServiceConfig{Name: "k3s"}
		},
		"ControllerIsHardened": func(p *types.Project) {
			edit(p, "config-watcher", func(s *types.ServiceConfig) { s.ReadOnly = false })
		},
		"ControllerReachesTheAmbassadorOnTheHostsLoopback": func(p *types.Project) {
			edit(p, "config-watcher", func(s *types.ServiceConfig) {
				addr := "0.0.0.0:8080"
				s.Environment["HTTP_ADDR"] = &addr
			})
		},
		"SandboxHasItsServices": func(p *types.Project) { delete(p.Services, "demo") },
		"SandboxPublishesOnlyTheAmbassadorOnTheHostsLoopback": func(p *types.Project) {
			edit(p, "ambassador", func(s *types.ServiceConfig) { s.Ports[0].HostIP = "" })
		},
		"OnlyK3sIsPrivileged": func(p *types.Project) {
			edit(p, "setup", func(s *types.ServiceConfig) { s.Privileged = true })
		},
		"SandboxStartsInOrder": func(p *types.Project) {
			edit(p, "ambassador", func(s *types.ServiceConfig) {
				s.DependsOn["setup"] = types.ServiceDependency{Condition: types.ServiceConditionStarted}
			})
		},
		"SandboxRunsTheKubectlImageOfManifests": func(p *types.Project) {
			edit(p, "demo", func(s *types.ServiceConfig) { s.Image = "registry.k8s.io/kubectl:v1.0.0" })
		},
		"OneShotScriptsParseAndPassShellcheck": func(p *types.Project) {
			edit(p, "demo", func(s *types.ServiceConfig) { s.Command[0] += "\nif true; then\n" })
		},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			violate, ok := violations[c.name]
			require.True(t, ok, "no violation for the check %s: add one", c.name)
			p := load(t, c.profiles[0])
			violate(p)
			assert.NotEmpty(t, c.problems(t, p), "the check reports nothing on a file that violates it")
		})
	}
}

// scriptProblems checks the bash script of a one-shot service, which runs as
// `bash -euo pipefail -c SCRIPT` (entrypoint and command): it must parse and pass
// shellcheck. The loader has already turned the file's $$ into $.
func scriptProblems(t *testing.T, name string, s types.ServiceConfig) []string {
	t.Helper()
	if len(s.Entrypoint) == 0 || s.Entrypoint[0] != "bash" || s.Entrypoint[len(s.Entrypoint)-1] != "-c" || len(s.Command) == 0 {
		return []string{fmt.Sprintf("%s: entrypoint %q and command are not bash -c SCRIPT", name, s.Entrypoint)}
	}
	script := filepath.Join(t.TempDir(), name+".sh")
	require.NoError(t, os.WriteFile(script, []byte(s.Command[0]), 0o600))
	if out, err := exec.Command("bash", "-n", script).CombinedOutput(); err != nil {
		return []string{fmt.Sprintf("%s: bash -n: %v\n%s", name, err, out)}
	}
	shellcheck, err := exec.LookPath("shellcheck")
	require.NoError(t, err, "shellcheck is not installed (apt-get install shellcheck; .ci/run installs it)")
	if out, err := exec.Command(shellcheck, "-s", "bash", script).CombinedOutput(); err != nil {
		return []string{fmt.Sprintf("%s: shellcheck: %v\n%s", name, err, out)}
	}
	return nil
}

// kubectlImage is an image line of registry.k8s.io/kubectl in kustomize's YAML.
var kubectlImage = regexp.MustCompile(`(?m)^ *image: *(registry\.k8s\.io/kubectl:.*)$`)

// manifestsKubectlImages is the kubectl image manifests/ deploys as the ambassador,
// from `kubectl kustomize manifests`: kustomize applies the images: of the
// kustomization, which is where the tag is set. Without kubectl, the test is skipped.
func manifestsKubectlImages(t *testing.T) []string {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: cannot render manifests/ to compare the kubectl image")
	}
	cmd := exec.Command(kubectl, "kustomize", filepath.Join(repo, "manifests"))
	cmd.Env = append(os.Environ(), "KUBECONFIG=/dev/null")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "kubectl kustomize manifests: %s", stderr.String())
	var images []string
	for _, m := range kubectlImage.FindAllStringSubmatch(string(out), -1) {
		images = append(images, strings.TrimSpace(m[1]))
	}
	require.NotEmpty(t, images, "kubectl kustomize manifests: no registry.k8s.io/kubectl image")
	slices.Sort(images)
	return slices.Compact(images)
}

// want compares a sorted list with the one expected, as a problem that says both.
func want(what string, got, expected []string) []string {
	if slices.Equal(got, expected) {
		return nil
	}
	return []string{fmt.Sprintf("%s: %q, want %q", what, got, expected)}
}

func serviceNames(p *types.Project) []string {
	return slices.Sorted(maps.Keys(p.Services))
}

// env is a service's environment variable, "" when unset.
func env(s types.ServiceConfig, name string) string {
	if v := s.Environment[name]; v != nil {
		return *v
	}
	return ""
}

// edit changes one service of a loaded project (Services holds values, not pointers).
func edit(p *types.Project, name string, change func(*types.ServiceConfig)) {
	s := p.Services[name]
	change(&s)
	p.Services[name] = s
}

func profileName(profile string) string {
	if profile == noProfile {
		return "no-profile"
	}
	return "profile-" + profile
}
