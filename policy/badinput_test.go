package policy

// The policy half of the bad-input matrix (issue 7): hostile selectors,
// ConfigMaps of unusual shape and size, malformed objects, repeated and
// out-of-order events, and a ConfigMap deleted during its own round. Each
// case states its outcome: refused (logged with a clear error, counted, no
// request made), skipped (counted, nothing queued), or acted on.

import (
	"encoding/base64"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/internal/testlog"

	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/selector"
	"github.com/k8spatterns/config-watcher/watch"
)

// loggedController is newTestController with its log kept for inspection.
func loggedController(t *testing.T, api API, cfg Config) (*Controller, *Metrics, *testlog.Buffer) {
	cfg.SelectorAnnotation = DefaultSelectorAnnotation
	if cfg.NewBackOff == nil {
		cfg.NewBackOff = fastBackOff
	}
	logs := &testlog.Buffer{}
	m := NewMetrics(metrics.NewRegistry())
	return New(cfg, api, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), m), m, logs
}

// TestBadInputSelectors ensures every hostile selector is refused before any
// request (so nothing can be smuggled into the pod list's query string),
// logged with the reason, counted, and deletes nothing; and that the
// accepted spellings are sent to the API in canonical, escaped form.
func TestBadInputSelectors(t *testing.T) {
	refused := []struct{ name, selector, wantErr string }{
		{"Empty", "", "empty"},
		{"Blank", " \t ", "empty"},
		{"OnlyComma", ",", ""},
		{"SyntaxError", "app in (", ""},
		{"OnlyNotExists", "!app", "positive"},
		{"OnlyNotEquals", "app!=db", "positive"},
		{"OnlyNotIn", "app notin (db)", "positive"},
		{"AmpersandInjection", "app=webapp&labelSelector=", ""},
		{"AmpersandSecondParam", "app=webapp&watch=true", ""},
		{"QuestionMark", "app=webapp?x=1", ""},
		{"Hash", "app=webapp#fragment", ""},
		{"PercentEncodedAmpersand", "app=web%26app", ""},
		{"PercentEncodedEquals", "app%3Dwebapp", ""},
		{"NonASCIIValue", "app=wébapp", ""},
		{"NonASCIIKey", "äpp=webapp", ""},
		{"EmojiValue", "app=🙂", ""},
		{"NewlineInside", "app=webapp\nrole=db", ""},
		{"NULByte", "app=web\x00app", ""},
		{"OverlongValue", "app=" + strings.Repeat("v", 64), ""},
		{"OverlongKeyName", strings.Repeat("k", 64) + "=v", ""},
		{"OverlongKeyPrefix", strings.Repeat("p", 254) + "/app=v", ""},
		{"Huge", "app in (" + strings.Repeat("a,", 50000) + "a", ""},
		{"NumericGreater", "replicas>1", ""},
		{"EmptyKey", "=webapp", ""},
		{"Semicolon", "app=webapp;role=db", ""},
		{"QuotedValue", `app="webapp"`, ""},
		// Too broad (issue 37; issue 36 item 5): every pod of a kind, or
		// every pod that merely has a label. Each with a hint.
		{"OnlyExistence", "app", "give the value, e.g. app=webapp"},
		{"OnlyExistenceSeveral", "app,tier", "give the value, e.g. app=webapp"},
		{"EveryDeploymentPod", "pod-template-hash", "labels the system sets"},
		{"OneReplicaSetWithoutConsent", "pod-template-hash=7466656dc8", "labels the system sets"},
		{"EveryStatefulSetOrDaemonSetPod", "controller-revision-hash", "labels the system sets"},
		{"EveryStatefulSetPodByName", "statefulset.kubernetes.io/pod-name", "labels the system sets"},
		{"EveryJobPod", "batch.kubernetes.io/job-name", "labels the system sets"},
	}
	for _, tt := range refused {
		t.Run("Refused/"+tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			c, m, logs := loggedController(t, api.client(), Config{RecordHash: true})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr(tt.selector), recorded: hashOf(t, v1), data: v2})
			settle(t, c)
			assert.Empty(t, api.requests, "a refused selector makes no request")
			assert.Equal(t, uint64(1), m.InvalidSelectors.Value())
			assert.Equal(t, uint64(1), m.Reconciles.Value(resultRefused))
			out := logs.String()
			assert.Contains(t, out, "refusing to restart pods: invalid selector")
			assert.Contains(t, out, "err=")
			if tt.wantErr != "" {
				assert.Contains(t, out, tt.wantErr)
			}
			assert.Less(t, len(out), 4096, "a huge selector is truncated in the log")
		})
	}

	web := []string{"webapp-1", "webapp-2", "webapp-3"}
	accepted := []struct {
		name, selector, wantQuery string
		wantDeleted               []string
	}{
		{"Plain", "app=webapp", "app=webapp", web},
		{"Spaces", "  app = webapp  ", "app=webapp", web},
		{"DoubleEquals", "app==webapp", "app=webapp", web},
		{"In", "app in (webapp)", "app in (webapp)", web},
		{"PositiveAndNegative", "app=webapp,!legacy", "app=webapp,!legacy", web},
		{"PrefixedKeyNoMatch", "example.com/app=webapp", "example.com/app=webapp", nil},
	}
	for _, tt := range accepted {
		t.Run("Accepted/"+tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			c, m := newTestController(t, api.client(), Config{RecordHash: true})
			start(t, c)
			handle(t, c, watch.Modified, cmSpec{selector: ptr(tt.selector), recorded: hashOf(t, v1), data: v2})
			settle(t, c)
			assert.Zero(t, m.InvalidSelectors.Value())
			assert.ElementsMatch(t, tt.wantDeleted, api.deletedPods(), "the pods it selects, matched as the API server does")
			assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
			sel, err := selector.Parse(tt.selector)
			require.NoError(t, err)
			assert.Equal(t, tt.wantQuery, sel.String(), "the form a selected list sends")
		})
	}
}

