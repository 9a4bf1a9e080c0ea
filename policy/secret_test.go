package policy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/internal/testlog"
	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/watch"
)

// testKey is the digest key of the tests.
var testKey = []byte("0123456789abcdef0123456789abcdef")

// secretSpec describes a Secret event for tests.
type secretSpec struct {
	name, uid   string
	selector    *string
	data        map[string][]byte
	annotations map[string]string
	typ         string
	rv          string // "" for the next one in sequence
}

func (s secretSpec) json(t *testing.T) []byte {
	ann := map[string]string{}
	for k, v := range s.annotations {
		ann[k] = v
	}
	if s.selector != nil {
		ann[DefaultSelectorAnnotation] = *s.selector
	}
	name, uid, typ, rv := s.name, s.uid, s.typ, s.rv
	if name == "" {
		name = "webapp-secret"
	}
	if uid == "" {
		uid = "secret-uid-1"
	}
	if typ == "" {
		typ = "Opaque"
	}
	if rv == "" {
		rv = strconv.FormatUint(lastRV.Add(1), 10)
	}
	obj := map[string]any{
		"kind": "Secret", "apiVersion": "v1", "type": typ,
		"metadata": map[string]any{"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv, "annotations": ann},
		"data":     s.data, // encoding/json writes []byte as base64, as the API does
	}
	b, err := json.Marshal(obj)
	require.NoError(t, err)
	return b
}

// stateSpec describes an event of a Secret's state ConfigMap as the
// controller writes it: our label, the Secret as owner, and under
// keyID(testKey) a MAC that checks (under another key id, none).
func stateSpec(secret, id, recorded, intent string) cmSpec {
	ann := map[string]string{StateOfSecretAnnotation: secret, DigestKeyIDAnnotation: id}
	if id == keyID(testKey) {
		r, _ := parseDigest(recorded)
		ann[StateMACAnnotation] = stateMAC(testKey, "ns", secret, stored{recorded: r, intent: parseIntent(intent)})
	}
	return cmSpec{name: stateName(secret), uid: "state-uid-" + secret, annotations: ann, recorded: recorded, intent: intent,
		labels: map[string]string{managedByLabel: "config-watcher"}, ownerSecret: secret}
}

// forgedState is a state as a ConfigMap writer could make it: our key id
// copied, a MAC that does not check.
func forgedState(s cmSpec) cmSpec {
	s.annotations = maps.Clone(s.annotations)
	s.annotations[StateMACAnnotation] = strings.Repeat("0", 64)
	return s
}

// secretHashOf is the digest the controller computes for a Secret's data.
func secretHashOf(t *testing.T, data map[string][]byte) string {
	obj, err := parseObject(secretSpec{data: data}.json(t), kindSecret, DefaultSelectorAnnotation, testKey)
	require.NoError(t, err)
	return obj.hash.text()
}

var (
	s1 = map[string][]byte{"password": []byte("hunter2")}
	s2 = map[string][]byte{"password": []byte("correct horse battery staple")}
)

// secretController is a controller watching Secrets in every namespace,
// whose ConfigMaps and Secrets are listed as given before it starts.
func secretController(t *testing.T, api *fakeAPI, cfg Config, configMaps []cmSpec, secrets []secretSpec) *Controller {
	cfg.DigestKey = testKey
	c, _ := newTestController(t, api.client(), cfg)
	listSecrets(t, c, secrets...)
	listConfigMaps(t, c, configMaps...)
	api.seedStates(configMaps)
	start(t, c)
	return c
}

func listConfigMaps(t *testing.T, c *Controller, specs ...cmSpec) {
	list(t, c.ForConfigMaps(""), specs)
}

func listSecrets(t *testing.T, c *Controller, specs ...secretSpec) { list(t, c.ForSecrets(""), specs) }

// list gives h a complete list of the objects specs describe.
func list[S interface{ json(*testing.T) []byte }](t *testing.T, h watch.Handler, specs []S) {
	h.BeginList()
	for _, s := range specs {
		h.Handle(watch.Event{Type: watch.Synced, Object: s.json(t)})
	}
	h.EndList()
}

func handleSecret(t *testing.T, c *Controller, typ watch.EventType, s secretSpec) {
	c.ForSecrets("").Handle(watch.Event{Type: typ, Object: s.json(t)})
}

// TestSecretHashIsPinned pins the digest of Secret data and the key's id:
// the records written with them must keep matching. The digest is over the
// decoded bytes, binary ones included, keyed (the expected values were
// computed apart, with Python's hmac over the stream secretHash describes).
func TestSecretHashIsPinned(t *testing.T) {
	binary := make([]byte, 32)
	for i := range binary {
		binary[i] = byte(0xff - i)
	}
	data := map[string][]byte{"blob": binary, "message": []byte("Hello")}
	assert.Equal(t, "hmac-sha256:99a24d44b0341b5678d65e5bd4b93e43fcd79815faf5cee74d12f3e2f8ad8fa7", secretHashOf(t, data))
	assert.Equal(t, "2b0400e5", keyID(testKey))
}

// TestStateMACIsPinned pins the MAC of a Secret's state (computed apart,
// with Python's hmac over the stream stateMAC describes): state written
// earlier must keep checking.
func TestStateMACIsPinned(t *testing.T) {
	r, _ := parseDigest("hmac-sha256:" + strings.Repeat("ab", 32))
	st := stored{recorded: r, intent: parseIntent("hmac-sha256:" + strings.Repeat("cd", 32) + "/uid-1,uid-2"),
		halted: parseHalt("hmac-sha256:" + strings.Repeat("ef", 32) + "@2026-12-05T07:00:00Z")}
	assert.Equal(t, "0def8f6de2af90b2b5b7e63409145b58e713c92814d76e36eafb25946f9bb25a", stateMAC(testKey, "ns", "webapp-secret", st))
	assert.Equal(t, "565e7d8cb01cd59808f27dcab7280cacb7e0c24f12d4ce4de0dcb55a1f849980", stateMAC(testKey, "ns", "webapp-secret", stored{}))
}

// TestSecretDigestIsBoundToItsObject ensures equal data in another
// Secret, of another name or namespace, digests apart: a digest tells
// nothing of another Secret's value, and a Secret of one's own is no
// oracle for another's.
func TestSecretDigestIsBoundToItsObject(t *testing.T) {
	digestOf := func(namespace, name string) string {
		raw := strings.Replace(string(secretSpec{name: name, data: s1}.json(t)), `"namespace":"ns"`, `"namespace":"`+namespace+`"`, 1)
		obj, err := parseObject([]byte(raw), kindSecret, DefaultSelectorAnnotation, testKey)
		require.NoError(t, err)
		return obj.hash.text()
	}
	base := digestOf("ns", "webapp-secret")
	assert.NotEqual(t, base, digestOf("ns", "other-secret"), "another name")
	assert.NotEqual(t, base, digestOf("other-ns", "webapp-secret"), "another namespace")
	assert.NotEqual(t, digestOf("ns", "ab"), digestOf("nsa", "b"), "the boundary between namespace and name")
}

// TestSecretHashFollowsTheBytes ensures the digest changes with any byte,
// key or key of another digest key, and with nothing else.
func TestSecretHashFollowsTheBytes(t *testing.T) {
	base := secretHashOf(t, map[string][]byte{"a": []byte("x"), "b": []byte("y")})
	assert.Equal(t, base, secretHashOf(t, map[string][]byte{"b": []byte("y"), "a": []byte("x")}), "key order")
	for name, other := range map[string]map[string][]byte{
		"ValueChanged":    {"a": []byte("x"), "b": []byte("z")},
		"BytesMoved":      {"a": []byte("xy"), "b": []byte("")},
		"KeyRenamed":      {"a": []byte("x"), "c": []byte("y")},
		"KeyAdded":        {"a": []byte("x"), "b": []byte("y"), "c": nil},
		"TrailingNewline": {"a": []byte("x"), "b": []byte("y\n")},
	} {
		assert.NotEqual(t, base, secretHashOf(t, other), name)
	}
	obj, err := parseObject(secretSpec{data: s1}.json(t), kindSecret, DefaultSelectorAnnotation, []byte("another key, also 32 bytes long!"))
	require.NoError(t, err)
	assert.NotEqual(t, secretHashOf(t, s1), obj.hash.text(), "another key")
	assert.NotEqual(t, hashOf(t, map[string]string{"password": "hunter2"}), secretHashOf(t, s1), "a ConfigMap's digest")
}

// TestSecretRecordingsDigest replays Secret events recorded from a real API
// server: a data change (binary, stringData, a TLS rotation, a registry
// credential) changes the digest, an annotation edit does not; state
// annotations on a Secret itself are never read.
func TestSecretRecordingsDigest(t *testing.T) {
	// digests returns the digest of each event but BOOKMARKs, in order.
	digests := func(file string) []string {
		f, err := os.Open("../testdata/recorded/" + file)
		require.NoError(t, err)
		defer f.Close()
		var out []string
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			ev := gjson.Get(sc.Text(), "object")
			if gjson.Get(sc.Text(), "type").String() == "BOOKMARK" {
				continue
			}
			obj, err := parseObject([]byte(ev.Raw), kindSecret, DefaultSelectorAnnotation, testKey)
			require.NoError(t, err)
			assert.True(t, obj.hash.keyed)
			out = append(out, obj.hash.text())
		}
		require.NoError(t, sc.Err())
		return out
	}
	events := digests("secrets-watch-events.ndjson")
	require.Len(t, events, 5, "ADDED, 3 MODIFIED, DELETED")
	assert.NotEqual(t, events[0], events[1], "blob replaced (binary)")
	assert.Equal(t, events[1], events[2], "annotation added: metadata only")
	assert.NotEqual(t, events[2], events[3], "message written through stringData")
	tls := digests("secret-tls-rotated.ndjson")
	require.Len(t, tls, 2, "ADDED, MODIFIED")
	assert.NotEqual(t, tls[0], tls[1], "tls.crt and tls.key rotated")
	registry := digests("secret-dockerconfigjson.ndjson")
	require.Len(t, registry, 2, "ADDED, MODIFIED")
	assert.NotEqual(t, registry[0], registry[1], ".dockerconfigjson replaced")

	onSecret := secretSpec{data: s1, selector: ptr("app=webapp"), annotations: map[string]string{
		RestartedForAnnotation: secretHashOf(t, s1), RestartingAnnotation: secretHashOf(t, s1) + "/uid-1",
	}}
	obj, err := parseObject(onSecret.json(t), kindSecret, DefaultSelectorAnnotation, testKey)
	require.NoError(t, err)
	assert.Equal(t, stored{}, obj.stored, "state on a Secret is not ours: ours is never there")
}

