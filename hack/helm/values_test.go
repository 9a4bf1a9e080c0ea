package main

import (
	"archive/tar"
	"compress/gzip"
	"encoding/base64"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestChartRefusesBadValues ensures a wrong value fails the render (as it fails `helm
// install`) with a message naming what is wrong, before anything reaches a cluster.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values string
		want   string
	}{
		{"typo of a setting", `settings: {maxUnavalable: 1}`, "maxUnavalable"},
		{"typo at the top", `replica: 3`, "replica"},
		{"workers out of range", `settings: {workers: 0}`, "minimum"},
		{"workers not a number", `settings: {workers: many}`, "workers"},
		{"duration without a unit", `settings: {settle: "5"}`, "settle"},
		{"unknown log format", `settings: {logFormat: yaml}`, "logFormat"},
		{"unknown restart strategy", `settings: {restartStrategy: recreate}`, "restartStrategy"},
		{"budget with a blank", `settings: {maxUnavailable: "25 %"}`, "maxUnavailable"},
		{"boolean as a word", `settings: {dryRun: "yes"}`, "dryRun"},
		{"image digest not a digest", `image: {digest: latest}`, "digest"},
		{"short digest key", `secrets: {enabled: true, digestKey: {key: c2hvcnQ=}}`, "key"},
		{"Secrets without a key", `secrets: {enabled: true}`, "secrets.enabled needs the digest key"},
		{"ambassador argument not a flag", `ambassador: {extraArgs: [v2]}`, "extraArgs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vals map[string]any
			require.NoError(t, yaml.Unmarshal([]byte(tc.values), &vals))
			_, err := render(chartPath, vals)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestDigestKeyIsTheSameAtEveryRender ensures the Secret made from secrets.digestKey.key
// is the same object at every render (helm template, as Argo CD renders, included), is
// kept on uninstall and is the one the pod mounts; with an existing Secret named, the
// chart makes none and mounts that one.
func TestDigestKeyIsTheSameAtEveryRender(t *testing.T) {
	vals := map[string]any{"secrets": map[string]any{"enabled": true, "digestKey": map[string]any{"key": testKey}}}
	first, err := render(chartPath, vals)
	require.NoError(t, err)
	second, err := render(chartPath, vals)
	require.NoError(t, err)
	secret := func(manifest string) string {
		for _, doc := range strings.Split(manifest, "\n---") {
			if strings.Contains(doc, "\nkind: Secret\n") {
				return doc
			}
		}
		return ""
	}
	s := secret(first.Manifest)
	require.NotEmpty(t, s, "no Secret rendered")
	assert.Equal(t, s, secret(second.Manifest))
	assert.Contains(t, s, "key: "+`"`+b64(testKey)+`"`)
	assert.Contains(t, s, "helm.sh/resource-policy: keep")
	assert.Contains(t, mountedSecrets(t, first.Manifest), "config-watcher-digest-key")

	existing, err := render(chartPath, map[string]any{"secrets": map[string]any{"enabled": true,
		"digestKey": map[string]any{"existingSecret": "made-by-eso"}}})
	require.NoError(t, err)
	assert.Empty(t, secret(existing.Manifest))
	assert.Equal(t, []string{"made-by-eso"}, mountedSecrets(t, existing.Manifest))
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// mountedSecrets are the Secrets the Deployment's pod mounts.
func mountedSecrets(t *testing.T, manifest string) []string {
	var names []string
	for _, v := range deployment(t, manifest).Spec.Template.Spec.Volumes {
		if s, ok := v["secret"].(map[string]any); ok {
			names = append(names, s["secretName"].(string))
		}
	}
	return names
}

// TestEvictionIsGrantedWithTheEvictStrategy ensures restartStrategy evict grants
// `create` on pods/eviction, in the Role or, cluster-wide, the ClusterRole, and that the
// default grants it nowhere.
func TestEvictionIsGrantedWithTheEvictStrategy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"default", nil, ""},
		{"namespaced", map[string]any{"settings": map[string]any{"restartStrategy": "Evict"}}, "Role"},
		{"cluster-wide", map[string]any{"clusterWide": map[string]any{"enabled": true}, "settings": map[string]any{"restartStrategy": "evict"}}, "ClusterRole"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rel, err := render(chartPath, tc.values)
			require.NoError(t, err)
			var granted []string
			for _, doc := range strings.Split(rel.Manifest, "\n---") {
				var o struct {
					Kind  string `json:"kind"`
					Rules []struct {
						Resources []string `json:"resources"`
					} `json:"rules"`
				}
				require.NoError(t, yaml.Unmarshal([]byte(doc), &o))
				for _, r := range o.Rules {
					if len(r.Resources) == 1 && r.Resources[0] == "pods/eviction" {
						granted = append(granted, o.Kind)
					}
				}
			}
			if tc.want == "" {
				assert.Empty(t, granted)
			} else {
				assert.Equal(t, []string{tc.want}, granted)
			}
		})
	}
}