// TestBadInputConfigMapShapes ensures ConfigMaps of unusual shape are handled
// as docs/design.md#decisions says: 1 MiB of data and binaryData-only changes are acted on;
// null, missing and empty data are the same (no change); a null or garbage
// record is no record (adopted, nothing deleted); a null selector annotation
// is an empty selector (refused); non-string values still hash apart.
func TestBadInputConfigMapShapes(t *testing.T) {
	big1 := map[string]string{"big": strings.Repeat("A", 1<<20)}
	big2 := map[string]string{"big": strings.Repeat("A", 1<<20-1) + "B"}
	bin := func(s string) map[string]string {
		return map[string]string{"blob": base64.StdEncoding.EncodeToString([]byte(s))}
	}
	shapeHash := func(t *testing.T, raw string) string {
		cm, err := parseObject([]byte(raw), kindConfigMap, DefaultSelectorAnnotation, nil)
		require.NoError(t, err)
		return cm.hash.text()
	}
	const head = `{"kind":"ConfigMap","metadata":{"name":"webapp-config","namespace":"ns","uid":"cm-uid-1","resourceVersion":"42","annotations":{"k8spatterns.io/podDeleteSelector":"app=webapp"`

	t.Run("OneMiBDataChangeActedOn", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...)
		c, m, logs := loggedController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, big1), data: big2})
		settle(t, c)
		assert.Len(t, api.deletedPods(), 3)
		assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
		assert.NotContains(t, logs.String(), "AAAAAAAA", "data never reaches the log")
	})
	t.Run("OneMiBSameDataNothing", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...)
		c, _ := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, big1), data: big1})
		settle(t, c)
		assert.Empty(t, api.requests)
	})
	t.Run("BinaryDataOnlyChangeActedOn", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...)
		c, m := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		old, err := parseObject(cmSpec{selector: ptr("app=webapp"), binaryData: bin("one")}.json(t), kindConfigMap, DefaultSelectorAnnotation, nil)
		require.NoError(t, err)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: old.hash.text(), binaryData: bin("two")})
		settle(t, c)
		assert.Len(t, api.deletedPods(), 3)
		assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
	})
	t.Run("BinaryDataOnlySameNothing", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...)
		c, _ := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		old, err := parseObject(cmSpec{selector: ptr("app=webapp"), binaryData: bin("one")}.json(t), kindConfigMap, DefaultSelectorAnnotation, nil)
		require.NoError(t, err)
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: old.hash.text(), binaryData: bin("one")})
		settle(t, c)
		assert.Empty(t, api.requests)
	})
	t.Run("NullMissingEmptyDataAreOneState", func(t *testing.T) {
		missing := shapeHash(t, head+`}}}`)
		assert.Equal(t, missing, shapeHash(t, head+`}},"data":null}`))
		assert.Equal(t, missing, shapeHash(t, head+`}},"data":{}}`))
		assert.Equal(t, missing, shapeHash(t, head+`}},"data":{},"binaryData":null}`))
		assert.NotEqual(t, missing, shapeHash(t, head+`}},"data":{"k":""}}`), "an empty value is still a key")
	})
	t.Run("NonStringValuesHashApart", func(t *testing.T) {
		s := shapeHash(t, head+`}},"data":{"k":"1"}}`)
		n := shapeHash(t, head+`}},"data":{"k":1}}`)
		arr := shapeHash(t, head+`}},"data":["k","1"]}`)
		assert.NotEqual(t, s, n)
		assert.NotEqual(t, s, arr)
		assert.NotEqual(t, n, arr)
	})
	t.Run("GarbageRecordIsNoRecordAdopted", func(t *testing.T) {
		for _, rec := range []string{"sha256:zz", "md5:abc", "sha256:" + strings.Repeat("0", 63), strings.Repeat("x", 10000)} {
			api := newFakeAPI(t, webPods()...)
			c, m := newTestController(t, api.client(), Config{RecordHash: true})
			start(t, c)
			handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), data: v2, annotations: map[string]string{RestartedForAnnotation: rec}})
			settle(t, c)
			assert.Empty(t, api.deletedPods(), "record %.20q", rec)
			assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes(), "record %.20q is replaced by a real one", rec)
			assert.Equal(t, uint64(1), m.Reconciles.Value(resultAdopted))
		}
	})
	t.Run("NullSelectorAnnotationRefused", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...)
		c, m := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		configMaps(c).Handle(watch.Event{Type: watch.Synced, Object: []byte(`{"metadata":{"name":"webapp-config","namespace":"ns","uid":"u","annotations":{"k8spatterns.io/podDeleteSelector":null,"config-watcher.k8spatterns.io/restarted-for":"` + hashOf(t, v1) + `"}},"data":{"message":"Hello again"}}`)})
		settle(t, c)
		assert.Empty(t, api.requests)
		assert.Equal(t, uint64(1), m.InvalidSelectors.Value())
	})
	t.Run("NullAnnotationsNotOurs", func(t *testing.T) {
		api := newFakeAPI(t, webPods()...)
		c, m := newTestController(t, api.client(), Config{RecordHash: true})
		start(t, c)
		configMaps(c).Handle(watch.Event{Type: watch.Modified, Object: []byte(`{"metadata":{"name":"a","namespace":"ns","uid":"u","annotations":null},"data":null}`)})
		settle(t, c)
		assert.Empty(t, api.requests)
		assert.Zero(t, m.SkippedObjects.Value())
	})
}

