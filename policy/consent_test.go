package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/selector"
	"github.com/k8spatterns/config-watcher/watch"
)

// TestOwnPodSpares ensures the controller's pod is spared by uid anywhere,
// its siblings by owner uid in its namespace only, and by name only when its
// uid is unknown.
func TestOwnPodSpares(t *testing.T) {
	own := OwnPod{Namespace: "cw", Name: "cw-1", UID: "uid-own", OwnerUID: "uid-rs"}
	for _, tt := range []struct {
		name                       string
		own                        OwnPod
		namespace, pod, uid, owner string
		want                       bool
	}{
		{"ItselfByUID", own, "cw", "cw-1", "uid-own", "uid-rs", true},
		{"StandbySibling", own, "cw", "cw-2", "uid-2", "uid-rs", true},
		{"SiblingOwnerElsewhereIsNotOurs", own, "team", "x", "uid-3", "uid-rs", false},
		{"SameNameOtherUIDIsNotItself", own, "cw", "cw-1", "uid-other", "uid-other-rs", false},
		{"SameNameElsewhere", own, "team", "cw-1", "uid-4", "", false},
		{"UnrelatedPod", own, "cw", "webapp-1", "uid-5", "uid-web", false},
		{"BarePodNoOwner", OwnPod{Namespace: "cw", Name: "cw-1", UID: "uid-own"}, "cw", "bare", "uid-6", "", false},
		{"ByNameWithoutUID", OwnPod{Namespace: "cw", Name: "cw-1"}, "cw", "cw-1", "uid-7", "", true},
		{"ByNameWithoutUIDNorNamespace", OwnPod{Name: "cw-1"}, "team", "cw-1", "uid-8", "", true},
		{"NothingKnownSparesNothing", OwnPod{}, "cw", "", "uid-9", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.own.Spares(tt.namespace, tt.pod, tt.uid, tt.owner))
		})
	}
}

// controllerPods are the controller's two replicas (one ReplicaSet) beside
// a webapp, all matching app.kubernetes.io/name=config-watcher as a hostile
// selector could ask.
func controllerPods() []*fakePod {
	name := map[string]string{"app.kubernetes.io/name": "config-watcher"}
	return []*fakePod{
		{name: "cw-1", uid: "uid-cw-1", labels: name, owner: "cw-rs", ready: true},
		{name: "cw-2", uid: "uid-cw-2", labels: name, owner: "cw-rs", ready: true},
		{name: "webapp-1", uid: "uid-1", labels: map[string]string{"app": "webapp"}, owner: "web-rs", ready: true},
	}
}

// TestStandbyReplicaNeverRestarted ensures a selector that matches the
// controller's Deployment restarts neither its own pod nor the standby, with
// or without the pod index, once the owner is learnt from the API.
func TestStandbyReplicaNeverRestarted(t *testing.T) {
	roundOfBothKinds(t, controllerPods, func(t *testing.T, api *fakeAPI, cfg *Config) {
		own, err := LearnOwnPod(t.Context(), api.client(), OwnPod{Namespace: "ns", Name: "cw-1", UID: "uid-cw-1"})
		require.NoError(t, err)
		require.Equal(t, "uid-cw-rs", own.OwnerUID, "the owner is learnt from the pod")
		cfg.OwnPod = own
	}, "app.kubernetes.io/name=config-watcher", func(t *testing.T, api *fakeAPI) {
		assert.Empty(t, api.deletedPods(), "neither replica of the controller")
	})
}

// roundOfBothKinds runs one round of a change to a ConfigMap of selector
// over the pods made by pods, once listing them first and once from the pod
// index (all at once, as only then a round begins from the index); setup
// may change the controller's Config first, and check looks at the API
// afterwards.
func roundOfBothKinds(t *testing.T, pods func() []*fakePod, setup func(*testing.T, *fakeAPI, *Config), selector string, check func(*testing.T, *fakeAPI)) {
	for _, indexed := range []bool{false, true} {
		t.Run(map[bool]string{false: "Listed", true: "FromTheIndex"}[indexed], func(t *testing.T) {
			pods := pods()
			api := newFakeAPI(t, pods...)
			cfg := Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}}
			if indexed {
				cfg = withIndex(cfg, indexOf(t, pods...))
			}
			setup(t, api, &cfg)
			c, _ := newTestController(t, api.client(), cfg)
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr(selector), recorded: hashOf(t, v1), data: v2})
			settle(t, c)
			check(t, api)
		})
	}
}

