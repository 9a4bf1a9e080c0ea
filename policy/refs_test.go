package policy

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
	require.Empty(t, api.deletedPods())

	secret.data = s2
	handleSecret(t, c, watch.Modified, secret)
	settle(t, c)
	assert.Equal(t, []string{"secret-1"}, api.deletedPods())
}

// keysOf is RestartedForKeysAnnotation for a ConfigMap with data.
func keysOf(t *testing.T, data map[string]string) string {
	obj, err := parseObject(referencing(t, "true", nil, data).json(t), kindConfigMap, DefaultSelectorAnnotation, nil)
	require.NoError(t, err)
	require.NotEmpty(t, obj.keys)
	return string(obj.keys)
}

// secretKeysOf is RestartedForKeysAnnotation for a Secret with data.
func secretKeysOf(t *testing.T, data map[string][]byte) string {
	obj, err := parseObject(secretSpec{annotations: map[string]string{RestartReferencingAnnotation: "true"}, data: data}.json(t), kindSecret, DefaultSelectorAnnotation, testKey)
	require.NoError(t, err)
	require.NotEmpty(t, obj.keys)
	return string(obj.keys)
}

// keyPods are, for object kind ("configMap" or "secret"), readers of key
// a and of key b in form, a reader of the whole object and a pod reading
// nothing.
func keyPods(kind, form string) []*fakePod {
	whole := specEnvFrom
	if kind == "secret" {
		whole = specSecretEnv
	}
	pod := func(name, spec string) *fakePod {
		return &fakePod{name: name, uid: "uid-" + name, labels: map[string]string{"app": name}, spec: spec}
	}
	return []*fakePod{pod("reads-a", keyRef(kind, form, "a")), pod("reads-b", keyRef(kind, form, "b")), pod("whole", whole), pod("nothing", specNothing)}
}

// TestKeyLevelRestartsOnlyReadersOfChangedKeys ensures, for a ConfigMap
// and a Secret and each form that reads a key by name (env, a volume's
// items, a projected source's items), that a change restarts the pods
// that read a changed, added or removed key and those that read the whole
// object, and no pod that reads only keys left as they were.
func TestKeyLevelRestartsOnlyReadersOfChangedKeys(t *testing.T) {
	changes := []struct {
		name          string
		before, after map[string]string
		want          []string
	}{
		{"KeyChanged", map[string]string{"a": "1", "b": "1"}, map[string]string{"a": "2", "b": "1"}, []string{"reads-a", "whole"}},
		{"KeyAdded", map[string]string{"b": "1"}, map[string]string{"a": "1", "b": "1"}, []string{"reads-a", "whole"}},
		{"KeyRemoved", map[string]string{"a": "1", "b": "1"}, map[string]string{"a": "1"}, []string{"reads-b", "whole"}},
		{"UnreadKeyChanged", map[string]string{"a": "1", "c": "1"}, map[string]string{"a": "1", "c": "2"}, []string{"whole"}},
	}
	for _, kind := range []string{"configMap", "secret"} {
		for _, form := range []string{"env", "volume", "projected"} {
			for _, ch := range changes {
				t.Run(kind+"/"+form+"/"+ch.name, func(t *testing.T) {
					api := newFakeAPI(t, keyPods(kind, form)...)
					if kind == "configMap" {
						c, _ := newTestController(t, api.client(), Config{RecordHash: true})
						start(t, c)
						s := referencing(t, "true", ch.before, ch.after)
						s.annotations[RestartedForKeysAnnotation] = keysOf(t, ch.before)
						handle(t, c, watch.Modified, s)
						settle(t, c)
						assert.ElementsMatch(t, ch.want, api.deletedPods())
						written := api.patchedAnnotations()
						require.NotEmpty(t, written)
						assert.Equal(t, keysOf(t, ch.after), *written[len(written)-1][RestartedForKeysAnnotation], "the record keeps the keys of the data now")
						return
					}
					before, after := bytesOf(ch.before), bytesOf(ch.after)
					secret := secretSpec{annotations: map[string]string{RestartReferencingAnnotation: "true"}, data: before}
					state := stateSpecKeys(t, "webapp-secret", secretHashOf(t, before), secretKeysOf(t, before))
					c := secretController(t, api, Config{RecordHash: true}, []cmSpec{state}, []secretSpec{secret})
					settle(t, c)
					require.Empty(t, api.requests, "its state holds R and its key digests")
					secret.data = after
					handleSecret(t, c, watch.Modified, secret)
					settle(t, c)
					assert.ElementsMatch(t, ch.want, api.deletedPods())
				})
			}
		}
	}
}

