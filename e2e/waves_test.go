//go:build e2e

package e2e

// The tests of this file check restarts in waves (MAX_UNAVAILABLE,
// PROGRESS_DEADLINE) on the real control plane. It has no kubelet, so no pod
// ever becomes Ready by itself: a stand-in plays the kubelet's part in
// readiness through the pods/status subresource, and one pod watch is the
// test's view of how many pods serve.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	webappSelector = "app=webapp"
	// startupDelay is how long after a pod appears the stand-in reports it
	// Ready: long enough that a controller which does not wait for Ready
	// visibly takes the Ready pods below the floor.
	startupDelay = 500 * time.Millisecond
	// sampleEvery is how often the floor is sampled, as a monitoring
	// system scraping the endpoints would.
	sampleEvery = 50 * time.Millisecond
)

// TestWavesKeepReadyPodsAboveTheFloor ensures a data change restarts 8 Ready
// pods with MAX_UNAVAILABLE=2 without ever leaving fewer than 6 Ready, each
// old pod deleted once, and the round recorded.
func TestWavesKeepReadyPodsAboveTheFloor(t *testing.T) {
	const replicas, maxUnavailable = 8, 2
	f := webappInWaves(t, replicas, fmt.Sprintf("MAX_UNAVAILABLE=%d", maxUnavailable))
	sampler := f.pods.sampleServing(sampleEvery)

	mergePatch(t, f.ns, "webapp-config", `{"data":{"message":"Hello, waves"}}`)
	waitDeleted(t, f.ns, adminUser, f.original)
	f.waitRoundDone(t, replicas)
	f.waitServing(t, replicas)
	sampler.stop().assertAtLeast(t, replicas-maxUnavailable)
	f.c.Settle(t, f.ns)
	assertDeletedOnce(t, f.ns, adminUser, f.original)
	for _, p := range livePods(t, f.ns, webappSelector) {
		assert.NotContains(t, f.original, p, "pod %s survived the data change", p.name)
	}
}

// TestWavesHaltOnNeverReadyThenFixRestartsThemFirst ensures data whose pods
// never become Ready stops the round after the budget's 2 restarts: a
// RolloutHalted Warning Event once PROGRESS_DEADLINE passes, the halted-rounds
// gauge at 1, the intent kept and nothing recorded; and that corrected data
// then restarts the 2 not-Ready replacements before any Ready pod, completes,
// and takes the gauge back to 0, Ready pods never below 6 throughout.
func TestWavesHaltOnNeverReadyThenFixRestartsThemFirst(t *testing.T) {
	const replicas, maxUnavailable = 8, 2
	f := webappInWaves(t, replicas, fmt.Sprintf("MAX_UNAVAILABLE=%d", maxUnavailable), "PROGRESS_DEADLINE=5s")
	sampler := f.pods.sampleServing(sampleEvery)

	mergePatch(t, f.ns, "webapp-config", `{"data":{"message":""}}`) // the app cannot start with it
	halted := waitConfigMapEvent(t, f.ns, "webapp-config", "Warning", "RolloutHalted")
	t.Logf("RolloutHalted: %s", halted.Message)
	first := successfulPodDeletes(t, f.ns)
	require.Len(t, first, maxUnavailable, "restarts before the halt: %v", first)
	for _, e := range first {
		assert.Contains(t, podNames(f.original), e.ObjectRef.Name, "restarted before the halt: %v", e)
	}
	assert.Contains(t, halted.Message, fmt.Sprintf("%d of %d", maxUnavailable, replicas), "the Event says how far the round got")
	eventually(t, waitTimeout, "config_watcher_rounds_halted = 1", func() (bool, string) {
		v := f.c.Metric(t, "config_watcher_rounds_halted")
		return v == 1, fmt.Sprint(v)
	})
	var notReady []pod
	eventually(t, waitTimeout, "the halted round's replacements, not Ready", func() (bool, string) {
		notReady = f.pods.notServing()
		return len(notReady) == maxUnavailable, fmt.Sprint(notReady)
	})
	cm := getConfigMap(t, f.ns, "webapp-config")
	assert.Equal(t, f.adopted, cm.Metadata.Annotations[restartedAnnotation], "a halted round records nothing")
	assert.Contains(t, cm.Metadata.Annotations, restartingAnnotation, "a halted round keeps its intent")
	require.Len(t, successfulPodDeletes(t, f.ns), maxUnavailable, "a halted round restarts nothing more")

	badHash, _, _ := strings.Cut(cm.Metadata.Annotations[restartingAnnotation], "/")

	// The fix comes once both replacements serve nothing (not Ready for 10 s since
	// their creationTimestamp, in whole seconds: the stand-in writes no condition on
	// a pod it never makes Ready): its first wave restarts both, outside the budget.
	// Sooner, a replacement created in a later second than the other qualifies a
	// second later, and the budget may let a Ready pod go between them, as it
	// should (seen once: 34.0 s and 35.0 s).
	eventually(t, waitTimeout, "the replacements not Ready for 10 s", func() (bool, string) {
		created := f.pods.created(notReady)
		for _, at := range created {
			if at.IsZero() || time.Since(at) <= 10*time.Second {
				return false, fmt.Sprint(created)
			}
		}
		return true, ""
	})
	mergePatch(t, f.ns, "webapp-config", `{"data":{"message":"Hello, fixed"}}`)
	assert.NotEqual(t, badHash, f.waitRoundDone(t, replicas), "recorded the data that never became Ready")
	f.waitServing(t, replicas)
	sampler.stop().assertAtLeast(t, replicas-maxUnavailable)
	f.c.Settle(t, f.ns)
	deletes := successfulPodDeletes(t, f.ns)
	require.Greater(t, len(deletes), 2*maxUnavailable, "deletions: %v", deletes)
	assert.ElementsMatch(t, podNames(notReady), podNames(podsOf(deletes[maxUnavailable:2*maxUnavailable])),
		"the corrected data's first restarts must be the not-Ready replacements; deletions in order: %v", deletes)
	assertDeletedOnce(t, f.ns, adminUser, append(slices.Clone(f.original), notReady...))
	eventually(t, waitTimeout, "config_watcher_rounds_halted = 0", func() (bool, string) {
		v := f.c.Metric(t, "config_watcher_rounds_halted")
		return v == 0, fmt.Sprint(v)
	})
}