// TestLearnOwnPodRefuses ensures what no retry fixes stops the start with
// the reason: a pod not found, another uid under the name, RBAC.
func TestLearnOwnPodRefuses(t *testing.T) {
	for _, tt := range []struct {
		name    string
		own     OwnPod
		forbid  bool
		wantErr string
	}{
		{"NotFound", OwnPod{Namespace: "ns", Name: "cw-9"}, false, "not found: POD_NAME or POD_NAMESPACE is wrong"},
		{"OtherUID", OwnPod{Namespace: "ns", Name: "cw-1", UID: "uid-stale"}, false, "has uid uid-cw-1, not POD_UID uid-stale"},
		{"Forbidden", OwnPod{Namespace: "ns", Name: "cw-1"}, true, "needs verb list on pods"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, controllerPods()...)
			if tt.forbid {
				api.fault = func(request) (int, string, bool) {
					return 403, `{"kind":"Status","code":403,"reason":"Forbidden"}`, true
				}
			}
			_, err := LearnOwnPod(t.Context(), api.client(), tt.own)
			require.Error(t, err)
			assert.ErrorContains(t, err, tt.wantErr)
			assert.True(t, errors.As(err, new(*backoff.PermanentError)), "not retried")
		})
	}
}

// TestPodOptInLabelRestartsOnlyConsentingPods ensures that with
// POD_OPT_IN_LABEL a selector restarts only the pods that carry the label,
// as the list sent to the API server and the index alike select them.
func TestPodOptInLabelRestartsOnlyConsentingPods(t *testing.T) {
	optIn, err := selector.ParseLabel("config-watcher.k8spatterns.io/restart=true")
	require.NoError(t, err)
	pods := func() []*fakePod {
		return []*fakePod{
			{name: "webapp-1", uid: "uid-1", labels: map[string]string{"app": "webapp", "config-watcher.k8spatterns.io/restart": "true"}},
			{name: "webapp-2", uid: "uid-2", labels: map[string]string{"app": "webapp"}},
			{name: "webapp-3", uid: "uid-3", labels: map[string]string{"app": "webapp", "config-watcher.k8spatterns.io/restart": "false"}},
		}
	}
	roundOfBothKinds(t, pods, func(_ *testing.T, _ *fakeAPI, cfg *Config) { cfg.PodOptIn = optIn }, "app=webapp", func(t *testing.T, api *fakeAPI) {
		assert.Equal(t, []string{"webapp-1"}, api.deletedPods())
		for _, r := range api.seen(http.MethodGet, "pods") {
			if ls := strings.Join(r.query["labelSelector"], ""); ls != "" {
				assert.Equal(t, "app=webapp,config-watcher.k8spatterns.io/restart=true", ls)
			}
		}
	})
}

// TestPodOptInLabelDoesNotWidenABroadSelector ensures the opt-in label is
// added to a selector that passed on its own: a selector refused for its
// breadth stays refused.
func TestPodOptInLabelDoesNotWidenABroadSelector(t *testing.T) {
	optIn, err := selector.ParseLabel("config-watcher.k8spatterns.io/restart=true")
	require.NoError(t, err)
	api := newFakeAPI(t, webPods()...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true, PodOptIn: optIn})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("pod-template-hash"), recorded: hashOf(t, v1), data: v2})
	settle(t, c)
	assert.Empty(t, api.requests)
	assert.Equal(t, uint64(1), m.InvalidSelectors.Value())
}

// namespaceEvent is a Namespace as its watch shows it.
func namespaceEvent(t *testing.T, typ watch.EventType, name string, labels map[string]string) watch.Event {
	b, err := json.Marshal(map[string]any{"kind": "Namespace", "apiVersion": "v1", "metadata": map[string]any{"name": name, "labels": labels, "resourceVersion": "1"}})
	require.NoError(t, err)
	return watch.Event{Type: typ, Object: b, ResourceVersion: "1"}
}

