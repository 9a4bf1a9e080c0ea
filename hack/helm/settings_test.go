package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// docSettings are the variables of docs/settings.md's table, in its order.
func docSettings(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoDir, "docs", "settings.md"))
	require.NoError(t, err)
	var names []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Z][A-Z0-9_]*)` \\|").FindAllSubmatch(doc, -1) {
		names = append(names, string(m[1]))
	}
	require.NotEmpty(t, names, "no table in docs/settings.md")
	return names
}

// envName is the variable of a settings value: maxUnavailable is MAX_UNAVAILABLE (the
// template's `snakecase | upper`).
func envName(key string) string {
	var b strings.Builder
	for i, r := range key {
		if unicode.IsUpper(r) && i > 0 {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// TestValuesAreTheSettingsOfTheDoc ensures values.yaml's settings and values.schema.json's
// are docs/settings.md's, both ways and in its order: a setting added to one only fails.
func TestValuesAreTheSettingsOfTheDoc(t *testing.T) {
	want := docSettings(t)

	raw, err := os.ReadFile(filepath.Join(chartPath, "values.yaml"))
	require.NoError(t, err)
	// A yaml.v3 node keeps the keys' order, which a map loses.
	var values struct {
		Settings yamlv3.Node `yaml:"settings"`
	}
	require.NoError(t, yamlv3.Unmarshal(raw, &values))
	var got []string
	for i := 0; i < len(values.Settings.Content); i += 2 {
		got = append(got, envName(values.Settings.Content[i].Value))
	}
	assert.Equal(t, want, got, "values.yaml settings, as variables")

	raw, err = os.ReadFile(filepath.Join(chartPath, "values.schema.json"))
	require.NoError(t, err)
	var schema struct {
		Properties struct {
			Settings struct {
				Properties map[string]any `json:"properties"`
			} `json:"settings"`
		} `json:"properties"`
	}
	require.NoError(t, json.Unmarshal(raw, &schema))
	var inSchema []string
	for k := range schema.Properties.Settings.Properties {
		inSchema = append(inSchema, envName(k))
	}
	assert.ElementsMatch(t, want, inSchema, "values.schema.json settings, as variables")
}

// samples are a valid value of each setting, other than its default.
var samples = map[string]any{
	"watchNamespace": "a,b", "leaseNamespace": "a", "apiUrl": "http://127.0.0.1:8002",
	"selectorAnnotation": "example.com/selector", "httpAddr": ":9090", "logFormat": "text",
	"logLevel": "debug", "podName": "p", "podNamespace": "n", "podUid": "u",
	"namespaceSelector": "team=a", "podOptInLabel": "restart=yes", "recordHash": false,
	"watchSecrets": false, "digestKeyFile": "/key", "workers": 8, "shutdownTimeout": "5s",
	"restartStrategy": "evict", "maxUnavailable": "50%", "minReadySeconds": 30,
	"progressDeadline": "5m", "maxConcurrentRestarts": 3, "settle": "2s", "stormChanges": 7,
	"stormWindow": "2m", "maxRestartsPerSecond": 20, "dryRun": true, "podIndex": false,
	"events": false, "leaderElect": false, "leaseName": "cw", "leaseDuration": "20s",
	"renewDeadline": "12s", "retryPeriod": "3s",
}

// TestEverySettingReachesTheController ensures each setting given as a value becomes the
// controller's variable with that value, in place of what the chart wires.
func TestEverySettingReachesTheController(t *testing.T) {
	for _, name := range docSettings(t) {
		t.Run(name, func(t *testing.T) {
			var key string
			for k := range samples {
				if envName(k) == name {
					key = k
				}
			}
			require.NotEmpty(t, key, "no sample value for %s", name)
			rel, err := render(chartPath, map[string]any{"settings": map[string]any{key: samples[key]}})
			require.NoError(t, err)
			env := controllerEnv(t, rel.Manifest)
			assert.Equal(t, map[string]any{"name": name, "value": toEnv(samples[key])}, env[name])
		})
	}
}

func toEnv(v any) string {
	b, _ := json.Marshal(v)
	return strings.Trim(string(b), `"`)
}

// controllerEnv is the config-watcher container's env, by name.
func controllerEnv(t *testing.T, manifest string) map[string]any {
	t.Helper()
	d := deployment(t, manifest)
	env := map[string]any{}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "config-watcher" {
			for _, e := range c.Env {
				env[e["name"].(string)] = e
			}
		}
	}
	return env
}

type deploymentObject struct {
	Spec struct {
		Template struct {
			Spec struct {
				Containers []struct {
					Name string           `json:"name"`
					Env  []map[string]any `json:"env"`
				} `json:"containers"`
				Volumes []map[string]any `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

// deployment is the Deployment of a rendered manifest.
func deployment(t *testing.T, manifest string) deploymentObject {
	t.Helper()
	for _, doc := range strings.Split(manifest, "\n---") {
		if strings.Contains(doc, "\nkind: Deployment\n") {
			var d deploymentObject
			require.NoError(t, yaml.Unmarshal([]byte(doc), &d))
			return d
		}
	}
	t.Fatal("no Deployment rendered")
	return deploymentObject{}
}