// TestChartFilesAreTheMonitoringComponents ensures the chart's copies of the
// PrometheusRule and the dashboard are manifests/monitoring's, byte for byte (hack/promcheck
// checks those): after a change there, copy the file into charts/config-watcher/files/.
func TestChartFilesAreTheMonitoringComponents(t *testing.T) {
	for _, f := range []string{"prometheusrule.yaml", "dashboard.json"} {
		want, err := os.ReadFile(filepath.Join(manifestsDir, "monitoring", f))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(chartPath, "files", f))
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), "charts/config-watcher/files/%s differs from manifests/monitoring/%s", f, f)
	}
}

// TestNotesSayHowToSeeItWork ensures NOTES.txt names the rollout to wait for and the
// change that shows the controller at work, in the namespace it acts in.
func TestNotesSayHowToSeeItWork(t *testing.T) {
	rel, err := render(chartPath, nil)
	require.NoError(t, err)
	assert.Contains(t, rel.Info.Notes, "kubectl rollout status -n default deployment/config-watcher")
	assert.Contains(t, rel.Info.Notes, "kubectl patch -n default configmap webapp-config")

	rel, err = render(chartPath, map[string]any{"clusterWide": map[string]any{"enabled": true}})
	require.NoError(t, err)
	assert.Contains(t, rel.Info.Notes, "config-watcher.k8spatterns.io/enabled=true")
}

// TestPackageIsTheRelease ensures the packaged chart carries the release's version and
// its image by digest, renders with them, and is the same bytes when packaged again.
func TestPackageIsTheRelease(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	amb := "sha256:" + strings.Repeat("cd", 32)
	when := time.Unix(1700000000, 0).UTC()
	a, err := pack(chartPath, "v1.2.3", "ghcr.io/fork/config-watcher", digest, amb, when, t.TempDir())
	require.NoError(t, err)
	b, err := pack(chartPath, "v1.2.3", "ghcr.io/fork/config-watcher", digest, amb, when, t.TempDir())
	require.NoError(t, err)
	assert.Equal(t, "config-watcher-1.2.3.tgz", filepath.Base(a))
	ab, err := os.ReadFile(a)
	require.NoError(t, err)
	bb, err := os.ReadFile(b)
	require.NoError(t, err)
	assert.Equal(t, ab, bb, "two packages of the same chart differ")

	files := untgz(t, a)
	assert.Contains(t, files["config-watcher/Chart.yaml"], "version: 1.2.3")
	assert.Contains(t, files["config-watcher/Chart.yaml"], "appVersion: v1.2.3")
	rel, err := render(a, nil)
	require.NoError(t, err)
	assert.Contains(t, rel.Manifest, `image: "ghcr.io/fork/config-watcher@`+digest+`"`)
	assert.Contains(t, rel.Manifest, `image: "registry.k8s.io/kubectl@`+amb+`"`)

	_, err = pack(chartPath, "1.2.3", "ghcr.io/fork/config-watcher", digest, "", when, t.TempDir())
	assert.ErrorContains(t, err, "vMAJOR")
	_, err = pack(chartPath, "v1.2.3", "ghcr.io/fork/config-watcher", "latest", "", when, t.TempDir())
	assert.ErrorContains(t, err, "digest")
}

// untgz is a chart archive's files by path.
func untgz(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	z, err := gzip.NewReader(f)
	require.NoError(t, err)
	files := map[string]string{}
	r := tar.NewReader(z)
	for {
		h, err := r.Next()
		if err == io.EOF {
			return files
		}
		require.NoError(t, err)
		b, err := io.ReadAll(r)
		require.NoError(t, err)
		files[h.Name] = string(b)
	}
}