// TestResumedIntentRestartsThePodsItNames ensures a resumed round restarts
// the pods its intent names, and no other reader, whether its round was
// narrowed to the keys that changed (as the previous version wrote it) or
// began over mixed pods, every reader named: the intent holds its round's
// narrowing, and resuming narrows no further.
func TestResumedIntentRestartsThePodsItNames(t *testing.T) {
	recorded := map[string]string{"a": "1", "b": "1"}
	for _, tt := range []struct {
		name  string
		data  map[string]string
		named []string
	}{
		// R -> D changed a: the round took the readers of a, and had
		// restarted whole (its replacement is not named) when it was cut.
		{"NarrowedRound", map[string]string{"a": "2", "b": "1"}, []string{"reads-a"}},
		// A fix that set a back to R's value, over pods a halted round
		// had left on a=2: every reader, though against R nothing changed.
		{"MixedRound", recorded, []string{"reads-a", "reads-b", "whole"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api, c := keyController(t)
			var pods []podRef
			for _, name := range tt.named {
				pods = append(pods, podRef{uid: "uid-" + name})
			}
			s := referencing(t, "true", recorded, tt.data)
			s.annotations[RestartedForKeysAnnotation] = keysOf(t, recorded)
			d, ok := parseDigest(hashOf(t, tt.data))
			require.True(t, ok)
			s.intent = newIntent(d, pods).text // the previous version's writer, unchanged
			handle(t, c, watch.Modified, s)
			settle(t, c)
			assert.ElementsMatch(t, tt.named, api.deletedPods())
		})
	}
}

// TestSupersededRoundOverMixedPodsKeepsThemMixed ensures a round begun over
// pods an earlier round left mixed, superseded before its first restart,
// leaves an intent that says so (mixed/*), not none: the next round still
// restarts every reader. The round for {a:2} left reads-a-r on a=2; the fix sets a
// back, and is itself changed (b) while its intent is written.
func TestSupersededRoundOverMixedPodsKeepsThemMixed(t *testing.T) {
	recorded := map[string]string{"a": "1", "b": "1"}
	interrupted := map[string]string{"a": "2", "b": "1"}
	fix, fixed := recorded, map[string]string{"a": "1", "b": "2"}
	pod := func(name, spec string) *fakePod {
		return &fakePod{name: name, uid: "uid-" + name, labels: map[string]string{"app": name}, spec: spec}
	}
	api := newFakeAPI(t, pod("reads-a-r", keyRef("configMap", "env", "a")), pod("reads-b", keyRef("configMap", "env", "b")))
	c, _ := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	spec := func(data map[string]string) cmSpec {
		s := referencing(t, "true", recorded, data)
		s.annotations[RestartedForKeysAnnotation] = keysOf(t, recorded)
		s.intent = hashOf(t, interrupted) + "/uid-reads-a"
		return s
	}
	var patches atomic.Int32
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodPatch && patches.Add(1) == 1 {
			handle(t, c, watch.Modified, spec(fixed)) // while the fix's intent is written
		}
		return 0, "", false
	}
	handle(t, c, watch.Modified, spec(fix))
	settle(t, c)

	assert.Contains(t, api.deletedPods(), "reads-a-r", "it runs a=2; the data's a is 1")
	intents := api.intents()
	require.GreaterOrEqual(t, len(intents), 2)
	assert.Equal(t, mixedIntent.text, intents[1], "the superseded round's undo")
}