// TestStateName ensures a state ConfigMap's name is its Secret's with a
// prefix, or, too long for one, a digest of it: a valid name either way.
func TestStateName(t *testing.T) {
	assert.Equal(t, "config-watcher-secret.db-password", stateName("db-password"))
	long := strings.Repeat("a", 240)
	name := stateName(long)
	assert.LessOrEqual(t, len(name), 253)
	assert.Equal(t, "config-watcher-secret.", name[:len(stateNamePrefix)])
	assert.NotEqual(t, name, stateName(strings.Repeat("a", 241)))
}

// TestSecretChangeRestartsPodsOnce ensures a Secret's data change restarts
// every selected pod once, and that its state goes to its state ConfigMap,
// owned by the Secret, keyed, while nothing is written on the Secret.
func TestSecretChangeRestartsPodsOnce(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	secret := secretSpec{selector: ptr("app=webapp"), data: s1}
	c := secretController(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}},
		[]cmSpec{stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), "")}, []secretSpec{secret})
	settle(t, c)
	require.Empty(t, api.requests, "listed with its record: nothing to do")

	secret.data = s2
	handleSecret(t, c, watch.Modified, secret)
	settle(t, c)

	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods())
	for _, r := range api.requests {
		assert.NotContains(t, r.path, "/secrets", "nothing is written on a Secret")
	}
	patches := api.seen(http.MethodPatch, "configmaps")
	require.Len(t, patches, 2, "the intent, then the record")
	for _, p := range patches {
		assert.Equal(t, "/api/v1/namespaces/ns/configmaps/config-watcher-secret.webapp-secret", p.path)
		var body struct {
			Metadata struct {
				Labels          map[string]string   `json:"labels"`
				Annotations     map[string]*string  `json:"annotations"`
				OwnerReferences []map[string]string `json:"ownerReferences"`
			} `json:"metadata"`
		}
		require.NoError(t, json.Unmarshal([]byte(p.body), &body))
		assert.Equal(t, "config-watcher", body.Metadata.Labels["app.kubernetes.io/managed-by"])
		assert.Equal(t, "webapp-secret", *body.Metadata.Annotations[StateOfSecretAnnotation])
		assert.Equal(t, keyID(testKey), *body.Metadata.Annotations[DigestKeyIDAnnotation])
		assert.Equal(t, []map[string]string{{"apiVersion": "v1", "kind": "Secret", "name": "webapp-secret", "uid": "secret-uid-1"}}, body.Metadata.OwnerReferences)
	}
	assert.Equal(t, []string{secretHashOf(t, s2)}, api.recordedHashes())
	assert.True(t, strings.HasPrefix(api.intents()[0], secretHashOf(t, s2)+"/"), api.intents())
}