// TestWavesHaltedRoundGoesOnWhenPodsBecomeReady ensures a round halted on
// replacements that are not Ready goes on by itself, without a data change,
// once they become Ready (a slow start, a dependency back): a RolloutResumed
// Event, every old pod restarted once, Ready pods never below 6.
func TestWavesHaltedRoundGoesOnWhenPodsBecomeReady(t *testing.T) {
	const replicas, maxUnavailable = 8, 2
	var dependencyBack atomic.Bool
	f := webappStartingReadyIf(t, replicas, func(data map[string]string) bool { return data["message"] != "Hello, slow" || dependencyBack.Load() },
		fmt.Sprintf("MAX_UNAVAILABLE=%d", maxUnavailable), "PROGRESS_DEADLINE=3s")
	sampler := f.pods.sampleServing(sampleEvery)

	mergePatch(t, f.ns, "webapp-config", `{"data":{"message":"Hello, slow"}}`)
	waitConfigMapEvent(t, f.ns, "webapp-config", "Warning", "RolloutHalted")
	require.Len(t, successfulPodDeletes(t, f.ns), maxUnavailable)
	dependencyBack.Store(true)
	for _, p := range f.pods.notServing() {
		f.kubelet.reportReady(watchedPod{Metadata: objectMeta{Name: p.name, UID: p.uid}})
	}
	resumed := waitConfigMapEvent(t, f.ns, "webapp-config", "Normal", "RolloutResumed")
	assert.Contains(t, resumed.Message, fmt.Sprintf("Resumed after %d of %d pods", maxUnavailable, replicas))
	f.waitRoundDone(t, replicas)
	f.waitServing(t, replicas)
	sampler.stop().assertAtLeast(t, replicas-maxUnavailable)
	f.c.Settle(t, f.ns)
	assertDeletedOnce(t, f.ns, adminUser, f.original)
	assert.Zero(t, f.c.Metric(t, "config_watcher_rounds_halted"))
}