// TestBadInputMalformedObjects ensures objects the controller cannot read
// are counted and skipped: no panic, nothing queued, no request.
func TestBadInputMalformedObjects(t *testing.T) {
	for _, raw := range []string{
		``, `null`, `[]`, `"str"`, `42`, `{}`, `not json`, `{"metadata":null}`, `{"metadata":[]}`, `{"metadata":"x"}`,
		`{"metadata":{"name":"x"}}`, `{"metadata":{"namespace":"ns"}}`, `{"metadata":{"name":"","namespace":"ns"}}`,
		`{"metadata":{"name":null,"namespace":null}}`, `{"metadata":{"name":1,"namespace":2}}`[:20],
	} {
		api := newFakeAPI(t, webPods()...)
		c, m := newTestController(t, api.client(), Config{RecordHash: true})
		require.NotPanics(t, func() {
			configMaps(c).Handle(watch.Event{Type: watch.Modified, Object: []byte(raw)})
			configMaps(c).Handle(watch.Event{Type: watch.Deleted, Object: []byte(raw)})
		}, "object %q", raw)
		assert.Equal(t, uint64(2), m.SkippedObjects.Value(), "object %q", raw)
		assert.True(t, c.queue.idle(), "object %q", raw)
		assert.Empty(t, api.requests)
	}
}