// keyController is a started controller over keyPods("configMap", "env").
func keyController(t *testing.T) (*fakeAPI, *Controller) {
	api := newFakeAPI(t, keyPods("configMap", "env")...)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	return api, c
}

func bytesOf(data map[string]string) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range data {
		out[k] = []byte(v)
	}
	return out
}

// stateSpecKeys is stateSpec with R's key digests, under a MAC that checks.
func stateSpecKeys(t *testing.T, secret, recorded, keys string) cmSpec {
	s := stateSpec(secret, keyID(testKey), recorded, "")
	r, _ := parseDigest(recorded)
	s.annotations[RestartedForKeysAnnotation] = keys
	s.annotations[StateMACAnnotation] = stateMAC(testKey, "ns", secret, stored{recorded: r, recordedKeys: keyDigests(keys)})
	return s
}

// TestRecordWithoutKeyDigests ensures an R written without key digests
// (before they existed) restarts every referencing pod at the next change,
// and that while the data is still R's, its key digests are written once,
// so that the change after restarts by key.
func TestRecordWithoutKeyDigests(t *testing.T) {
	t.Run("ChangeRestartsEveryReader", func(t *testing.T) {
		api, c := keyController(t)
		handle(t, c, watch.Modified, referencing(t, "true", map[string]string{"a": "1", "b": "1"}, map[string]string{"a": "2", "b": "1"}))
		settle(t, c)
		assert.ElementsMatch(t, []string{"reads-a", "reads-b", "whole"}, api.deletedPods())
	})
	t.Run("UnchangedDataGainsThem", func(t *testing.T) {
		api, c := keyController(t)
		data := map[string]string{"a": "1", "b": "1"}
		handle(t, c, watch.Modified, referencing(t, "true", data, data))
		settle(t, c)
		assert.Empty(t, api.deletedPods())
		written := api.patchedAnnotations()
		require.Len(t, written, 1)
		assert.Equal(t, keysOf(t, data), *written[0][RestartedForKeysAnnotation])
		assert.Equal(t, hashOf(t, data), *written[0][RestartedForAnnotation])

		handle(t, c, watch.Modified, referencing(t, "true", data, map[string]string{"a": "1", "b": "2"}))
		settle(t, c)
		assert.ElementsMatch(t, []string{"reads-b", "whole"}, api.deletedPods())
	})
}

// TestOptionalReferences ensures a pod that reads a key that is missing
// (optional) is restarted when the key is added, and a pod that reads an
// object that does not exist yet is not restarted when the object is
// created (adopted, as any object first seen), but at its next change.
func TestOptionalReferences(t *testing.T) {
	t.Run("MissingKeyAdded", func(t *testing.T) {
		api, c := keyController(t)
		before := map[string]string{"b": "1"}
		s := referencing(t, "true", before, map[string]string{"a": "new", "b": "1"})
		s.annotations[RestartedForKeysAnnotation] = keysOf(t, before)
		handle(t, c, watch.Modified, s)
		settle(t, c)
		assert.ElementsMatch(t, []string{"reads-a", "whole"}, api.deletedPods())
	})
	t.Run("MissingObjectCreated", func(t *testing.T) {
		api, c := keyController(t)
		data := map[string]string{"a": "1", "b": "1"}
		handle(t, c, watch.Added, referencing(t, "true", nil, data))
		settle(t, c)
		assert.Empty(t, api.deletedPods(), "adopted")
		written := api.patchedAnnotations()
		require.Len(t, written, 1)
		s := referencing(t, "true", data, map[string]string{"a": "2", "b": "1"})
		s.annotations[RestartedForKeysAnnotation] = *written[0][RestartedForKeysAnnotation]
		handle(t, c, watch.Modified, s)
		settle(t, c)
		assert.ElementsMatch(t, []string{"reads-a", "whole"}, api.deletedPods())
	})
}