// TestWavesGoOnOnceTheDeploymentScalesDown ensures a round over 8 Ready pods
// with MAX_UNAVAILABLE=2, whose Deployment is scaled to 4 right after the first
// wave while its replacements are still starting, goes on once the pods left
// are Ready: the round is recorded within scaleDownBound of that, far under the
// minute a waiting round takes to look by itself (the scale-down's deletions
// come within a second of the round's last read of the scale, which told 8),
// each old pod the round still selects restarted once, and no replacement.
func TestWavesGoOnOnceTheDeploymentScalesDown(t *testing.T) {
	const replicas, scaledTo, maxUnavailable = 8, 4, 2
	// scaleDownBound is far under the minute of a round's own looks, and
	// far over what the round needs (a wave, and 0.5 s for its replacements).
	const scaleDownBound = 30 * time.Second
	var released atomic.Bool
	f := webappStartingReadyIf(t, replicas, func(data map[string]string) bool { return data["message"] != "Hello, fewer" || released.Load() },
		fmt.Sprintf("MAX_UNAVAILABLE=%d", maxUnavailable))

	mergePatch(t, f.ns, "webapp-config", `{"data":{"message":"Hello, fewer"}}`)
	eventually(t, waitTimeout, "the first wave's deletions", func() (bool, string) {
		n, state := f.pods.serving()
		return n <= replicas-maxUnavailable, state
	})
	firstWave := time.Now()
	code, body, err := proxyDo(t.Context(), http.MethodPatch, "/apis/apps/v1/namespaces/"+f.ns+"/deployments/webapp/scale",
		"application/merge-patch+json", []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, scaledTo)))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "%s", body)
	eventually(t, waitTimeout, fmt.Sprintf("%d pods left by the scale-down", scaledTo), func() (bool, string) {
		serving, state := f.pods.serving()
		return serving+len(f.pods.notServing()) == scaledTo, state
	})
	t.Logf("the scale-down's deletions seen %s after the first wave's", time.Since(firstWave).Round(time.Millisecond))

	released.Store(true)
	for _, p := range f.pods.notServing() {
		f.kubelet.reportReady(watchedPod{Metadata: objectMeta{Name: p.name, UID: p.uid}})
	}
	readyAt := time.Now()
	eventually(t, scaleDownBound, "the round recorded, its intent removed", func() (bool, string) {
		cm := getConfigMap(t, f.ns, "webapp-config")
		recorded, intent := cm.Metadata.Annotations[restartedAnnotation], cm.Metadata.Annotations[restartingAnnotation]
		return recorded != f.adopted && intent == "", fmt.Sprintf("recorded %q, intent %q", recorded, intent)
	})
	t.Logf("round recorded %s after the pods left were Ready", time.Since(readyAt).Round(time.Millisecond))
	f.c.Settle(t, f.ns)
	deletes := deletesByPod(podDeletes(t, f.ns, adminUser))
	assert.GreaterOrEqual(t, len(deletes), scaledTo, "the first wave, and the old pods the scale-down left: %v", deletes)
	for name, n := range deletes {
		assert.Equal(t, 1, n, "pod %s deleted %d times", name, n)
		assert.Contains(t, podNames(f.original), name, "a pod created after the change was restarted")
	}
}

// TestReplacementsNotReadyAfterTheLastRestart ensures that with
// MAX_UNAVAILABLE=100%, where no wave waits, replacements still not Ready
// PROGRESS_DEADLINE after the round's last restart get a Warning Event and
// the counter, the round having recorded its data.
func TestReplacementsNotReadyAfterTheLastRestart(t *testing.T) {
	const replicas = 2
	f := webappInWaves(t, replicas, "MAX_UNAVAILABLE=100%", "PROGRESS_DEADLINE=3s")
	mergePatch(t, f.ns, "webapp-config", `{"data":{"message":""}}`) // the app cannot start with it
	f.waitRoundDone(t, replicas)
	warning := waitConfigMapEvent(t, f.ns, "webapp-config", "Warning", "ReplacementsNotReady")
	assert.Contains(t, warning.Message, fmt.Sprintf("%d replacement(s) not Ready 3s after the last restart", replicas))
	assert.Equal(t, float64(1), f.c.Metric(t, "config_watcher_replacements_not_ready_total"))
}

// --- a webapp whose pods become Ready -------------------------------------------------------

