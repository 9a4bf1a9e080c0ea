package policy

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/watch"
)

// Pod specs reading webapp-config (or, for a Secret, webapp-secret) in each
// form.
const (
	specEnvFrom    = `{"containers":[{"name":"app","envFrom":[{"configMapRef":{"name":"webapp-config"}}]}]}`
	specVolume     = `{"volumes":[{"name":"cfg","configMap":{"name":"webapp-config"}}],"containers":[{"name":"app"}]}`
	specOther      = `{"containers":[{"name":"app","envFrom":[{"configMapRef":{"name":"other-config"}}]}]}`
	specNothing    = `{"containers":[{"name":"app"}]}`
	specInitOnly   = `{"initContainers":[{"name":"init","envFrom":[{"configMapRef":{"name":"webapp-config"}}]}],"containers":[{"name":"app"}]}`
	specEphemeral  = `{"containers":[{"name":"app"}],"ephemeralContainers":[{"name":"debug","envFrom":[{"configMapRef":{"name":"webapp-config"}}]}]}`
	specSecretEnv  = `{"containers":[{"name":"app","envFrom":[{"secretRef":{"name":"webapp-secret"}}]}]}`
	specSecretCMOf = `{"containers":[{"name":"app","envFrom":[{"configMapRef":{"name":"webapp-secret"}}]}]}`
)

// keyRef is a pod spec reading key of object kind ("configMap" or
// "secret") webapp-config or webapp-secret in form: "env", "volume" or
// "projected".
func keyRef(kind, form, key string) string {
	name, field := "webapp-config", "configMapKeyRef"
	if kind == "secret" {
		name, field = "webapp-secret", "secretKeyRef"
	}
	switch form {
	case "volume":
		if kind == "secret" {
			return `{"volumes":[{"name":"v","secret":{"secretName":"` + name + `","items":[{"key":"` + key + `","path":"f"}]}}],"containers":[{"name":"app"}]}`
		}
		return `{"volumes":[{"name":"v","configMap":{"name":"` + name + `","items":[{"key":"` + key + `","path":"f"}]}}],"containers":[{"name":"app"}]}`
	case "projected":
		return `{"volumes":[{"name":"v","projected":{"sources":[{"` + kind + `":{"name":"` + name + `","items":[{"key":"` + key + `","path":"f"}]}}]}}],"containers":[{"name":"app"}]}`
	}
	return `{"containers":[{"name":"app","env":[{"name":"V","valueFrom":{"` + field + `":{"name":"` + name + `","key":"` + key + `","optional":true}}}]}]}`
}

// referencingPods are pods of several workloads: readers of webapp-config
// in each form, of another ConfigMap, and of nothing, labelled app=<name>.
func referencingPods() []*fakePod {
	pod := func(name, spec string) *fakePod {
		return &fakePod{name: name, uid: "uid-" + name, labels: map[string]string{"app": strings.TrimRight(name, "-0123456789"), "tier": "web"}, spec: spec}
	}
	return []*fakePod{
		pod("envfrom-1", specEnvFrom), pod("envfrom-2", specEnvFrom),
		pod("volume-1", specVolume),
		pod("init-1", specInitOnly),
		pod("other-1", specOther),
		pod("nothing-1", specNothing),
		pod("ephemeral-1", specEphemeral),
		pod("samename-1", specSecretCMOf),
	}
}

// referencing is a ConfigMap with RestartReferencingAnnotation (value),
// no selector, recorded for data recorded (nil: none).
func referencing(t *testing.T, value string, recorded, data map[string]string) cmSpec {
	s := cmSpec{annotations: map[string]string{RestartReferencingAnnotation: value}, data: data}
	if recorded != nil {
		s.recorded = hashOf(t, recorded)
	}
	return s
}

// TestReferencingRestartsThePodsThatReadTheObject ensures an object with
// restartReferencingPods and no selector restarts, at a data change, the
// pods of its namespace that read it, in a container or an init container,
// through a volume or envFrom, from the index or from a LIST alike; never a
// pod that reads another object, nothing, a Secret of the same name, or
// reads it only in an ephemeral container.
func TestReferencingRestartsThePodsThatReadTheObject(t *testing.T) {
	want := []string{"envfrom-1", "envfrom-2", "volume-1", "init-1"}
	for _, indexed := range []bool{false, true} {
		t.Run(map[bool]string{false: "List", true: "Index"}[indexed], func(t *testing.T) {
			api := newFakeAPI(t, referencingPods()...)
			cfg := Config{RecordHash: true}
			if indexed {
				cfg = withIndex(cfg, mirror(t, api, nil))
			}
			rec := &fakeRecorder{}
			cfg.Events = rec
			c, m := newTestController(t, api.client(), cfg)
			start(t, c)

			handle(t, c, watch.Modified, referencing(t, "true", v1, v2))
			settle(t, c)

			assert.ElementsMatch(t, want, api.deletedPods())
			assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes())
			assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
			require.NotEmpty(t, rec.all())
			last := rec.all()[len(rec.all())-1]
			assert.Equal(t, "PodsRestarted", last.reason)
			assert.Contains(t, last.message, "Restarted 4 pod(s) referencing ConfigMap webapp-config")
		})
	}
}