// TestKeyDigests ensures the digests of a ConfigMap's keys follow each
// key's value and section alone, read back as written; that a Secret's
// name no key; and that unreadable annotations are none.
func TestKeyDigests(t *testing.T) {
	a := keysOf(t, map[string]string{"a": "1", "b": "1"})
	b := keysOf(t, map[string]string{"b": "1", "a": "2"})
	changed, known := changedKeys(keyDigests(a), keyDigests(b))
	assert.True(t, known)
	assert.Equal(t, map[string]bool{"a": true}, changed)
	assert.Equal(t, keyDigests(a), parseKeyDigests(a))
	assert.True(t, strings.HasPrefix(a, "sha256:a="), a)

	s := secretKeysOf(t, map[string][]byte{"password": []byte("hunter2")})
	assert.NotContains(t, s, "password")
	assert.True(t, strings.HasPrefix(s, keyedDigestPrefix))
	assert.Len(t, s, len(keyedDigestPrefix)+2*keyDigestHex)
	assert.Equal(t, keyDigests(s), parseKeyDigests(s))

	for _, bad := range []string{"", "sha256", "sha256:a", "sha256:a=xyz", "sha256:a=0123456789abcdeg", "hmac-sha256:0123", "md5:a=0123456789abcdef"} {
		assert.Equal(t, keyDigests(""), parseKeyDigests(bad), bad)
	}
	_, known = changedKeys("", keyDigests(a))
	assert.False(t, known, "no record of keys: which changed is not known")
	_, known = changedKeys(keyDigests(a), keyDigests(s))
	assert.False(t, known, "a ConfigMap's against a Secret's")
}

// TestRecordRemovesKeyDigestsOnlyWhereShown ensures a record of an object
// without restartReferencingPods leaves the key digests out of its patch,
// unless the object shows some (left from when it had it): then it removes
// them, so that they never outlive the data they were taken of.
func TestRecordRemovesKeyDigestsOnlyWhereShown(t *testing.T) {
	for _, shown := range []bool{false, true} {
		api := newFakeAPI(t, webPods()...)
		c, _ := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		s := cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2, annotations: map[string]string{}}
		if shown {
			s.annotations[RestartedForKeysAnnotation] = keysOf(t, v1)
		}
		handle(t, c, watch.Modified, s)
		settle(t, c)
		written := api.patchedAnnotations()
		require.NotEmpty(t, written)
		v, present := written[len(written)-1][RestartedForKeysAnnotation]
		assert.Equal(t, shown, present, "shown %v", shown)
		assert.Nil(t, v)
	}
}

// TestLastLookJudgesOnlyTheRoundsReaders ensures the look PROGRESS_DEADLINE
// after a key-level round counts as replacements only pods that read what
// the round restarted for: a reader of a key that did not change, not
// Ready, is none of its business.
func TestLastLookJudgesOnlyTheRoundsReaders(t *testing.T) {
	pods := keyPods("configMap", "env")
	for _, p := range pods {
		p.owner = p.name + "-rs"
	}
	api := newFakeAPI(t, pods...)
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}, ProgressDeadline: 50 * time.Millisecond, Events: rec})
	start(t, c)
	before := map[string]string{"a": "1", "b": "1"}
	s := referencing(t, "true", before, map[string]string{"a": "2", "b": "1"})
	s.annotations[RestartedForKeysAnnotation] = keysOf(t, before)
	handle(t, c, watch.Modified, s)
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultRestarted) == 1 }, waitFor, time.Millisecond)
	assert.ElementsMatch(t, []string{"reads-a", "whole"}, api.deletedPods())
	// The look is due 50 ms after the round: wait until it was taken.
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultUnchanged) >= 1 }, waitFor, time.Millisecond)
	assert.Empty(t, eventText(rec, "ReplacementsNotReady"), "reads-b, not Ready, read no key that changed")
}