// wavesFixture is the book's webapp in a namespace of its own, its pods made
// Ready by a kubelet stand-in unless its message is empty, followed by a pod
// watch, and a controller that has adopted webapp-config.
type wavesFixture struct {
	ns       string
	c        *controllerProc
	kubelet  *kubeletStandIn
	pods     *podWatch
	original []pod
	adopted  string // restarted-for when the test began
}

func webappInWaves(t *testing.T, replicas int, settings ...string) *wavesFixture {
	t.Helper()
	return webappStartingReadyIf(t, replicas, func(data map[string]string) bool { return data["message"] != "" }, settings...)
}

// webappStartingReadyIf is webappInWaves whose stand-in reports a new pod
// Ready if startsReady holds for the ConfigMap's data when the pod appears.
func webappStartingReadyIf(t *testing.T, replicas int, startsReady func(map[string]string) bool, settings ...string) *wavesFixture {
	t.Helper()
	f := &wavesFixture{ns: newNamespace(t)}
	f.kubelet = startKubeletStandIn(t, f.ns, "webapp-config", startsReady)
	f.pods = watchPods(t, f.ns, webappSelector, f.kubelet.podAdded)
	f.original = webappWith(t, f.ns, replicas)
	f.waitServing(t, replicas)
	f.c = startController(t, controllerOpts{namespace: f.ns, extraEnv: settings})
	f.c.WaitReady(t)
	f.adopted = waitRestartedFor(t, f.ns, "webapp-config", "")
	require.Empty(t, podDeletes(t, f.ns, adminUser), "adopting a ConfigMap must delete nothing")
	return f
}

// waitServing waits until the watch shows n Ready, non-terminating pods.
func (f *wavesFixture) waitServing(t *testing.T, n int) {
	t.Helper()
	eventually(t, waitTimeout, fmt.Sprintf("%d Ready pods in %s", n, f.ns), func() (bool, string) {
		serving, state := f.pods.serving()
		return serving == n, state
	})
}

// waitRoundDone waits until webapp-config records data other than at the
// start and carries no intent, and the PodsRestarted Event of the round that
// recorded it says it restarted n pods; it returns the record.
func (f *wavesFixture) waitRoundDone(t *testing.T, n int) string {
	t.Helper()
	recorded := waitRestartedFor(t, f.ns, "webapp-config", f.adopted)
	eventually(t, waitTimeout, "the round's intent removed", func() (bool, string) {
		v, ok := getConfigMap(t, f.ns, "webapp-config").Metadata.Annotations[restartingAnnotation]
		return !ok, v
	})
	done := waitConfigMapEvent(t, f.ns, "webapp-config", "Normal", "PodsRestarted")
	assert.Contains(t, done.Message, fmt.Sprintf("Restarted %d pod(s)", n))
	assert.Contains(t, done.Message, recorded[:min(len(recorded), len("sha256:")+12)], "the round that ended recorded other data")
	return recorded
}

// successfulPodDeletes returns the controller's successful pod deletions in ns,
// in the order the API server received them.
func successfulPodDeletes(t *testing.T, ns string) []auditEvent {
	t.Helper()
	var ok []auditEvent
	for _, e := range podDeletes(t, ns, adminUser) {
		if e.OK() {
			ok = append(ok, e)
		}
	}
	sort.SliceStable(ok, func(i, j int) bool { return ok[i].Received.Before(ok[j].Received) })
	return ok
}

func podsOf(deletes []auditEvent) []pod {
	var pods []pod
	for _, e := range deletes {
		pods = append(pods, pod{name: e.ObjectRef.Name})
	}
	return pods
}

func podNames(pods []pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.name)
	}
	return names
}

// --- the API through the shared proxy -------------------------------------------------------