// TestSecretStateIsKnownOnlyOnceConfigMapsAreListed ensures a Secret seen
// before the ConfigMaps of its namespace are listed waits for them: its
// state ConfigMap tells whether its data changed while the controller was
// down (acted on once) or not; none means first sight (adopted).
func TestSecretStateIsKnownOnlyOnceConfigMapsAreListed(t *testing.T) {
	tests := []struct {
		name        string
		state       []cmSpec
		wantDeletes int
		wantRecord  bool
	}{
		{"ChangedWhileDownActsOnce", []cmSpec{stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), "")}, 3, true},
		{"UnchangedDoesNothing", []cmSpec{stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s2), "")}, 0, false},
		{"NoStateAdopts", nil, 0, true},
		{"StateUnderAnotherKeyAdopts", []cmSpec{stateSpec("webapp-secret", "00000000", secretHashOf(t, s1), "")}, 0, true},
		// An intent that cannot be authenticated is no licence to restart.
		{"IntentUnderAnotherKeyIsIgnored", []cmSpec{stateSpec("webapp-secret", "00000000", secretHashOf(t, s1), secretHashOf(t, s2)+"/uid-1")}, 0, true},
		{"ForgedRecordAdopts", []cmSpec{forgedState(stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), ""))}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			c, _ := newTestController(t, api.client(), Config{RecordHash: true, DigestKey: testKey, MaxUnavailable: Budget{Percent: 100}})
			cms := c.ForConfigMaps("")
			cms.BeginList()
			listSecrets(t, c, secretSpec{selector: ptr("app=webapp"), data: s2})
			start(t, c)
			settle(t, c)
			require.Empty(t, api.requests, "the Secret's state is not known yet")

			api.seedStates(tt.state)
			for _, s := range tt.state {
				cms.Handle(watch.Event{Type: watch.Synced, Object: s.json(t)})
			}
			cms.EndList()
			settle(t, c)
			assert.Len(t, api.deletedPods(), tt.wantDeletes)
			if tt.wantRecord {
				assert.Equal(t, []string{secretHashOf(t, s2)}, api.recordedHashes())
			} else {
				assert.Empty(t, api.recordedHashes())
			}
		})
	}
}