// TestBadInputRepeatedEvents ensures the same event delivered twice, or a
// relist repeating what the watch said, restarts the pods once.
func TestBadInputRepeatedEvents(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	settle(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v2}) // our record
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v2})
	c.all[kindConfigMap].BeginList()
	handle(t, c, watch.Synced, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v2})
	c.all[kindConfigMap].EndList()
	settle(t, c)
	assert.Len(t, api.deletedPods(), 3)
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))
}

var rvField = regexp.MustCompile(`"resourceVersion":"[^"]*"`)

// handleRV delivers s as an event with resourceVersion rv.
func handleRV(t *testing.T, c *Controller, typ watch.EventType, rv string, s cmSpec) {
	raw := rvField.ReplaceAllString(string(s.json(t)), `"resourceVersion":"`+rv+`"`)
	require.Contains(t, raw, `"resourceVersion":"`+rv+`"`)
	configMaps(c).Handle(watch.Event{Type: typ, Object: []byte(raw), ResourceVersion: rv})
}

// TestBadInputOutOfOrderEvent ensures an event older than one already seen
// (here: the change event, rv 11, replayed after the event of our own record,
// rv 12) does not start a second round for a change already handled, and
// that a duplicate of the record event does nothing either. (It failed before
// the resourceVersion ordering in policy: the replay's older record was
// taken for a new write and the replacements were deleted.)
func TestBadInputOutOfOrderEvent(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, m := newTestController(t, api.client(), Config{RecordHash: true})
	start(t, c)
	handleRV(t, c, watch.Synced, "10", cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
	handleRV(t, c, watch.Modified, "11", cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	settle(t, c)
	require.Len(t, api.deletedPods(), 3)
	for _, n := range []string{"webapp-1b", "webapp-2b", "webapp-3b"} { // the ReplicaSet's replacements
		api.addPod(n, map[string]string{"app": "webapp"})
	}
	handleRV(t, c, watch.Modified, "12", cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v2}) // our record
	handleRV(t, c, watch.Modified, "11", cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2}) // replayed, out of order
	handleRV(t, c, watch.Modified, "12", cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v2}) // duplicate
	settle(t, c)
	assert.Len(t, api.deletedPods(), 3, "an out-of-order replay of the change event restarted the pods again")
	assert.Equal(t, uint64(1), m.Reconciles.Value(resultRestarted))

	// A newer change after all that is still acted on.
	handleRV(t, c, watch.Modified, "13", cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v2), data: v1})
	settle(t, c)
	assert.Len(t, api.deletedPods(), 6)
}

// TestBadInputDeletedDuringRound ensures a ConfigMap deleted while its round
// runs stops the round before its next restart: its data is gone, nothing
// is recorded, nothing is retried, and no pod is deleted twice.
func TestBadInputDeletedDuringRound(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	var c *Controller
	var once sync.Once
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete {
			once.Do(func() {
				handle(t, c, watch.Deleted, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
			})
		}
		return 0, "", false
	}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxConcurrentRestarts: 1})
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	require.Eventually(t, func() bool { return m.Reconciles.Value(resultUnchanged) == 1 }, waitFor, time.Millisecond)
	settle(t, c)
	assert.Equal(t, []string{"webapp-1"}, api.deletedPods(), "the round stopped after the deletion in flight")
	assert.Zero(t, m.Reconciles.Value(resultError), "nothing to retry")
	assert.Empty(t, api.recordedHashes(), "nothing recorded for data that is gone")
}