// TestSelectorNarrowsReferencingPods ensures both annotations together
// restart the referencing pods the selector matches, and no pod that only
// one of them selects.
func TestSelectorNarrowsReferencingPods(t *testing.T) {
	api := newFakeAPI(t, referencingPods()...)
	rec := &fakeRecorder{}
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, Events: rec})
	start(t, c)

	s := referencing(t, "true", v1, v2)
	s.selector = ptr("app in (envfrom,other)")
	handle(t, c, watch.Modified, s)
	settle(t, c)

	assert.ElementsMatch(t, []string{"envfrom-1", "envfrom-2"}, api.deletedPods())
	all := rec.all()
	require.NotEmpty(t, all)
	assert.Contains(t, all[len(all)-1].message, "matching app in (envfrom,other) and referencing ConfigMap webapp-config")
}

// TestReferencingAnnotationValues ensures "false" alone opts nothing in
// (no request, nothing kept), "false" beside a selector leaves the selector
// alone, and another value is refused at the change, restarting nothing,
// with a Warning Event that says what to write.
func TestReferencingAnnotationValues(t *testing.T) {
	t.Run("FalseAloneIsNoOptIn", func(t *testing.T) {
		api := newFakeAPI(t, referencingPods()...)
		c, _ := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		handle(t, c, watch.Modified, referencing(t, "false", v1, v2))
		settle(t, c)
		assert.Empty(t, api.requests)
		c.mu.Lock()
		assert.Empty(t, c.entries)
		c.mu.Unlock()
	})
	t.Run("FalseBesideASelector", func(t *testing.T) {
		api := newFakeAPI(t, referencingPods()...)
		c, _ := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		s := referencing(t, "false", v1, v2)
		s.selector = ptr("app=nothing")
		handle(t, c, watch.Modified, s)
		settle(t, c)
		assert.Equal(t, []string{"nothing-1"}, api.deletedPods())
	})
	t.Run("OtherValueRefused", func(t *testing.T) {
		api := newFakeAPI(t, referencingPods()...)
		rec := &fakeRecorder{}
		c, m := newTestController(t, api.client(), Config{RecordHash: true, Events: rec})
		start(t, c)
		handle(t, c, watch.Modified, referencing(t, "yes", v1, v2))
		settle(t, c)
		assert.Empty(t, api.deletedPods())
		assert.Equal(t, uint64(1), m.Reconciles.Value(resultRefused))
		require.Len(t, rec.all(), 1)
		assert.Equal(t, "InvalidAnnotation", rec.all()[0].reason)
		assert.Contains(t, rec.all()[0].message, `k8spatterns.io/restartReferencingPods "yes": must be "true" or "false"`)
	})
}

// TestReferencingObjectOptsItsNamespaceIn ensures the annotation alone
// counts an object as annotated, as the selector does: its namespace is
// indexed, and no longer once the annotation is removed.
func TestReferencingObjectOptsItsNamespaceIn(t *testing.T) {
	var got []bool
	api := newFakeAPI(t)
	c, _ := newTestController(t, api.client(), Config{Pods: oneIndex{annotated: func(ns string, on bool) { got = append(got, on) }}})
	handle(t, c, watch.Added, referencing(t, "true", v1, v1))
	handle(t, c, watch.Modified, cmSpec{data: v1})
	assert.Equal(t, []bool{true, false}, got)
}

// TestReferencingSecretRestartsItsReaders ensures a Secret with the
// annotation restarts the pods that read it, and not those that read a
// ConfigMap of the same name.
func TestReferencingSecretRestartsItsReaders(t *testing.T) {
	pods := []*fakePod{
		{name: "secret-1", uid: "uid-s1", labels: map[string]string{"app": "a"}, spec: specSecretEnv},
		{name: "cm-1", uid: "uid-c1", labels: map[string]string{"app": "a"}, spec: specSecretCMOf},
	}
	api := newFakeAPI(t, pods...)
	secret := secretSpec{annotations: map[string]string{RestartReferencingAnnotation: "true"}, data: s1}
	c := secretController(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}},
		[]cmSpec{stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), "")}, []secretSpec{secret})
	settle(t, c)
	require.Empty(t, api.requests)

	secret.data = s2
	handleSecret(t, c, watch.Modified, secret)
	settle(t, c)
	assert.Equal(t, []string{"secret-1"}, api.deletedPods())
}