// TestSecretRewrittenWholeByItsOwner ensures an owner that writes the
// Secret whole every sync, without our annotations, costs no write and no
// restart, while a data change among its syncs is acted on once.
func TestSecretRewrittenWholeByItsOwner(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	secret := secretSpec{selector: ptr("app=webapp"), data: s1, annotations: map[string]string{"owner.example/synced": "1"}}
	state := stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), "")
	c := secretController(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}}, []cmSpec{state}, []secretSpec{secret})

	sync := func(n int) {
		for i := range n {
			secret.annotations = map[string]string{"owner.example/synced": strconv.Itoa(i)}
			handleSecret(t, c, watch.Modified, secret)
			settle(t, c)
		}
	}
	sync(5)
	assert.Empty(t, api.requests, "rewrites of the same data")

	secret.data = s2
	sync(1)
	assert.Len(t, api.deletedPods(), 3)
	// The state ConfigMap's events come back, as they do on a watch, at
	// the revisions the writes answered.
	api.mu.Lock()
	rvs := append([]uint64(nil), api.patchRVs...)
	api.mu.Unlock()
	require.Len(t, rvs, 2)
	intent := stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), api.intents()[0])
	intent.rv = strconv.FormatUint(rvs[0], 10)
	record := stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s2), "")
	record.rv = strconv.FormatUint(rvs[1], 10)
	handle(t, c, watch.Modified, intent)
	handle(t, c, watch.Modified, record)
	settle(t, c)
	writes := len(api.seen(http.MethodPatch, "configmaps"))
	sync(5)
	assert.Len(t, api.deletedPods(), 3, "each pod once")
	assert.Len(t, api.seen(http.MethodPatch, "configmaps"), writes, "no write after the owner's syncs")
	assert.Equal(t, 2, writes, "one intent and one record for the change")
}

// TestSecretStateConfigMapCreatedOnFirstWrite ensures the first write of a
// Secret's state creates its state ConfigMap, with no removal in it, and
// that one deleted is created again: a write through its uid that finds
// none creates it.
func TestSecretStateConfigMapCreatedOnFirstWrite(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodPatch && strings.HasSuffix(r.path, "/configmaps/config-watcher-secret.webapp-secret") {
			return 404, `{"kind":"Status","code":404,"reason":"NotFound"}`, true
		}
		return 0, "", false
	}
	c := secretController(t, api, Config{RecordHash: true}, nil, []secretSpec{{selector: ptr("app=webapp"), data: s1}})
	settle(t, c)

	creates := api.seen(http.MethodPost, "configmaps")
	require.Len(t, creates, 1, "the adoption's record")
	require.Empty(t, api.seen(http.MethodPatch, "configmaps"), "no state ConfigMap known: created at once")
	var body map[string]any
	require.NoError(t, json.Unmarshal([]byte(creates[0].body), &body))
	meta := body["metadata"].(map[string]any)
	assert.Equal(t, "ConfigMap", body["kind"])
	assert.Equal(t, "config-watcher-secret.webapp-secret", meta["name"])
	r, _ := parseDigest(secretHashOf(t, s1))
	assert.Equal(t, map[string]any{
		RestartedForAnnotation:  secretHashOf(t, s1),
		StateOfSecretAnnotation: "webapp-secret",
		DigestKeyIDAnnotation:   keyID(testKey),
		StateMACAnnotation:      stateMAC(testKey, "ns", "webapp-secret", stored{recorded: r}),
	}, meta["annotations"], "no removal of I in a create")
	assert.Empty(t, api.deletedPods())

	// Deleted since: each write through its uid finds none and creates it.
	handleSecret(t, c, watch.Modified, secretSpec{selector: ptr("app=webapp"), data: s2})
	settle(t, c)
	assert.Len(t, api.deletedPods(), 3)
	assert.Len(t, api.seen(http.MethodPatch, "configmaps"), 2, "the intent and the record, each through the uid")
	creates = api.seen(http.MethodPost, "configmaps")
	require.Len(t, creates, 3, "each created again")
	last := gjson.Get(creates[2].body, "metadata.annotations")
	assert.Equal(t, secretHashOf(t, s2), last.Get(gjson.Escape(RestartedForAnnotation)).String(), "the record")
	assert.False(t, last.Get(gjson.Escape(RestartingAnnotation)).Exists(), "the record")
}