// proxyDo sends one request to the API through the shared proxy (as admin) and
// returns the answer's status and body.
func proxyDo(ctx context.Context, method, path, contentType string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, env.proxyURL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// --- the pod watch --------------------------------------------------------------------------

// watchedPod is what the tests read of a pod.
type watchedPod struct {
	Metadata objectMeta    `json:"metadata"`
	Status   podConditions `json:"status"`
}

func (p watchedPod) ready() bool { return p.Status.ready() }

// serving is what MAX_UNAVAILABLE protects: Ready and not terminating.
func (p watchedPod) serving() bool { return p.ready() && p.Metadata.DeletionTimestamp == nil }

// podWatch follows the pods of a namespace that a selector matches through one
// watch. A watch delivers a namespace's pod changes in the order they were
// made, so the state after each event is a state the cluster was in: the
// lowest number of serving pods over every event is exact, not sampled.
type podWatch struct {
	ns, selector string
	onAdded      func(watchedPod) // each new pod, from the watch's goroutine

	mu     sync.Mutex
	pods   map[string]watchedPod // by name, as last seen
	rv     string
	events int
	// Since sampleServing: the lowest number of serving pods after any event.
	tracking        bool
	lowest          int
	lowestAt        string
	lowestAtEventNo int
}

// watchPods starts the watch and returns once the API server accepted it, so
// that every pod created afterwards comes as an ADDED event. It runs until
// the test ends; a watch that fails fails the test.
func watchPods(t *testing.T, ns, selector string, onAdded func(watchedPod)) *podWatch {
	t.Helper()
	requireCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	w := &podWatch{ns: ns, selector: selector, onAdded: onAdded, pods: map[string]watchedPod{}}
	body, err := w.open(ctx)
	if err != nil {
		cancel()
		t.Fatalf("pod watch of %s: %v", ns, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			err := w.read(body)
			if ctx.Err() != nil {
				return
			}
			if err == nil { // the server ended the watch: resume where it stopped
				body, err = w.open(ctx)
			}
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("pod watch of %s: %v", ns, err)
				}
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func (w *podWatch) open(ctx context.Context) (io.ReadCloser, error) {
	q := url.Values{"watch": {"true"}, "labelSelector": {w.selector}}
	w.mu.Lock()
	if w.rv != "" {
		q.Set("resourceVersion", w.rv)
	}
	w.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, env.proxyURL+"/api/v1/namespaces/"+w.ns+"/pods?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("watch answered %s: %s", resp.Status, b)
	}
	return resp.Body, nil
}

// read applies the stream's events until it ends: nil at a clean end.
func (w *podWatch) read(body io.ReadCloser) error {
	defer body.Close()
	dec := json.NewDecoder(body)
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if ev.Type == "ERROR" {
			return fmt.Errorf("ERROR event: %s", ev.Object)
		}
		var p watchedPod
		if err := json.Unmarshal(ev.Object, &p); err != nil {
			return fmt.Errorf("%s event: %w", ev.Type, err)
		}
		w.apply(ev.Type, p)
	}
}

func (w *podWatch) apply(typ string, p watchedPod) {
	w.mu.Lock()
	w.rv = p.Metadata.ResourceVersion
	_, known := w.pods[p.Metadata.Name]
	switch typ {
	case "ADDED", "MODIFIED":
		w.pods[p.Metadata.Name] = p
	case "DELETED":
		delete(w.pods, p.Metadata.Name)
	}
	w.events++
	if n := w.servingLocked(); w.tracking && n < w.lowest {
		w.lowest, w.lowestAt, w.lowestAtEventNo = n, w.describeLocked(), w.events
	}
	w.mu.Unlock()
	if typ == "ADDED" && !known && w.onAdded != nil {
		w.onAdded(p)
	}
}

func (w *podWatch) servingLocked() int {
	n := 0
	for _, p := range w.pods {
		if p.serving() {
			n++
		}
	}
	return n
}

// describeLocked lists the pods by state, for failure messages.
func (w *podWatch) describeLocked() string {
	var ready, notReady, terminating []string
	for name, p := range w.pods {
		switch {
		case p.Metadata.DeletionTimestamp != nil:
			terminating = append(terminating, name)
		case p.ready():
			ready = append(ready, name)
		default:
			notReady = append(notReady, name)
		}
	}
	for _, s := range [][]string{ready, notReady, terminating} {
		sort.Strings(s)
	}
	return fmt.Sprintf("Ready %v, not Ready %v, terminating %v", ready, notReady, terminating)
}

// serving returns the number of serving pods and a description of every pod.
func (w *podWatch) serving() (int, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.servingLocked(), w.describeLocked()
}

// created returns the creationTimestamp of each of pods, zero for one not seen.
func (w *podWatch) created(pods []pod) map[string]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	at := make(map[string]time.Time, len(pods))
	for _, p := range pods {
		at[p.name] = w.pods[p.name].Metadata.CreationTimestamp
	}
	return at
}