// optedIn is the opt-in label of the tests.
var optedIn = map[string]string{"config-watcher.k8spatterns.io/enabled": "true"}

// newConsent returns a NamespaceConsent of the default selector, listed
// with the given namespaces, that records the namespaces it reports.
func newConsent(t *testing.T, listed map[string]map[string]string) (*NamespaceConsent, func() (in, out []string)) {
	sel, err := selector.ParseAny("config-watcher.k8spatterns.io/enabled=true")
	require.NoError(t, err)
	n := NewNamespaceConsent(sel, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var mu sync.Mutex
	var in, out []string
	n.OptedIn = func(ns string) { mu.Lock(); in = append(in, ns); mu.Unlock() }
	n.OptedOut = func(ns string) { mu.Lock(); out = append(out, ns); mu.Unlock() }
	n.BeginList()
	for name, labels := range listed {
		n.Handle(namespaceEvent(t, watch.Synced, name, labels))
	}
	n.EndList()
	n.Streaming(true) // the watch opens after its list
	return n, func() ([]string, []string) { mu.Lock(); defer mu.Unlock(); return in, out }
}

// TestNamespaceConsentFollowsTheLabel ensures a namespace opts in and out
// with its label, a deletion or a relist that no longer shows it; the
// first list reports nothing (nothing was judged before it).
func TestNamespaceConsentFollowsTheLabel(t *testing.T) {
	n, reported := newConsent(t, map[string]map[string]string{"a": optedIn, "b": nil})
	select {
	case <-n.Listed():
	default:
		t.Fatal("Listed not closed after the first list")
	}
	assert.True(t, n.Allows("a"))
	assert.False(t, n.Allows("b"))
	assert.False(t, n.Allows("kube-system"))
	in, out := reported()
	assert.Empty(t, in, "the first list reports nothing")
	assert.Empty(t, out)

	n.Handle(namespaceEvent(t, watch.Modified, "b", optedIn))
	n.Handle(namespaceEvent(t, watch.Modified, "a", map[string]string{"config-watcher.k8spatterns.io/enabled": "false"}))
	assert.True(t, n.Allows("b"))
	assert.False(t, n.Allows("a"))
	n.Handle(namespaceEvent(t, watch.Deleted, "b", optedIn))
	assert.False(t, n.Allows("b"))
	n.Handle(namespaceEvent(t, watch.Added, "c", optedIn))
	n.BeginList() // a relist that no longer shows c
	n.EndList()
	assert.False(t, n.Allows("c"))
	in, out = reported()
	assert.Equal(t, []string{"b", "c"}, in)
	assert.Equal(t, []string{"a", "b", "c"}, out)
}

// TestNamespaceNotOptedInIgnored ensures that under a NamespaceConsent an
// annotated ConfigMap of a namespace that did not opt in is ignored: no
// request (no restart, no record), counted not_opted_in, said once; and
// that once the namespace opts in, its ConfigMap is adopted as it is (the
// relist) and the next change restarts its pods.
func TestNamespaceNotOptedInIgnored(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	consent, reported := newConsent(t, map[string]map[string]string{"other": optedIn})
	c, m, logs := loggedController(t, api.client(), Config{RecordHash: true, Namespaces: consent})
	consent.OptedOut = c.ForgetNamespace
	start(t, c)
	handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), data: v1})
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), data: v2})
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), data: v3})
	settle(t, c)
	assert.Empty(t, api.requests, "nothing is read or written for a namespace that did not opt in")
	assert.Equal(t, uint64(3), m.Reconciles.Value(resultNotOptedIn))
	assert.Equal(t, 1, countLines(logs.String(), "did not opt in"), "said once")

	consent.Handle(namespaceEvent(t, watch.Modified, "ns", optedIn))
	in, _ := reported()
	require.Equal(t, []string{"ns"}, in, "the watches are asked to relist")
	configMaps(c).BeginList() // the relist: never recorded here
	handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), data: v3})
	configMaps(c).EndList()
	settle(t, c)
	assert.Empty(t, api.deletedPods(), "data seen before the namespace opted in is adopted, not acted on")
	assert.Equal(t, []string{hashOf(t, v3)}, api.recordedHashes())
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v3), data: v2})
	settle(t, c)
	assert.Len(t, api.deletedPods(), 3, "the next change is")
}