// TestSecretAndConfigMapOfOneNameAreTwoObjects ensures a ConfigMap and a
// Secret of the same name keep apart: each restarts its own pods for its
// own change.
func TestSecretAndConfigMapOfOneNameAreTwoObjects(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	cm := cmSpec{name: "webapp", selector: ptr("app=db"), recorded: hashOf(t, v1), data: v1}
	secret := secretSpec{name: "webapp", selector: ptr("app=webapp"), data: s1}
	c := secretController(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}},
		[]cmSpec{cm, stateSpec("webapp", keyID(testKey), secretHashOf(t, s1), "")}, []secretSpec{secret})
	settle(t, c)

	secret.data = s2
	handleSecret(t, c, watch.Modified, secret)
	settle(t, c)
	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.deletedPods())

	cm.data = v2
	handle(t, c, watch.Modified, cm)
	settle(t, c)
	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3", "db-1"}, api.deletedPods())
	assert.Contains(t, c.entries, "secret/ns/webapp")
	assert.Contains(t, c.entries, "ns/webapp")
}

// TestSecretDataNeverLeaves feeds a Secret whose value is a marker through
// every path that logs, records an Event or counts: an adoption, a round, a
// dry run, an invalid selector, a state write the server refuses quoting
// it, whole or cut inside the digest after a long preamble; the marker, its base64, and any 8 hex digits of its
// SHA-256, of its base64's, or of the keyed digest in the state ConfigMap
// appear in no log line, Event or metric.
func TestSecretDataNeverLeaves(t *testing.T) {
	marker := "cw-marker-" + hex.EncodeToString([]byte(t.Name()))[:16]
	data := map[string][]byte{"password": []byte(marker)}
	other := map[string][]byte{"password": []byte(marker + "-2")}
	var forbidden []string
	for _, d := range []map[string][]byte{data, other} {
		value := string(d["password"])
		b64 := base64.StdEncoding.EncodeToString(d["password"])
		plain, ofB64 := sha256.Sum256(d["password"]), sha256.Sum256([]byte(b64))
		keyed := strings.TrimPrefix(secretHashOf(t, d), keyedDigestPrefix)
		keys := strings.TrimPrefix(secretKeysOf(t, d), keyedDigestPrefix)
		forbidden = append(forbidden, value, b64, hex.EncodeToString(plain[:]), hex.EncodeToString(ofB64[:]), keyed, keys)
	}

	forbidden = append(forbidden, hex.EncodeToString(testKey), string(testKey))

	logs, rec := &testlog.Buffer{}, &fakeRecorder{}
	var annotations map[string]string // of the Secret, beside the selector
	var metricsText strings.Builder
	// run runs one path; refuse, if not nil, has the server refuse every
	// state write with a Status message quoting the patch, after a
	// preamble that has apiclient's 1,024-byte cut fall *refuse hex digits
	// into the keyed digest (0: no preamble).
	run := func(cfg Config, sel string, refuse *int) {
		reg := metrics.NewRegistry()
		defer func() {
			srv := httptest.NewServer(reg)
			defer srv.Close()
			resp, err := http.Get(srv.URL)
			require.NoError(t, err)
			defer resp.Body.Close()
			_, err = io.Copy(&metricsText, resp.Body)
			require.NoError(t, err)
		}()
		api := newFakeAPI(t, webPods()...)
		if refuse != nil {
			api.fault = func(r request) (int, string, bool) {
				if r.method != http.MethodPatch && r.method != http.MethodPost {
					return 0, "", false
				}
				// A server quoting what it refuses.
				msg := "ConfigMap is invalid: metadata.annotations: Invalid value: " + r.body
				if *refuse > 0 {
					at := strings.Index(msg, keyedDigestPrefix) + len(keyedDigestPrefix) + *refuse
					msg = strings.Repeat("v", 1024-at) + msg
				}
				status, _ := json.Marshal(map[string]any{"kind": "Status", "code": 422, "reason": "Invalid", "message": msg})
				return 422, string(status), true
			}
		}
		cfg.SelectorAnnotation, cfg.DigestKey, cfg.Events, cfg.NewBackOff = DefaultSelectorAnnotation, testKey, rec, fastBackOff
		c := New(cfg, api.client(), slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), NewMetrics(reg))
		listSecrets(t, c, secretSpec{selector: ptr(sel), annotations: annotations, data: data})
		listConfigMaps(t, c)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { c.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		if refuse != nil {
			// The adoption's record is refused, and retried until the end.
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), "write refused") }, waitFor, time.Millisecond)
			return
		}
		require.Eventually(t, c.queue.active, waitFor, time.Millisecond)
		settle(t, c)
		handleSecret(t, c, watch.Modified, secretSpec{selector: ptr(sel), annotations: annotations, data: other})
		settle(t, c)
	}
	run(Config{RecordHash: true}, "app=webapp", nil)
	run(Config{RecordHash: true, DryRun: true}, "app=webapp", nil)
	run(Config{RecordHash: true}, "app in (", nil)
	for _, shown := range []int{0, 12} {
		run(Config{RecordHash: true}, "app=webapp", &shown)
	}
	// Restarting the pods that read it: its key digests are written and
	// compared too.
	annotations = map[string]string{RestartReferencingAnnotation: "true"}
	run(Config{RecordHash: true}, "app=webapp", nil)
	for _, shown := range []int{0, 12, 40} {
		run(Config{RecordHash: true}, "app=webapp", &shown)
	}
	var events strings.Builder
	for _, e := range rec.all() {
		events.WriteString(e.kind + " " + e.reason + " " + e.message + "\n")
	}
	require.Contains(t, events.String(), "Secret PodsRestarted Restarted 3 pod(s) matching app=webapp for resourceVersion ")
	require.Contains(t, events.String(), "Secret WriteRefused")
	require.Contains(t, logs.String(), `"secret":"webapp-secret"`)
	for where, text := range map[string]string{"logs": logs.String(), "events": events.String(), "metrics": metricsText.String()} {
		for _, f := range forbidden {
			for i := 0; i+8 <= len(f); i++ {
				if strings.Contains(text, f[i:i+8]) {
					t.Errorf("%s contain %q, 8 characters of %q", where, f[i:i+8], f)
					break
				}
			}
		}
	}
}