// notServing returns the non-terminating pods that are not Ready.
func (w *podWatch) notServing() []pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	var pods []pod
	for _, p := range w.pods {
		if p.Metadata.DeletionTimestamp == nil && !p.ready() {
			pods = append(pods, pod{p.Metadata.Name, p.Metadata.UID})
		}
	}
	return pods
}

// floor is the lowest number of serving pods seen while sampling.
type floor struct {
	samples   int
	sampled   int // lowest sample
	sampledAt string
	exact     int // lowest after any watch event
	exactAt   string
}

// servingSampler reads the watch's number of serving pods at a fixed period.
type servingSampler struct {
	w    *podWatch
	quit chan struct{}
	done chan floor
}

// sampleServing starts sampling every period, and tracking the lowest number
// after every event, until stop.
func (w *podWatch) sampleServing(period time.Duration) *servingSampler {
	w.mu.Lock()
	w.tracking, w.lowest, w.lowestAt = true, w.servingLocked(), w.describeLocked()
	w.mu.Unlock()
	s := &servingSampler{w: w, quit: make(chan struct{}), done: make(chan floor, 1)}
	go func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		f := floor{sampled: -1}
		for {
			select {
			case <-s.quit:
				s.done <- f
				return
			case <-tick.C:
				n, state := w.serving()
				f.samples++
				if f.sampled < 0 || n < f.sampled {
					f.sampled, f.sampledAt = n, state
				}
			}
		}
	}()
	return s
}

// assertAtLeast checks that neither the samples nor the state after any watch
// event had fewer than min serving pods.
func (f floor) assertAtLeast(t *testing.T, min int) {
	t.Helper()
	t.Logf("Ready pods: lowest %d in %d samples every %s, lowest %d after any of the watch's events (%s)",
		f.sampled, f.samples, sampleEvery, f.exact, f.exactAt)
	require.Positive(t, f.samples, "the sampler took no sample")
	assert.GreaterOrEqual(t, f.sampled, min, "sampled Ready pods fell below the floor (%s)", f.sampledAt)
	assert.GreaterOrEqual(t, f.exact, min, "Ready pods fell below the floor after a watch event (%s)", f.exactAt)
}

func (s *servingSampler) stop() floor {
	close(s.quit)
	f := <-s.done
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	s.w.tracking = false
	f.exact = s.w.lowest
	f.exactAt = fmt.Sprintf("event %d of %d: %s", s.w.lowestAtEventNo, s.w.events, s.w.lowestAt)
	return f
}

// --- the kubelet stand-in -------------------------------------------------------------------

// kubeletStandIn plays a kubelet's part in readiness: startupDelay after a pod
// appears it reports the pod Running and Ready through pods/status, as a
// kubelet does once the container started and its readiness probe passed;
// unless the ConfigMap's data the pod starts with keeps the app from becoming
// Ready (startsReady false), then the pod stays not Ready for good, as a pod
// crash-looping on its environment does.
//
// The data is read from the API when the pod appears in the watch, a moment
// after its creation: like a container's environment, fixed at start. The
// tests change the data only while no pod is being created (before the
// round, or once a round halted), so what it reads is the data the pod was
// created under.
//
// What the API server (v1.37.2) accepts on the status of an unbound pod (no
// spec.nodeName: no scheduler here): a strategic merge patch setting
// phase Running and the conditions Ready and ContainersReady to "True" is
// taken from an admin as it is, with no node, no podIP, no containerStatuses
// and no startTime. Deleting such a pod still removes it at once (grace 0:
// unbound), Ready or not.
type kubeletStandIn struct {
	t             *testing.T
	ns, configMap string
	startsReady   func(data map[string]string) bool
	ctx           context.Context
	wg            sync.WaitGroup
}

