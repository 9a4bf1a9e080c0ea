package manifests

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// secretsRules are what the secrets component adds: no `get` (the controller never
// reads one Secret by name), no `patch` (nothing is written on a Secret); `create` makes
// the ConfigMap that holds a Secret's state.
var secretsRules = []string{" configmaps create", " secrets list", " secrets watch"}

// What the secrets component adds to the controller's pod: the setting, and the digest
// key mounted read-only where DIGEST_KEY_FILE points by default
// (/etc/config-watcher/digest-key/key), from a Secret the pod waits for (not optional).
var (
	secretsEnv = obj{"name": "WATCH_SECRETS", "value": "true"}
	keyMount   = obj{"name": "digest-key", "mountPath": "/etc/config-watcher/digest-key", "readOnly": true}
	// 0400 (256): the key's file is no one's but the controller's (fsGroup).
	keyVolume = obj{"name": "digest-key", "secret": obj{
		"secretName":  "config-watcher-digest-key",
		"defaultMode": float64(0o400),
		"items":       []any{obj{"key": "key", "path": "key", "mode": float64(0o400)}},
		"optional":    false,
	}}
)

// secretsBuilds are the builds that include a secrets component, each with the
// build it extends and the kind of role the component adds to; every other build
// grants nothing on secrets.
var secretsBuilds = []struct{ dir, without, kind string }{
	{"testdata/secrets", ".", "Role"},
	{"testdata/cluster-wide-secrets", "cluster-wide", "ClusterRole"},
}

// eachGrant calls f for every apiGroup, resource and verb the rules of the objects
// of kind grant.
func eachGrant(objs []obj, kind string, f func(group, resource, verb string)) {
	for _, o := range objs {
		if o["kind"] != kind {
			continue
		}
		for _, r := range list(o, "rules") {
			names := "" // a rule limited by resourceNames: "verb @name,..."
			if n := strs(list(r, "resourceNames")); len(n) > 0 {
				names = " @" + strings.Join(n, ",")
			}
			for _, g := range strs(list(r, "apiGroups")) {
				for _, res := range strs(list(r, "resources")) {
					for _, v := range strs(list(r, "verbs")) {
						f(g, res, v+names)
					}
				}
			}
		}
	}
}

// grants expands the rules of every object of kind into "apiGroup resource verb", sorted.
func grants(objs []obj, kind string) []string {
	var out []string
	eachGrant(objs, kind, func(g, res, v string) { out = append(out, g+" "+res+" "+v) })
	slices.Sort(out)
	return out
}

// checkNoSecrets reports any Role or ClusterRole rule that reaches secrets, by name or
// by wildcard: listing or watching them returns their data as surely as `get` does.
func checkNoSecrets(objs []obj) []string {
	var bad []string
	for _, kind := range []string{"Role", "ClusterRole"} {
		eachGrant(objs, kind, func(g, res, v string) {
			if (g == "" || g == "*") && (res == "secrets" || res == "*" || strings.HasPrefix(res, "secrets/")) {
				bad = append(bad, fmt.Sprintf("%s grants %q on %q in group %q", kind, v, res, g))
			}
		})
	}
	return bad
}

// TestNoBuildButTheSecretsOnesGrantsSecrets ensures every kustomization under manifests/
// (each a build a user may apply) grants nothing on secrets unless it is one of
// secretsBuilds, so that a new overlay cannot make Secrets readable unnoticed.
func TestNoBuildButTheSecretsOnesGrantsSecrets(t *testing.T) {
	found := map[string]bool{}
	require.NoError(t, filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "kustomization.yaml" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		if strings.Contains(string(b), "\nkind: Component\n") {
			return nil // not a build: only what includes it is
		}
		found[dir] = true
		if slices.ContainsFunc(secretsBuilds, func(s struct{ dir, without, kind string }) bool { return s.dir == dir }) {
			return nil
		}
		t.Run(dir, func(t *testing.T) {
			assert.Empty(t, checkNoSecrets(render(t, dir)))
		})
		return nil
	}))
	for _, dir := range []string{".", "demo", "cluster-wide"} {
		assert.True(t, found[dir], "build %s not found: the walk missed it", dir)
	}
	for _, s := range secretsBuilds {
		assert.True(t, found[s.dir], "secrets build %s does not exist", s.dir)
	}
}

// TestSecretsComponentAddsItsRulesSettingAndKeyOnly ensures each build with a secrets
// component renders exactly as the build it extends, except for list and watch on
// secrets and create on configmaps in the role that component is for, WATCH_SECRETS=true
// on the controller and the digest key mounted into it; and that its pod is hardened
// like every other.
func TestSecretsComponentAddsItsRulesSettingAndKeyOnly(t *testing.T) {
	for _, s := range secretsBuilds {
		t.Run(s.dir, func(t *testing.T) {
			with, without := render(t, s.dir), render(t, s.without)
			for _, kind := range []string{"Role", "ClusterRole"} {
				want := grants(without, kind)
				if kind == s.kind {
					want = append(want, secretsRules...)
					slices.Sort(want)
				}
				assert.Equal(t, want, grants(with, kind), "%s rules", kind)
			}
			assert.NotEmpty(t, checkNoSecrets(with), "the check sees the component's rule")
			for _, c := range containerChecks {
				assert.Empty(t, c.fn(with), c.name)
			}
			assert.Equal(t, withoutRules(t, without), withoutRules(t, withoutSecretsPod(t, with)),
				"the component changes nothing but rules, WATCH_SECRETS and the key")
		})
	}
}

// withoutSecretsPod is a copy of objs without what the secrets component adds to the
// controller's pod; it fails the test if any of that is missing.
func withoutSecretsPod(t *testing.T, objs []obj) []obj {
	t.Helper()
	out := deepCopy(t, objs)
	c := container(t, out, "config-watcher")
	c["env"] = removeOne(t, list(c, "env"), secretsEnv, "env")
	c["volumeMounts"] = removeOne(t, list(c, "volumeMounts"), keyMount, "volumeMounts")
	if len(list(c, "volumeMounts")) == 0 {
		delete(c, "volumeMounts")
	}
	spec := podSpec(t, out, "config-watcher")
	spec["volumes"] = removeOne(t, list(spec, "volumes"), keyVolume, "volumes")
	sc := spec["securityContext"].(map[string]any)
	require.Equal(t, float64(65532), sc["fsGroup"], "the key's group is the controller's")
	delete(sc, "fsGroup")
	return out
}

// removeOne is l without its one element equal to want.
func removeOne(t *testing.T, l []any, want obj, what string) []any {
	t.Helper()
	i := slices.IndexFunc(l, func(v any) bool { return reflect.DeepEqual(v, want) })
	require.GreaterOrEqual(t, i, 0, "%s lacks %v: %v", what, want, l)
	return slices.Delete(slices.Clone(l), i, i+1)
}

// withoutRules is a copy of objs with the rules of every role left out.
func withoutRules(t *testing.T, objs []obj) []obj {
	t.Helper()
	out := deepCopy(t, objs)
	for _, o := range out {
		delete(o, "rules")
	}
	return out
}