// TestOwnerSyncDuringARoundKeepsItsIntent ensures a Secret event that comes
// during a round, before any event of its state ConfigMap, does not read as
// the round's intent wiped: the intent is written once.
func TestOwnerSyncDuringARoundKeepsItsIntent(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	secret := secretSpec{selector: ptr("app=webapp"), data: s1}
	var synced atomic.Bool
	var c *Controller
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete && synced.CompareAndSwap(false, true) {
			secret.annotations = map[string]string{"owner.example/synced": "1"}
			handleSecret(t, c, watch.Modified, secret)
		}
		return 0, "", false
	}
	c = secretController(t, api, Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}}, nil, []secretSpec{secret})
	settle(t, c)
	require.Equal(t, []string{secretHashOf(t, s1)}, api.recordedHashes(), "adopted: the state ConfigMap written, its event not seen")

	secret.data = s2
	handleSecret(t, c, watch.Modified, secret)
	settle(t, c)
	assert.True(t, synced.Load())
	assert.Len(t, api.deletedPods(), 3)
	written := 0
	for _, in := range api.intents() {
		if in != "" { // "": the records remove I
			written++
		}
	}
	assert.Equal(t, 1, written, "the intent written once: %v", api.intents())
}

// TestUnauthenticatedStateRestartsNothing ensures a state ConfigMap whose
// MAC does not check under our key (a ConfigMap writer's forgery with our
// key id copied, one without a MAC, another key's) is no licence to
// restart: its record says the data changed and its intent names pods,
// yet no pod goes down, the Secret is adopted as it is, our state is
// written over the view through its uid, and it is told: a StateUntrusted
// Warning Event and a count, then the adoption's Event.
func TestUnauthenticatedStateRestartsNothing(t *testing.T) {
	changed, pending := secretHashOf(t, s1), secretHashOf(t, s2)+"/uid-1,uid-2"
	for _, tt := range []struct {
		name  string
		state cmSpec
	}{
		{"Forged", forgedState(stateSpec("webapp-secret", keyID(testKey), changed, pending))},
		{"WithoutMAC", func() cmSpec {
			s := stateSpec("webapp-secret", keyID(testKey), changed, pending)
			s.annotations = maps.Clone(s.annotations)
			delete(s.annotations, StateMACAnnotation)
			return s
		}()},
		{"AnotherKey", stateSpec("webapp-secret", "00000000", changed, pending)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			rec := &fakeRecorder{}
			c, m := newTestController(t, api.client(), Config{RecordHash: true, DigestKey: testKey, Events: rec, MaxUnavailable: Budget{Percent: 100}})
			listSecrets(t, c, secretSpec{selector: ptr("app=webapp"), data: s2})
			listConfigMaps(t, c, tt.state)
			api.seedStates([]cmSpec{tt.state})
			start(t, c)
			settle(t, c)

			assert.Empty(t, api.deletedPods())
			assert.Equal(t, []string{secretHashOf(t, s2)}, api.recordedHashes(), "adopted")
			writes := api.seen(http.MethodPatch, "configmaps")
			require.Len(t, writes, 1, "our state over the view, through its uid")
			assert.Equal(t, "state-uid-webapp-secret", gjson.Get(writes[0].body, "metadata.uid").String())
			assert.Equal(t, uint64(1), m.StateUntrusted.Value())
			assert.Equal(t, []string{"Secret/StateUntrusted", "Secret/Adopted"}, rec.reasons())
		})
	}
}

