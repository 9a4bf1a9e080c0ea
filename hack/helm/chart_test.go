package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v4/pkg/action"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

var (
	repoDir      = filepath.Join("..", "..")
	chartPath    = filepath.Join(repoDir, "charts", "config-watcher")
	manifestsDir = filepath.Join(repoDir, "manifests")
)

// testKey is a digest key as the chart takes it: 32 bytes, base64.
const testKey = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="

// variant is one install, as kustomize builds it (a kustomization under manifests/, its
// components, and patches) and as the chart renders it (values).
type variant struct {
	name       string
	base       string   // under manifests/
	components []string // under manifests/
	patches    string   // kustomize patches: entries, if any
	values     map[string]any
}

// variants are every install the kustomize manifests offer, and the chart's values for each.
var variants = []variant{
	{name: "namespaced", base: "."},
	{name: "cluster-wide", base: "cluster-wide", values: map[string]any{"clusterWide": map[string]any{"enabled": true}}},
	{name: "secrets", base: ".", components: []string{"secrets"}, values: map[string]any{
		"secrets": map[string]any{"enabled": true, "digestKey": map[string]any{"existingSecret": "config-watcher-digest-key"}}}},
	{name: "cluster-wide-secrets", base: "cluster-wide", components: []string{"cluster-wide/secrets"}, values: map[string]any{
		"clusterWide": map[string]any{"enabled": true},
		"secrets":     map[string]any{"enabled": true, "digestKey": map[string]any{"existingSecret": "config-watcher-digest-key"}}}},
	{name: "monitoring", base: ".", components: []string{"monitoring"}, values: map[string]any{"monitoring": map[string]any{"enabled": true}}},
	// The single-replica install docs/deployment.md describes: no PodDisruptionBudget.
	{name: "no-pdb", base: ".", patches: `- patch: |-
    $patch: delete
    apiVersion: policy/v1
    kind: PodDisruptionBudget
    metadata:
      name: config-watcher
`, values: map[string]any{"podDisruptionBudget": map[string]any{"enabled": false}}},
}

// TestChartRendersTheKustomizeObjects ensures the chart and kustomize give the same
// objects for every variant: same kinds, names, namespaces and fields, the order of every
// list included (an adoption applying env or volumes in another order would roll the
// pods), but for the labels Helm adds to metadata.
func TestChartRendersTheKustomizeObjects(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			want := normalize(t, kustomize(t, v))
			rel, err := render(chartPath, v.values)
			require.NoError(t, err)
			got := normalize(t, []byte(rel.Manifest))
			assert.Equal(t, keys(want), keys(got), "objects")
			for k, w := range want {
				if g, ok := got[k]; ok {
					assert.Equal(t, w, g, k)
				}
			}
		})
	}
}

// kustomize builds a variant as the release does (hack/image): in the namespace default.
func kustomize(t *testing.T, v variant) []byte {
	t.Helper()
	tmp := t.TempDir()
	rel := func(dir string) string {
		abs, err := filepath.Abs(filepath.Join(manifestsDir, dir))
		require.NoError(t, err)
		p, err := filepath.Rel(tmp, abs)
		require.NoError(t, err)
		return filepath.ToSlash(p)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: default\nresources:\n- " + rel(v.base) + "\n"
	if len(v.components) > 0 {
		k += "components:\n"
		for _, c := range v.components {
			k += "- " + rel(c) + "\n"
		}
	}
	if v.patches != "" {
		k += "patches:\n" + v.patches
	}
	require.NoError(t, os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(k), 0o644))
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), tmp)
	require.NoError(t, err)
	y, err := m.AsYaml()
	require.NoError(t, err)
	return y
}

// helmLabels are the labels the chart adds to metadata beside the kustomize install's.
var helmLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version", "helm.sh/chart"}

// normalize reads a multi-document manifest into objects by kind/namespace/name, each as
// YAML with Helm's labels removed.
func normalize(t *testing.T, manifest []byte) map[string]string {
	t.Helper()
	objs := map[string]string{}
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var o map[string]any
		err := d.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if o == nil {
			continue
		}
		md, _ := o["metadata"].(map[string]any)
		if labels, ok := md["labels"].(map[string]any); ok {
			for _, l := range helmLabels {
				delete(labels, l)
			}
		}
		key := fmt.Sprintf("%s/%v/%v", o["kind"], md["namespace"], md["name"])
		require.NotContains(t, objs, key, "rendered twice")
		y, err := yaml.Marshal(o)
		require.NoError(t, err)
		objs[key] = string(y)
	}
	return objs
}

func keys(m map[string]string) []string {
	k := make([]string, 0, len(m))
	for key := range m {
		k = append(k, key)
	}
	slices.Sort(k)
	return k
}

// TestChartLintsForEveryVariant ensures `helm lint --strict` finds nothing in the chart
// with each variant's values, a digest key of its own included.
func TestChartLintsForEveryVariant(t *testing.T) {
	all := append(slices.Clone(variants), variant{name: "secrets-key", values: map[string]any{
		"secrets": map[string]any{"enabled": true, "digestKey": map[string]any{"key": testKey}}}})
	for _, v := range all {
		t.Run(v.name, func(t *testing.T) {
			l := action.NewLint()
			l.Strict = true
			l.Namespace = releaseNamespace
			l.KubeVersion = kubeVersion
			res := l.Run([]string{chartPath}, v.values)
			for _, m := range res.Messages {
				t.Log(m)
			}
			assert.Empty(t, res.Errors)
		})
	}
}