func startKubeletStandIn(t *testing.T, ns, configMap string, startsReady func(map[string]string) bool) *kubeletStandIn {
	ctx, cancel := context.WithCancel(context.Background())
	k := &kubeletStandIn{t: t, ns: ns, configMap: configMap, startsReady: startsReady, ctx: ctx}
	t.Cleanup(func() { cancel(); k.wg.Wait() })
	return k
}

// podAdded is the watch's hook: it decides, and reports Ready later.
func (k *kubeletStandIn) podAdded(p watchedPod) {
	if p.ready() {
		return
	}
	code, body, err := proxyDo(k.ctx, http.MethodGet, "/api/v1/namespaces/"+k.ns+"/configmaps/"+k.configMap, "", nil)
	if err != nil || code != http.StatusOK {
		if k.ctx.Err() == nil {
			k.t.Errorf("kubelet stand-in: read %s for pod %s: %d %v %s", k.configMap, p.Metadata.Name, code, err, body)
		}
		return
	}
	var cm configMap
	if err := json.Unmarshal(body, &cm); err != nil {
		k.t.Errorf("kubelet stand-in: decode %s: %v", k.configMap, err)
		return
	}
	if !k.startsReady(cm.Data) {
		return
	}
	k.wg.Add(1)
	time.AfterFunc(startupDelay, func() {
		defer k.wg.Done()
		k.reportReady(p)
	})
}

func (k *kubeletStandIn) reportReady(p watchedPod) {
	if k.ctx.Err() != nil {
		return
	}
	now := time.Now().UTC().Format(time.RFC3339)
	patch := fmt.Sprintf(`{"metadata":{"uid":%q},"status":{"phase":"Running","conditions":[`+
		`{"type":"ContainersReady","status":"True","lastTransitionTime":%q},`+
		`{"type":"Ready","status":"True","lastTransitionTime":%q}]}}`, p.Metadata.UID, now, now)
	code, body, err := proxyDo(k.ctx, http.MethodPatch, "/api/v1/namespaces/"+k.ns+"/pods/"+p.Metadata.Name+"/status",
		"application/strategic-merge-patch+json", []byte(patch))
	switch {
	case k.ctx.Err() != nil:
	case err != nil:
		k.t.Errorf("kubelet stand-in: report %s Ready: %v", p.Metadata.Name, err)
	case code == http.StatusNotFound,
		code == http.StatusUnprocessableEntity && bytes.Contains(body, []byte("metadata.uid")):
		// Restarted before it became Ready (422 on metadata.uid: the patch met a
		// same-named successor, whose uid it may not change): a kubelet has
		// nothing to report either.
	case code != http.StatusOK:
		k.t.Errorf("kubelet stand-in: report %s Ready: %d %s", p.Metadata.Name, code, body)
	}
}

// --- Events ---------------------------------------------------------------------------------

// coreEvent is the part of a core/v1 Event the tests read.
type coreEvent struct {
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Count   int    `json:"count"`
}

// objectEvents returns the Events recorded on the object of kind and name in ns.
func objectEvents(t *testing.T, kind, ns, name string) []coreEvent {
	t.Helper()
	var l struct {
		Items []coreEvent `json:"items"`
	}
	getJSON(t, ns, &l, "events", "--field-selector", "involvedObject.kind="+kind+",involvedObject.name="+name)
	return l.Items
}

// waitConfigMapEvent waits for an Event of type typ and reason on ConfigMap
// name in ns and returns it.
func waitConfigMapEvent(t *testing.T, ns, name, typ, reason string) coreEvent {
	t.Helper()
	return waitEvent(t, "ConfigMap", ns, name, typ, reason)
}

// waitEvent waits for an Event of type typ and reason on the object of
// kind and name in ns and returns it.
func waitEvent(t *testing.T, kind, ns, name, typ, reason string) coreEvent {
	t.Helper()
	var found coreEvent
	eventually(t, waitTimeout, fmt.Sprintf("a %s Event %s on %s %s", typ, reason, kind, name), func() (bool, string) {
		events := objectEvents(t, kind, ns, name)
		for _, e := range events {
			if e.Type == typ && e.Reason == reason {
				found = e
				return true, ""
			}
		}
		var seen []string
		for _, e := range events {
			seen = append(seen, e.Type+" "+e.Reason+": "+e.Message)
		}
		return false, strings.Join(seen, "; ")
	})
	return found
}