// TestForeignConfigMapOfTheStateNameIsNeverWritten ensures a ConfigMap
// that holds the name of a Secret's state but is not ours (no label, no
// Secret owner: someone else's, or a trap) is neither read nor written:
// the create finds it, no view shows it ours, and the write is refused
// visibly with the fix.
func TestForeignConfigMapOfTheStateNameIsNeverWritten(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	api.takenConfigMaps = map[string]bool{stateName("webapp-secret"): true}
	rec := &fakeRecorder{}
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, DigestKey: testKey, Events: rec, MaxUnavailable: Budget{Percent: 100}})
	foreign := cmSpec{name: stateName("webapp-secret"), uid: "foreign-uid", recorded: secretHashOf(t, s1),
		annotations: map[string]string{StateOfSecretAnnotation: "webapp-secret", DigestKeyIDAnnotation: keyID(testKey)}}
	listSecrets(t, c, secretSpec{selector: ptr("app=webapp"), data: s2})
	listConfigMaps(t, c, foreign)
	start(t, c)

	require.Eventually(t, func() bool { return slices.Contains(rec.reasons(), "Secret/WriteRefused") }, waitFor, time.Millisecond)
	assert.Empty(t, api.seen(http.MethodPatch, "configmaps"), "never written")
	assert.Empty(t, api.deletedPods(), "its record is no state")
	for _, e := range rec.all() {
		if e.reason == "WriteRefused" {
			assert.Contains(t, e.message, "a ConfigMap named config-watcher-secret.webapp-secret in ns holds the name of this Secret's state and was not written by config-watcher: rename or delete it")
		}
	}
}

// TestForeignStateNameHoldsAWorkerOnce ensures a Secret's state write that
// waited in vain for a view showing the state ConfigMap's name ours does
// not wait again until a view of the state comes: a ConfigMap of the name
// that is not ours (someone else's, or a re-created Secret's predecessor's
// before the garbage collector removes it) held a worker that long on
// every retry, and with WORKERS=1 every other object's round behind it
// (simulator seed 8636). A view that comes makes the next refusal wait
// again.
func TestForeignStateNameHoldsAWorkerOnce(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, DigestKey: testKey})
	listSecrets(t, c, secretSpec{selector: ptr("app=webapp"), data: s1})
	listConfigMaps(t, c)
	c.mu.Lock()
	secret := c.entries[keyOf(kindSecret, "ns", "webapp-secret")].obj
	c.mu.Unlock()
	waits := func(refused string) bool { // true: it waited until ctx was done
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		c.waitStateHolder(ctx, secret, refused)
		return ctx.Err() != nil
	}

	assert.Empty(t, c.waitStateHolder(context.Background(), secret, ""), "no view shows the name ours: refused")
	c.replacedWait = time.Hour
	assert.False(t, waits(""), "refused again at once")

	handle(t, c, watch.Added, stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), ""))
	assert.True(t, waits("state-uid-webapp-secret"), "a view came: the next refusal waits for one again")
}

// TestSecretStateWriteAfterItsWaitAsksCurrent ensures the write of a
// Secret's state that waited for a view of its state ConfigMap (created by
// another replica's term: the create found it) asks again whether it may
// act before it patches: the lease lapsed during the wait.
func TestSecretStateWriteAfterItsWaitAsksCurrent(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	api.takenConfigMaps = map[string]bool{stateName("webapp-secret"): true}
	var leading atomic.Bool
	leading.Store(true)
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, DigestKey: testKey, MayAct: leading.Load})
	var refused atomic.Bool
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodPost && strings.HasSuffix(r.path, "/configmaps") && refused.CompareAndSwap(false, true) {
			// Refused 409 below; meanwhile the lease lapses, then the
			// view that shows the ConfigMap ours comes.
			leading.Store(false)
			handle(t, c, watch.Added, stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), ""))
		}
		return 0, "", false
	}
	listSecrets(t, c, secretSpec{selector: ptr("app=webapp"), data: s1})
	listConfigMaps(t, c)
	start(t, c)
	settle(t, c)
	require.True(t, refused.Load(), "the adoption's record tried to create the state ConfigMap")
	assert.Empty(t, api.seen(http.MethodPatch, "configmaps"), "written after the lease lapsed")
}