// TestReferencingDryRun ensures a dry run sends only server-side dry-run
// deletions, of the pods that read the object, and says which it would have
// restarted, by what they read.
func TestReferencingDryRun(t *testing.T) {
	api := newFakeAPI(t, referencingPods()...)
	rec := &fakeRecorder{}
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, DryRun: true, Events: rec})
	start(t, c)
	handle(t, c, watch.Modified, referencing(t, "true", v1, v2))
	settle(t, c)
	assert.ElementsMatch(t, []string{"envfrom-1", "envfrom-2", "volume-1", "init-1"}, api.deletedPods())
	for _, r := range api.seen(http.MethodDelete, "pods") {
		assert.Contains(t, r.body, `"dryRun":["All"]`)
	}
	assert.Contains(t, eventText(rec, "DryRun"), "Would restart 4 pod(s) referencing ConfigMap webapp-config")
}

// TestKeyDigestsArePinned pins the key digests and the MAC of a state that
// holds some (computed apart, with Python's hashlib and hmac over the
// streams keys.go and stateMAC describe): records written earlier must
// keep matching.
func TestKeyDigestsArePinned(t *testing.T) {
	obj, err := parseObject([]byte(`{"metadata":{"name":"webapp-config","namespace":"ns","annotations":{"`+RestartReferencingAnnotation+`":"true"}},"data":{"a":"1"},"binaryData":{"b":"AQI="}}`), kindConfigMap, DefaultSelectorAnnotation, nil)
	require.NoError(t, err)
	assert.Equal(t, keyDigests("sha256:a=5e982e508c12e363,b=d62ef92f9cea9667"), obj.keys)
	assert.Equal(t, "hmac-sha256:8ee67a61f2e76d41d6492e7d9f5becda", secretKeysOf(t, s1))

	r, _ := parseDigest("hmac-sha256:" + strings.Repeat("ab", 32))
	st := stored{recorded: r, intent: parseIntent("hmac-sha256:" + strings.Repeat("cd", 32) + "/uid-1,uid-2"),
		halted: parseHalt("hmac-sha256:" + strings.Repeat("ef", 32) + "@2026-12-05T07:00:00Z")}
	st.recordedKeys = keyDigests("hmac-sha256:" + strings.Repeat("01", 16))
	assert.Equal(t, "cfb971ff49e31ee50edff0aac09437118e726460c2e496052e26b45b593cf4fe", stateMAC(testKey, "ns", "webapp-secret", st))
}

// TestAnEmptySelectorAddedToAReferencingObjectEndsItsRound ensures a round
// of an object that selects the pods reading it sends no paced restart
// after an empty selector annotation is added: an empty selector is
// refused, and adding one changes how the object selects, although an
// absent and an empty selector are both "" (simulator seed 655).
func TestAnEmptySelectorAddedToAReferencingObjectEndsItsRound(t *testing.T) {
	var pods []*fakePod
	for i := range 11 { // the burst is 10: the eleventh waits a second
		name := "envfrom-" + strconv.Itoa(i)
		pods = append(pods, &fakePod{name: name, uid: "uid-" + name, labels: map[string]string{"app": "web"}, spec: specEnvFrom})
	}
	api := newFakeAPI(t, pods...)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}, MaxRestartsPerSecond: 1})
	start(t, c)
	s := referencing(t, "true", map[string]string{"a": "1"}, map[string]string{"a": "2"})
	handle(t, c, watch.Modified, s)
	require.Eventually(t, func() bool { return len(api.deletedPods()) == 10 }, waitFor, time.Millisecond)

	// As the server shows it: the round's intent written, the rest as it was.
	s.intent, s.rv, s.selector = api.intents()[0], api.patchRV(0), ptr("")
	handle(t, c, watch.Modified, s)
	time.Sleep(1500 * time.Millisecond) // the eleventh's token comes
	assert.Len(t, api.deletedPods(), 10, "a DELETE sent after the object's selector was made invalid")
}