// TestNamespaceOptingOutStopsItsRounds ensures a namespace that opts out
// has its objects forgotten: a queued change is not acted on.
func TestNamespaceOptingOutStopsItsRounds(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	consent, _ := newConsent(t, map[string]map[string]string{"ns": optedIn})
	c, m := newTestController(t, api.client(), Config{RecordHash: true, Namespaces: consent})
	consent.OptedOut = c.ForgetNamespace
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2}) // queued, no worker yet
	consent.Handle(namespaceEvent(t, watch.Modified, "ns", nil))
	start(t, c)
	settle(t, c)
	assert.Empty(t, api.deletedPods())
	assert.Zero(t, m.Reconciles.Value(resultRestarted))
}

// TestPacedRestartAsksWhetherTheNamespaceStillOptsIn ensures a restart that
// waited for a token of MAX_RESTARTS_PER_SECOND is not sent once its
// namespace has opted out meanwhile: the round's currency check asks the
// consent itself, not only whether the watch has forgotten the object yet
// (here it never does).
func TestPacedRestartAsksWhetherTheNamespaceStillOptsIn(t *testing.T) {
	var pods []*fakePod
	for i := range 11 { // the burst is 10: the eleventh waits a second
		pods = append(pods, &fakePod{name: "web-" + strconv.Itoa(i), uid: "uid-web-" + strconv.Itoa(i), labels: map[string]string{"app": "web"}})
	}
	api := newFakeAPI(t, pods...)
	consent, _ := newConsent(t, map[string]map[string]string{"ns": optedIn})
	c, m := newTestController(t, api.client(), Config{RecordHash: true, Namespaces: consent,
		MaxUnavailable: Budget{Percent: 100}, MaxRestartsPerSecond: 1})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=web"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return len(api.deletedPods()) == 10 }, waitFor, time.Millisecond)
	consent.Handle(namespaceEvent(t, watch.Modified, "ns", nil))
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultUnchanged) == 1 }, 5*time.Second, time.Millisecond, "the round stops at the eleventh")
	assert.Len(t, api.deletedPods(), 10, "a DELETE sent after the namespace opted out")
	assert.Empty(t, api.recordedHashes())
}