// TestDeletedStateIsTold ensures a state ConfigMap deleted while its
// Secret is ours is told (a StateRemoved Warning Event): had the
// controller been down, the Secret would have been adopted as it is. The
// state of an earlier Secret of the name (owned by another uid), removed
// by the garbage collector once the Secret was created again, is not
// (simulator seed 45, once the simulated cluster had a garbage collector).
func TestDeletedStateIsTold(t *testing.T) {
	for _, tt := range []struct {
		name, secretUID string
		want            []string
	}{
		{"OfThisSecret", "", []string{"Secret/StateRemoved"}},
		{"OfAnEarlierSecretOfTheName", "secret-uid-2", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			rec := &fakeRecorder{}
			c, _ := newTestController(t, api.client(), Config{RecordHash: true, DigestKey: testKey, Events: rec, MaxUnavailable: Budget{Percent: 100}})
			state := stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), "") // owned by secret-uid-1
			listSecrets(t, c, secretSpec{uid: tt.secretUID, selector: ptr("app=webapp"), data: s1})
			listConfigMaps(t, c, state)
			start(t, c)
			settle(t, c)
			require.Empty(t, rec.reasons())

			handle(t, c, watch.Deleted, state)
			settle(t, c)
			assert.Equal(t, tt.want, rec.reasons())
			assert.Empty(t, api.deletedPods())
		})
	}
}

// TestSecretStateKeptWhileItsNamespaceOptsInAgain ensures a namespace that
// opts in (back in after an opt-out, or for the first time since the
// controller started), its ConfigMaps relisted before its Secrets, keeps
// its Secrets' state: the state ConfigMap's view, which came while no
// Secret of it was known, is not dropped as no Secret's, so the Secret is
// resumed from it and its next change writes through its uid, not refused
// as a foreign ConfigMap of the name (simulator seeds 148, 733).
func TestSecretStateKeptWhileItsNamespaceOptsInAgain(t *testing.T) {
	for _, tt := range []struct {
		name      string
		atStart   map[string]string // the namespace's labels when the controller starts
		changedIn bool              // the change comes once it is in; else while it is out
	}{
		{name: "out and in again", atStart: optedIn, changedIn: true},
		{name: "out at the start, in later, changed while out", atStart: nil},
		{name: "out at the start, in later, changed once in", atStart: nil, changedIn: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			api.takenConfigMaps = map[string]bool{stateName("webapp-secret"): true}
			rec := &fakeRecorder{}
			consent, reported := newConsent(t, map[string]map[string]string{"ns": tt.atStart})
			c, _ := newTestController(t, api.client(), Config{RecordHash: true, DigestKey: testKey, Events: rec, Namespaces: consent, MaxUnavailable: Budget{Percent: 100}})
			consent.OptedOut = c.ForgetNamespace
			secret := secretSpec{selector: ptr("app=webapp"), data: s1}
			state := stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), "")
			api.seedStates([]cmSpec{state})
			listSecrets(t, c, secret)
			listConfigMaps(t, c, state)
			start(t, c)
			settle(t, c)
			require.Empty(t, api.requests)

			if tt.atStart != nil {
				consent.Handle(namespaceEvent(t, watch.Modified, "ns", nil))
			} else {
				secret.data = s2
			}
			consent.Handle(namespaceEvent(t, watch.Modified, "ns", optedIn))
			in, _ := reported()
			require.Equal(t, []string{"ns"}, in, "the watches are asked to relist")
			listConfigMaps(t, c, state)
			listSecrets(t, c, secret)
			settle(t, c)
			if tt.changedIn {
				secret.data = s2
				handleSecret(t, c, watch.Modified, secret)
				settle(t, c)
			}
			assert.NotContains(t, rec.reasons(), "Secret/WriteRefused")
			assert.Empty(t, api.seen(http.MethodPost, "configmaps"), "its state ConfigMap is known ours: never created again")
			assert.Len(t, api.deletedPods(), 3, "the change is acted on")
		})
	}
}

// TestSecretStateWriteAfterARefusedCreateRemovesWhatItDoesNotHold ensures
// the patch that follows a create refused as the state ConfigMap exists
// (another term's, its view came meanwhile) removes the annotations the
// state written does not hold: kept, another term's intent would stand
// beside a MAC made without it, and the state read back would be untrusted
// (simulator seed 179).
func TestSecretStateWriteAfterARefusedCreateRemovesWhatItDoesNotHold(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	api.takenConfigMaps = map[string]bool{stateName("webapp-secret"): true}
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, DigestKey: testKey})
	var refused atomic.Bool
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodPost && strings.HasSuffix(r.path, "/configmaps") && refused.CompareAndSwap(false, true) {
			// Another term's state, a round in progress in it.
			handle(t, c, watch.Added, stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s2), secretHashOf(t, s1)+"/uid-1"))
		}
		return 0, "", false
	}
	listSecrets(t, c, secretSpec{selector: ptr("app=webapp"), data: s1})
	listConfigMaps(t, c)
	start(t, c)
	settle(t, c)
	require.True(t, refused.Load(), "the adoption's record tried to create the state ConfigMap")
	patches := api.seen(http.MethodPatch, "configmaps")
	require.NotEmpty(t, patches, "written through the uid its view showed")
	var body struct {
		Metadata struct{ Annotations map[string]*string }
	}
	require.NoError(t, json.Unmarshal([]byte(patches[0].body), &body))
	require.Contains(t, body.Metadata.Annotations, RestartingAnnotation, "the other term's intent is removed")
	assert.Nil(t, body.Metadata.Annotations[RestartingAnnotation])
}