// countLines counts the lines of out that contain s.
func countLines(out, s string) int {
	n := 0
	for line := range strings.Lines(out) {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// TestNoRestartWhileTheNamespacesWatchIsDown ensures that while the
// namespaces' watch is cut or relisting, nothing is written in any
// namespace, its last view notwithstanding (an opt-out may be on its way):
// the round waits, and goes on when the watch streams again if the
// namespace still opts in; if the relist shows it opted out, nothing of
// it is ever restarted.
func TestNoRestartWhileTheNamespacesWatchIsDown(t *testing.T) {
	for _, tt := range []struct {
		name       string
		optedOut   bool // the relist no longer shows the namespace
		wantPods   int
		wantRecord bool
	}{
		{name: "still opted in: the round goes on once it streams", wantPods: 3, wantRecord: true},
		{name: "opted out meanwhile: nothing restarted", optedOut: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			consent, _ := newConsent(t, map[string]map[string]string{"ns": optedIn})
			c, _ := newTestController(t, api.client(), Config{RecordHash: true, Namespaces: consent})
			consent.OptedOut = c.ForgetNamespace
			start(t, c)
			consent.Streaming(false) // cut: a compaction, then a 410 and a relist
			handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			settle(t, c)
			assert.Empty(t, api.deletedPods(), "restarted while the namespace's consent was not known")
			assert.Empty(t, api.patchedAnnotations(), "written while the namespace's consent was not known")

			consent.BeginList()
			if !tt.optedOut {
				consent.Handle(namespaceEvent(t, watch.Synced, "ns", optedIn))
			}
			consent.EndList()
			consent.Streaming(true)
			if tt.wantPods > 0 {
				require.Eventually(t, func() bool { return len(api.recordedHashes()) == 1 }, waitFor, time.Millisecond, "woken when the watch streams again")
			}
			settle(t, c)
			assert.Len(t, api.deletedPods(), tt.wantPods)
			assert.Equal(t, tt.wantRecord, len(api.recordedHashes()) == 1)
		})
	}
}

// TestNoRestartWhileTheObjectsWatchIsDown ensures that while the watch of
// an object's kind and namespace is cut or relisting, its round writes
// nothing, its selector as last shown notwithstanding (a narrowed one may
// be on its way); once the watch streams again, the round goes by what the
// relist showed.
func TestNoRestartWhileTheObjectsWatchIsDown(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true})
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2}) // queued, no worker yet
	stream := configMaps(c).(watch.Streamer)
	stream.Streaming(false) // cut: a compaction, then a 410 and a relist
	start(t, c)
	settle(t, c)
	assert.Empty(t, api.deletedPods(), "restarted while the object's selection was not known")
	assert.Empty(t, api.patchedAnnotations(), "written while the object's selection was not known")

	// The relist shows the selector narrowed meanwhile.
	handle(t, c, watch.Synced, cmSpec{selector: ptr("app=db"), recorded: hashOf(t, v1), data: v2})
	stream.Streaming(true)
	require.Eventually(t, func() bool { return len(api.recordedHashes()) == 1 }, waitFor, time.Millisecond, "woken when the watch streams again")
	settle(t, c)
	assert.Equal(t, []string{"db-1"}, api.deletedPods())
}

// TestRoundWaitsForItsNamespaceToBeListedAgainAfterItOptsIn ensures that in
// a namespace that opted in again, no round restarts before every object of
// the namespace has been listed again: another object over the same pods,
// changed while the namespace was out and listed later, keeps its budget.
// Here b's pods, two of six not Ready, allow no Ready one to go, though a's
// four Ready ones alone would allow one (simulator seed 342).
func TestRoundWaitsForItsNamespaceToBeListedAgainAfterItOptsIn(t *testing.T) {
	pods := podsOf("RRRRNN")
	for i, p := range pods {
		p.labels["tier"] = "web"
		if i >= 4 {
			p.name, p.owner = fmt.Sprintf("x-%d", i+1), "x-rs"
			delete(p.labels, "app")
		}
	}
	api := newFakeAPI(t, pods...)
	api.replaceDeleted(func() bool { return false })
	consent, _ := newConsent(t, map[string]map[string]string{"ns": optedIn})
	c, m := newTestController(t, api.client(), Config{RecordHash: true, Namespaces: consent,
		MaxUnavailable: Budget{Pods: 1}, ProgressDeadline: 100 * time.Millisecond})
	consent.OptedOut = c.ForgetNamespace
	cms := configMaps(c)
	start(t, c)
	consent.Handle(namespaceEvent(t, watch.Modified, "ns", nil))
	consent.Handle(namespaceEvent(t, watch.Modified, "ns", optedIn)) // its ConfigMaps are listed again
	cms.BeginList()
	cms.Handle(watch.Event{Type: watch.Synced, Object: cmSpec{name: "a", uid: "uid-a", selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2}.json(t), ResourceVersion: "42"})
	settle(t, c)
	assert.Empty(t, api.deletedPods(), "a restart before the namespace's other objects were known")

	cms.Handle(watch.Event{Type: watch.Synced, Object: cmSpec{name: "b", uid: "uid-b", selector: ptr("tier=web"), recorded: hashOf(t, v1), data: v2}.json(t), ResourceVersion: "42"})
	cms.EndList()
	require.Eventually(t, func() bool { return m.RoundsHalted.Value() == 2 }, waitFor, time.Millisecond, "both rounds go on once the list has ended")
	assert.ElementsMatch(t, []string{"x-5", "x-6"}, api.deletedPods(), "b's pods that serve nothing, outside the budget; no Ready one")
	assert.Equal(t, 4, api.readyCount(webapp))
}
