//go:build e2e

package e2e

// Secrets (WATCH_SECRETS=true) on the real control plane. The controller runs
// as the ServiceAccount config-watcher with the base Role plus what Secrets
// need (list and watch on secrets, create on configmaps for the state
// ConfigMaps), so that the audit log tells its requests apart from the
// test's own kubectl writes, which act as admin.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	secretStatePrefix       = "config-watcher-secret."
	stateOfSecretAnnotation = "config-watcher.k8spatterns.io/state-of-secret"
	digestKeyIDAnnotation   = "config-watcher.k8spatterns.io/digest-key-id"
	stateMACAnnotation      = "config-watcher.k8spatterns.io/state-mac"
	controllerAnnotations   = "config-watcher.k8spatterns.io/"
	managedByLabel          = "app.kubernetes.io/managed-by"
)

var secretRecord = regexp.MustCompile(`^hmac-sha256:[0-9a-f]{64}$`)

// TestSecretDataChangeRestartsPodsOnce ensures a change of an annotated
// Secret's data deletes each selected pod once, records the change in the
// state ConfigMap config-watcher-secret.<name> (owned by the Secret, R a
// keyed digest), and writes nothing on the Secret.
func TestSecretDataChangeRestartsPodsOnce(t *testing.T) {
	s := newSecretsSetup(t, true)
	original := s.webapp(t, "webapp-secret", "Opaque", map[string]string{"password": "first"})

	c, adopted := s.startAdopting(t, "webapp-secret")
	require.Empty(t, podDeletes(t, s.ns, s.user), "adopting a Secret must delete nothing")

	setSecretData(t, s.ns, "webapp-secret", map[string]string{"password": "second"})
	waitDeleted(t, s.ns, s.user, original)
	restarted := waitSecretRecord(t, s.ns, "webapp-secret", adopted)
	replaced := waitPods(t, s.ns, "app=webapp", 2)
	c.SettleSecrets(t, s.ns)

	assertDeletedOnce(t, s.ns, s.user, original)
	for _, p := range replaced {
		assert.NotContains(t, original, p, "pod %s survived the data change", p.name)
	}
	assert.Regexp(t, secretRecord, restarted)

	secret := getSecret(t, s.ns, "webapp-secret")
	state := getStateConfigMap(t, s.ns, stateNameOf("webapp-secret"))
	assert.Equal(t, "config-watcher", state.Metadata.Labels[managedByLabel])
	assert.Equal(t, "webapp-secret", state.Metadata.Annotations[stateOfSecretAnnotation])
	assert.Regexp(t, `^[0-9a-f]{8}$`, state.Metadata.Annotations[digestKeyIDAnnotation])
	assert.Regexp(t, `^[0-9a-f]{64}$`, state.Metadata.Annotations[stateMACAnnotation])
	assert.NotContains(t, state.Metadata.Annotations, restartingAnnotation, "an intent is left after the round")
	assert.Empty(t, state.Data, "the state ConfigMap holds no data")
	assert.Equal(t, []ownerReference{{APIVersion: "v1", Kind: "Secret", Name: "webapp-secret", UID: secret.Metadata.UID}},
		withoutFlags(state.Metadata.OwnerReferences), "the garbage collector removes the state with the Secret")

	assertSecretUntouched(t, s.ns, s.user, "webapp-secret")
}

// TestSecretStateEditedByAConfigMapWriterRestartsNothing ensures that one
// who may write ConfigMaps but not delete pods cannot make the controller
// restart a Secret's pods by editing its state ConfigMap (a record that
// says the data changed, an intent naming pods): the MAC does not check,
// nothing of the edit is used, no pod is deleted, the controller writes
// its own state back over it (through the ConfigMap's uid, on the real
// server), and it says so: a StateUntrusted Warning Event on the Secret
// and config_watcher_state_untrusted_total.
func TestSecretStateEditedByAConfigMapWriterRestartsNothing(t *testing.T) {
	s := newSecretsSetup(t, true)
	original := s.webapp(t, "webapp-secret", "Opaque", map[string]string{"password": "first"})
	c, adopted := s.startAdopting(t, "webapp-secret")
	c.SettleSecrets(t, s.ns)

	forged := "hmac-sha256:" + strings.Repeat("ab", 32)
	var uids []string
	for _, p := range original {
		uids = append(uids, p.uid)
	}
	kubectl(t, "annotate", "configmap", stateNameOf("webapp-secret"), "-n", s.ns, "--overwrite",
		restartedAnnotation+"="+forged, restartingAnnotation+"="+forged+"/"+strings.Join(uids, ","))

	e := waitEvent(t, "Secret", s.ns, "webapp-secret", "Warning", "StateUntrusted")
	assert.Contains(t, e.Message, "was not written by config-watcher under its digest key")
	c.WaitMetric(t, 1, "config_watcher_state_untrusted_total")
	eventually(t, waitTimeout, "the controller's state written back", func() (bool, string) {
		state := getStateConfigMap(t, s.ns, stateNameOf("webapp-secret")).Metadata.Annotations
		return state[restartedAnnotation] == adopted && state[restartingAnnotation] == "", fmt.Sprint(state)
	})
	c.SettleSecrets(t, s.ns)
	assert.Empty(t, podDeletes(t, s.ns, s.user), "an edited state restarted pods")
	assert.ElementsMatch(t, original, livePods(t, s.ns, "app=webapp"))
}

// TestSecretWithALongNameKeepsItsStateUnderADigestOfTheName ensures a
// Secret whose name is too long to carry the state ConfigMap's prefix gets
// its state under the prefix and a digest of its name, naming it in full,
// and that a data change restarts its pods once.
func TestSecretWithALongNameKeepsItsStateUnderADigestOfTheName(t *testing.T) {
	s := newSecretsSetup(t, true)
	name := strings.Repeat("s", 240) + randomHex(12)
	require.Greater(t, len(secretStatePrefix+name), 253)
	original := s.webapp(t, name, "Opaque", map[string]string{"password": "first"})

	c, adopted := s.startAdopting(t, name)
	setSecretData(t, s.ns, name, map[string]string{"password": "second"})
	waitDeleted(t, s.ns, s.user, original)
	waitSecretRecord(t, s.ns, name, adopted)
	c.SettleSecrets(t, s.ns)

	assertDeletedOnce(t, s.ns, s.user, original)
	assert.Equal(t, name, getStateConfigMap(t, s.ns, stateNameOf(name)).Metadata.Annotations[stateOfSecretAnnotation])
	assertSecretUntouched(t, s.ns, s.user, name)
}

// TestSecretMetadataOnlyEditsRestartNothing ensures a label or an unrelated
// annotation added to a Secret, which leaves its data alone, deletes no pod
// and leaves the record as it was.
func TestSecretMetadataOnlyEditsRestartNothing(t *testing.T) {
	s := newSecretsSetup(t, true)
	original := s.webapp(t, "webapp-secret", "Opaque", map[string]string{"password": "first"})

	c, adopted := s.startAdopting(t, "webapp-secret")
	modified := c.Metric(t, "config_watcher_secret_events_total", "type", "MODIFIED")

	kubectl(t, "label", "secret", "webapp-secret", "-n", s.ns, "tier=frontend")
	kubectl(t, "annotate", "secret", "webapp-secret", "-n", s.ns, "example.com/owner=team-a")
	c.WaitMetric(t, modified+2, "config_watcher_secret_events_total", "type", "MODIFIED")
	c.SettleSecrets(t, s.ns)

	assert.Empty(t, podDeletes(t, s.ns, s.user), "metadata-only edits deleted pods")
	assert.ElementsMatch(t, original, livePods(t, s.ns, "app=webapp"))
	assert.Equal(t, adopted, secretRecordOf(t, s.ns, "webapp-secret"), "the record must not change when the data did not")
	assertSecretUntouched(t, s.ns, s.user, "webapp-secret")
}

// TestSecretChangeWhileStoppedRestartsOnce ensures a Secret rewritten whole
// (new data, none of our annotations: as an operator syncs it) while the
// controller was down is acted on once when it starts again, and that a
// start with nothing changed deletes nothing.
func TestSecretChangeWhileStoppedRestartsOnce(t *testing.T) {
	s := newSecretsSetup(t, true)
	original := s.webapp(t, "webapp-secret", "Opaque", map[string]string{"password": "first"})

	first, adopted := s.startAdopting(t, "webapp-secret")
	first.SettleSecrets(t, s.ns)
	first.Stop(t)
	require.Empty(t, podDeletes(t, s.ns, s.user), "adopting a Secret must delete nothing")

	_, err := runKubectl(secretJSON("webapp-secret", "Opaque", map[string]string{"password": "changed while nobody watched"},
		map[string]string{selectorAnnotation: "app=webapp"}), "replace", "-n", s.ns, "-f", "-")
	require.NoError(t, err)

	second := s.start(t)
	second.WaitReady(t)
	waitDeleted(t, s.ns, s.user, original)
	restarted := waitSecretRecord(t, s.ns, "webapp-secret", adopted)
	replaced := waitPods(t, s.ns, "app=webapp", 2)
	second.SettleSecrets(t, s.ns)
	second.Stop(t)
	assertDeletedOnce(t, s.ns, s.user, original)

	third := s.start(t)
	third.WaitReady(t)
	third.SettleSecrets(t, s.ns)
	assert.Len(t, podDeletes(t, s.ns, s.user), 2, "a restart with no data change deleted pods")
	assert.ElementsMatch(t, replaced, livePods(t, s.ns, "app=webapp"))
	assert.Equal(t, restarted, secretRecordOf(t, s.ns, "webapp-secret"))
	assertSecretUntouched(t, s.ns, s.user, "webapp-secret")
}

// TestSecretRewrittenWholeByItsOwnerRestartsOncePerChange ensures an owner
// that replaces the Secret whole every 2 s, knowing nothing of
// config-watcher, neither loses a data change made meanwhile (each pod
// restarted once for it) nor causes restarts or writes of its own: the
// controller writes its state ConfigMap once to adopt and twice for the
// change (intent, record), however often the owner rewrites, and never
// writes the Secret.
func TestSecretRewrittenWholeByItsOwnerRestartsOncePerChange(t *testing.T) {
	s := newSecretsSetup(t, true)
	original := s.webapp(t, "webapp-secret", "Opaque", map[string]string{"password": "first"})

	c, adopted := s.startAdopting(t, "webapp-secret")

	owner := startRewritingOwner(t, s.ns, "webapp-secret", map[string]string{"password": "first"}, 2*time.Second)
	owner.waitRewrites(t, 3)
	c.SettleSecrets(t, s.ns)
	require.Empty(t, podDeletes(t, s.ns, s.user), "rewrites of unchanged data deleted pods")

	owner.change(t, map[string]string{"password": "second"})
	waitDeleted(t, s.ns, s.user, original)
	restarted := waitSecretRecord(t, s.ns, "webapp-secret", adopted)
	replaced := waitPods(t, s.ns, "app=webapp", 2)
	owner.waitRewrites(t, owner.rewrites()+3)
	rewrites := owner.stop(t)
	c.SettleSecrets(t, s.ns)

	assertDeletedOnce(t, s.ns, s.user, original)
	assert.ElementsMatch(t, replaced, livePods(t, s.ns, "app=webapp"), "a rewrite restarted the replacements")
	assert.Equal(t, restarted, secretRecordOf(t, s.ns, "webapp-secret"))
	// Written: one to adopt, an intent and a record for the change. Tried:
	// those, and the first write's patch that finds no state ConfigMap yet.
	writes := stateWrites(t, s.ns, s.user)
	var written int
	for _, e := range writes {
		if e.OK() {
			written++
		}
	}
	assert.LessOrEqual(t, written, 3, "state ConfigMap writes after %d rewrites; audit: %v", rewrites, writes)
	assert.LessOrEqual(t, len(writes), 4, "state ConfigMap writes tried after %d rewrites; audit: %v", rewrites, writes)
	assertSecretUntouched(t, s.ns, s.user, "webapp-secret")
}

// TestSecretsWithoutRBACSayWhichVerbIsMissing ensures a controller started
// with Secrets on but without list and watch on secrets logs each missing
// verb once, naming the namespace, stays unready, keeps retrying the Secret
// list, and still restarts pods for ConfigMaps.
func TestSecretsWithoutRBACSayWhichVerbIsMissing(t *testing.T) {
	s := newSecretsSetup(t, false)
	apply(t, s.ns, webappManifests("app=webapp"))
	original := waitPods(t, s.ns, "app=webapp", 2)

	c := s.start(t)
	eventually(t, waitTimeout, "the Secret list refused twice (retried)", func() (bool, string) {
		refused := auditEvents(t, func(e auditEvent) bool {
			return e.User.Username == s.user && e.Verb == "list" && e.On(s.ns, "secrets") && e.Code() == http.StatusForbidden
		})
		return len(refused) >= 2, fmt.Sprintf("%d refused lists", len(refused))
	})
	adopted := waitRestartedFor(t, s.ns, "webapp-config", "")
	mergePatch(t, s.ns, "webapp-config", `{"data":{"message":"ConfigMaps keep working"}}`)
	waitDeleted(t, s.ns, s.user, original)
	waitRestartedFor(t, s.ns, "webapp-config", adopted)
	c.Settle(t, s.ns)
	assertDeletedOnce(t, s.ns, s.user, original)

	code, body, err := c.get("/readyz")
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, code, "/readyz while Secrets cannot be listed: %s", body)

	missing := map[string]int{}
	for _, line := range strings.Split(c.Log(t), "\n") {
		if !strings.Contains(line, `msg="missing RBAC for Secrets"`) {
			continue
		}
		assert.Contains(t, line, "level=ERROR")
		assert.Equal(t, s.ns, logAttr(line, "namespace"), "the line names the namespace: %s", line)
		assert.Regexp(t, `\bfix=\S`, line)
		missing[logAttr(line, "verb")+" "+logAttr(line, "resource")]++
	}
	assert.Equal(t, map[string]int{"list secrets": 1, "watch secrets": 1}, missing,
		"each missing verb logged once (create on configmaps is granted)")
}

// TestSecretTLSRotatedTwiceRestartsPerRotation ensures a kubernetes.io/tls
// Secret whose certificate and key are replaced twice restarts the pods once
// per rotation: each original pod once, each of their replacements once.
func TestSecretTLSRotatedTwiceRestartsPerRotation(t *testing.T) {
	s := newSecretsSetup(t, true)
	original := s.webapp(t, "webapp-tls", "kubernetes.io/tls", tlsData())

	c, record := s.startAdopting(t, "webapp-tls")

	pods := original
	var all []pod
	for range 2 {
		setSecretData(t, s.ns, "webapp-tls", tlsData())
		waitDeleted(t, s.ns, s.user, pods)
		record = waitSecretRecord(t, s.ns, "webapp-tls", record)
		all = append(all, pods...)
		pods = waitPods(t, s.ns, "app=webapp", 2)
	}
	c.SettleSecrets(t, s.ns)
	assertDeletedOnce(t, s.ns, s.user, all)
	assertSecretUntouched(t, s.ns, s.user, "webapp-tls")
}

// TestSecretDataNeverLeaves ensures that nothing derived from a Secret's
// values (the value, its base64, a prefix of the SHA-256 of either, the
// keyed digest recorded in the state ConfigMap, the digest key) reaches the
// controller's log (text or JSON), the namespace's Events or /metrics, and
// that the PodsRestarted Event names the Secret's resourceVersion instead.
func TestSecretDataNeverLeaves(t *testing.T) {
	s := newSecretsSetup(t, true)
	before, after := "cw-marker-"+randomHex(16), "cw-marker-"+randomHex(16)
	original := s.webapp(t, "webapp-secret", "Opaque", map[string]string{"password": before})

	c, adopted := s.startAdopting(t, "webapp-secret")
	rv := setSecretData(t, s.ns, "webapp-secret", map[string]string{"password": after})
	waitDeleted(t, s.ns, s.user, original)
	restarted := waitSecretRecord(t, s.ns, "webapp-secret", adopted)
	c.SettleSecrets(t, s.ns)

	var restartedEvent coreEvent
	eventually(t, waitTimeout, "a PodsRestarted Event on the Secret", func() (bool, string) {
		events := objectEvents(t, "Secret", s.ns, "webapp-secret")
		for _, e := range events {
			if e.Reason == "PodsRestarted" {
				restartedEvent = e
				return true, ""
			}
		}
		return false, fmt.Sprint(events)
	})
	assert.Contains(t, restartedEvent.Message, "for resourceVersion "+rv)

	_, metrics, err := c.get("/metrics")
	require.NoError(t, err)
	c.Stop(t)

	// Again with JSON logs, which render attributes their own way: a start
	// that finds the Secret recorded.
	j := s.start(t, "LOG_FORMAT=json")
	j.WaitReady(t)
	j.SettleSecrets(t, s.ns)
	j.Stop(t)
	require.True(t, strings.HasPrefix(strings.TrimSpace(j.Log(t)), "{"), "LOG_FORMAT=json")

	outputs := map[string]string{
		"log":      c.Log(t),
		"json log": j.Log(t),
		"metrics":  metrics,
		"events":   kubectl(t, "get", "events", "-n", s.ns, "-o", "json"),
	}
	key, err := os.ReadFile(s.keyFile)
	require.NoError(t, err)
	leaks := map[string]string{
		"digest key (hex)":    hex.EncodeToString(key)[:8],
		"digest key (base64)": base64.StdEncoding.EncodeToString(key),
	}
	for i, r := range []string{adopted, restarted} {
		leaks[fmt.Sprintf("recorded digest %d", i)] = strings.TrimPrefix(r, "hmac-sha256:")[:8]
	}
	for i, m := range []string{before, after} {
		b64 := base64.StdEncoding.EncodeToString([]byte(m))
		leaks[fmt.Sprintf("value %d", i)] = m
		leaks[fmt.Sprintf("value %d (base64)", i)] = b64
		leaks[fmt.Sprintf("value %d (SHA-256 prefix)", i)] = sha256Hex(m)[:8]
		leaks[fmt.Sprintf("value %d (SHA-256 prefix of its base64)", i)] = sha256Hex(b64)[:8]
	}
	for where, text := range outputs {
		require.NotEmpty(t, text, where)
		for what, needle := range leaks {
			// Any longer prefix contains this one; hex may be printed in capitals.
			if i := strings.Index(strings.ToLower(text), strings.ToLower(needle)); i >= 0 {
				t.Errorf("%s: %s (%q) leaked: …%s…", where, what, needle, text[max(0, i-200):min(len(text), i+len(needle)+50)])
			}
		}
	}
}

// --- the setup ------------------------------------------------------------------------------

// secretsSetup is a namespace with the ServiceAccount config-watcher and a
// digest key, from which the controller runs with Secrets on.
type secretsSetup struct {
	ns, user, keyFile string
	proxy             string
}

// newSecretsSetup creates the namespace, the base Role and RoleBinding, and
// a Role granting create on configmaps and, when grantSecrets, list and
// watch on secrets (no get, no write: the controller never needs them).
func newSecretsSetup(t *testing.T, grantSecrets bool) *secretsSetup {
	t.Helper()
	ns := newNamespace(t)
	s := &secretsSetup{ns: ns, user: "system:serviceaccount:" + ns + ":config-watcher", keyFile: writeDigestKey(t)}
	applyInNamespace(t, ns, filepath.Join(repoRoot, "manifests", "base", "rbac.yaml"))
	rules := `[{"apiGroups":[""],"resources":["configmaps"],"verbs":["create"]}]`
	if grantSecrets {
		rules = `[{"apiGroups":[""],"resources":["configmaps"],"verbs":["create"]},
		          {"apiGroups":[""],"resources":["secrets"],"verbs":["list","watch"]}]`
	}
	apply(t, ns, fmt.Sprintf(`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role",
	  "metadata":{"name":"config-watcher-secrets"},"rules":%s}`, rules))
	apply(t, ns, fmt.Sprintf(`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding",
	  "metadata":{"name":"config-watcher-secrets"},
	  "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"config-watcher-secrets"},
	  "subjects":[{"kind":"ServiceAccount","name":"config-watcher","namespace":%q}]}`, ns))
	want := map[bool]string{true: "yes", false: "no"}[grantSecrets]
	eventually(t, 30*time.Second, "RBAC in effect", func() (bool, string) {
		cm, _ := runKubectl("", "auth", "can-i", "create", "configmaps", "-n", ns, "--as", s.user)
		sec, _ := runKubectl("", "auth", "can-i", "watch", "secrets", "-n", ns, "--as", s.user)
		return strings.TrimSpace(cm) == "yes" && strings.TrimSpace(sec) == want, cm + sec
	})
	s.proxy = startProxy(t, serviceAccountKubeconfig(t, ns, "config-watcher"))
	return s
}

// start starts a controller watching the namespace's Secrets as the
// ServiceAccount, with settings added to (or overriding) the harness's.
func (s *secretsSetup) start(t *testing.T, settings ...string) *controllerProc {
	t.Helper()
	return startController(t, controllerOpts{namespace: s.ns, apiURL: s.proxy,
		extraEnv: append([]string{"WATCH_SECRETS=true", "DIGEST_KEY_FILE=" + s.keyFile}, settings...)})
}

// createSecret creates (not applies: kubectl apply would copy the data into
// an annotation) a Secret annotated to restart app=webapp.
func (s *secretsSetup) createSecret(t *testing.T, name, typ string, data map[string]string) {
	t.Helper()
	createFromFile(t, s.ns, secretJSON(name, typ, data, map[string]string{selectorAnnotation: "app=webapp"}))
}

// webapp creates Secret name (type typ, annotated to restart app=webapp)
// and the webapp Deployment reading one of its keys, and returns the
// webapp's pods.
func (s *secretsSetup) webapp(t *testing.T, name, typ string, data map[string]string) []pod {
	t.Helper()
	s.createSecret(t, name, typ, data)
	apply(t, s.ns, webappDeployment("secretKeyRef", name, slices.Min(slices.Collect(maps.Keys(data)))))
	return waitPods(t, s.ns, "app=webapp", 2)
}

// startAdopting starts the controller, waits until it is ready and has
// adopted Secret name, and returns it with the record it wrote.
func (s *secretsSetup) startAdopting(t *testing.T, name string) (*controllerProc, string) {
	t.Helper()
	c := s.start(t)
	c.WaitReady(t)
	return c, waitSecretRecord(t, s.ns, name, "")
}

// writeDigestKey writes 32 random bytes, base64-encoded, as DIGEST_KEY_FILE
// takes them, with the newline a shell's echo would add.
func writeDigestKey(t *testing.T) string {
	t.Helper()
	key := make([]byte, 32)
	_, err := rand.Read(key)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "digest-key")
	require.NoError(t, os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600))
	return path
}

// secretJSON is a Secret manifest with data (plain text, encoded here).
func secretJSON(name, typ string, data, annotations map[string]string) string {
	encoded := map[string]string{}
	for k, v := range data {
		encoded[k] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	b, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Secret", "type": typ,
		"metadata": map[string]any{"name": name, "annotations": annotations},
		"data":     encoded,
	})
	if err != nil {
		panic(err) // maps of strings always marshal
	}
	return string(b)
}

// tlsData is a fresh certificate and key: what a rotation writes.
func tlsData() map[string]string {
	return map[string]string{
		"tls.crt": "-----BEGIN CERTIFICATE-----\n" + randomHex(32) + "\n-----END CERTIFICATE-----\n",
		"tls.key": "-----BEGIN PRIVATE KEY-----\n" + randomHex(32) + "\n-----END PRIVATE KEY-----\n",
	}
}

// setSecretData merge-patches a Secret's data and returns its new resourceVersion.
func setSecretData(t *testing.T, ns, name string, data map[string]string) string {
	t.Helper()
	encoded := map[string]string{}
	for k, v := range data {
		encoded[k] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	patch, err := json.Marshal(map[string]any{"data": encoded})
	require.NoError(t, err)
	rv := kubectl(t, "patch", "secret", name, "-n", ns, "--type=merge", "-p", string(patch), "-o", "jsonpath={.metadata.resourceVersion}")
	require.NotEmpty(t, rv)
	return rv
}

func randomHex(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// --- the Secret and its state ---------------------------------------------------------------

type ownerReference struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
	// Controller and BlockOwnerDeletion are the controller's choice.
	Controller         *bool `json:"controller,omitempty"`
	BlockOwnerDeletion *bool `json:"blockOwnerDeletion,omitempty"`
}

func withoutFlags(refs []ownerReference) []ownerReference {
	var out []ownerReference
	for _, r := range refs {
		r.Controller, r.BlockOwnerDeletion = nil, nil
		out = append(out, r)
	}
	return out
}

type stateConfigMap struct {
	Metadata struct {
		objectMeta
		OwnerReferences []ownerReference `json:"ownerReferences"`
	} `json:"metadata"`
	Data       map[string]string `json:"data"`
	BinaryData map[string]string `json:"binaryData"`
}

func getStateConfigMap(t *testing.T, ns, name string) stateConfigMap {
	t.Helper()
	var cm stateConfigMap
	getJSON(t, ns, &cm, "configmap", name)
	return cm
}

func getSecret(t *testing.T, ns, name string) configMap {
	t.Helper()
	var s configMap // the metadata is all the tests read
	getJSON(t, ns, &s, "secret", name)
	return s
}

// stateNameOf names a Secret's state ConfigMap: the prefix and the
// Secret's name, or, when that is over 253 characters, the prefix and the
// first 16 hex digits of the name's SHA-256.
func stateNameOf(secret string) string {
	if name := secretStatePrefix + secret; len(name) <= 253 {
		return name
	}
	return secretStatePrefix + sha256Hex(secret)[:16]
}

// secretRecordOf returns R of the Secret's state ConfigMap ("" if none yet).
func secretRecordOf(t *testing.T, ns, secret string) string {
	t.Helper()
	out, err := runKubectl("", "get", "configmap", stateNameOf(secret), "-n", ns, "-o", "json", "--ignore-not-found")
	require.NoError(t, err)
	if strings.TrimSpace(out) == "" {
		return ""
	}
	var cm configMap
	require.NoError(t, json.Unmarshal([]byte(out), &cm))
	return cm.Metadata.Annotations[restartedAnnotation]
}

// waitSecretRecord waits until the Secret's state ConfigMap records a
// digest other than not, and returns it: the controller finished acting on
// that Secret.
func waitSecretRecord(t *testing.T, ns, secret, not string) string {
	t.Helper()
	return waitSecretRecordWithin(t, waitTimeout, ns, secret, not)
}

// waitSecretRecordWithin is waitSecretRecord with a timeout of its own (a
// round on a real node waits for pods to start).
func waitSecretRecordWithin(t *testing.T, timeout time.Duration, ns, secret, not string) string {
	t.Helper()
	var got string
	eventually(t, timeout, fmt.Sprintf("configmap %s/%s with %s other than %q", ns, stateNameOf(secret), restartedAnnotation, not), func() (bool, string) {
		got = secretRecordOf(t, ns, secret)
		return got != "" && got != not, fmt.Sprintf("annotation %q", got)
	})
	return got
}

// SettleSecrets is Settle for the Secret watch: the sentinel is a Secret,
// and its adoption (a state ConfigMap with a record) comes after every event
// of the Secrets before it.
func (c *controllerProc) SettleSecrets(t *testing.T, ns string) {
	t.Helper()
	name := "e2e-settle-" + randomSuffix()
	createFromFile(t, ns, secretJSON(name, "Opaque", map[string]string{"purpose": "sentinel"},
		map[string]string{selectorAnnotation: "e2e.k8spatterns.io/settle=" + name}))
	waitSecretRecord(t, ns, name, "")
}

// assertSecretUntouched checks that the Secret carries none of the
// controller's annotations and that user only ever listed and watched
// Secrets (the audit log shows at least one list, so it does log them).
func assertSecretUntouched(t *testing.T, ns, user, name string) {
	t.Helper()
	for k := range getSecret(t, ns, name).Metadata.Annotations {
		assert.False(t, strings.HasPrefix(k, controllerAnnotations), "the Secret carries %s", k)
	}
	requests := auditEvents(t, func(e auditEvent) bool {
		return e.User.Username == user && e.ObjectRef != nil && e.ObjectRef.Resource == "secrets"
	})
	var listed bool
	for _, e := range requests {
		listed = listed || e.Verb == "list"
		assert.Contains(t, []string{"list", "watch"}, e.Verb, "the controller did more than list and watch Secrets: %v", e)
	}
	assert.True(t, listed, "the audit log shows no Secret list by %s", user)
}

// stateWrites returns user's writes of state ConfigMaps in ns, except those
// of SettleSecrets' sentinels.
func stateWrites(t *testing.T, ns, user string) []auditEvent {
	t.Helper()
	return auditEvents(t, func(e auditEvent) bool {
		return e.User.Username == user && e.On(ns, "configmaps") &&
			(e.Verb == "create" || e.Verb == "patch" || e.Verb == "update") &&
			!strings.HasPrefix(e.ObjectRef.Name, secretStatePrefix+"e2e-settle-")
	})
}

var logAttrValue = regexp.MustCompile(`^("(?:[^"\\]|\\.)*"|\S*)`)

// logAttr returns attribute key of a text log line, unquoted ("" if absent).
func logAttr(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := logAttrValue.FindString(line[i+len(key)+2:])
	if u, err := strconv.Unquote(v); err == nil {
		return u
	}
	return v
}

// --- the rewriting owner --------------------------------------------------------------------

// rewritingOwner replaces a Secret whole at a fixed period, with the
// selector annotation and a sync counter but none of config-watcher's
// annotations, as External Secrets or a GitOps replace do.
type rewritingOwner struct {
	mu     sync.Mutex // held across each write: a change never races a rewrite
	ns     string
	name   string
	data   map[string]string
	n      int
	errs   []error
	cancel context.CancelFunc
	done   chan struct{}
}

func startRewritingOwner(t *testing.T, ns, name string, data map[string]string, every time.Duration) *rewritingOwner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	o := &rewritingOwner{ns: ns, name: name, data: data, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				o.rewrite()
			}
		}
	}()
	t.Cleanup(func() { o.cancel(); <-o.done })
	return o
}

func (o *rewritingOwner) rewrite() {
	o.mu.Lock()
	defer o.mu.Unlock()
	manifest := secretJSON(o.name, "Opaque", o.data, map[string]string{
		selectorAnnotation:          "app=webapp",
		"e2e.k8spatterns.io/synced": strconv.Itoa(o.n + 1),
	})
	if _, err := runKubectl(manifest, "replace", "-n", o.ns, "-f", "-"); err != nil {
		o.errs = append(o.errs, err)
		return
	}
	o.n++
}

// change writes new data (as whoever the owner syncs from) and makes the
// owner write it from then on.
func (o *rewritingOwner) change(t *testing.T, data map[string]string) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	setSecretData(t, o.ns, o.name, data)
	o.data = data
}

func (o *rewritingOwner) rewrites() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// waitRewrites waits until the owner has rewritten the Secret n times in all.
func (o *rewritingOwner) waitRewrites(t *testing.T, n int) {
	t.Helper()
	eventually(t, waitTimeout, fmt.Sprintf("%d rewrites of the Secret", n), func() (bool, string) {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.n >= n, fmt.Sprintf("%d rewrites, errors %v", o.n, o.errs)
	})
}

// stop stops the owner, fails the test if a rewrite failed, and returns how
// many it made.
func (o *rewritingOwner) stop(t *testing.T) int {
	t.Helper()
	o.cancel()
	<-o.done
	require.Empty(t, o.errs, "the owner's rewrites failed")
	return o.n
}

// TestSecretRecreatedWhileDownIsAdopted pins what the model cannot see
// (docs/design.md): a Secret deleted and created again, with other data,
// while no replica runs loses its state ConfigMap with it (the garbage
// collector deletes it with its owner), so the new Secret is adopted as a
// ConfigMap re-created while the controller was down is: recorded, no pod
// restarted, and the log says "adopted".
func TestSecretRecreatedWhileDownIsAdopted(t *testing.T) {
	s := newSecretsSetup(t, true)
	original := s.webapp(t, "webapp-secret", "Opaque", map[string]string{"password": "first"})
	first, adopted := s.startAdopting(t, "webapp-secret")
	first.SettleSecrets(t, s.ns)
	first.Stop(t)

	kubectl(t, "delete", "secret", "webapp-secret", "-n", s.ns)
	eventually(t, waitTimeout, "the garbage collector deleting the state ConfigMap with its Secret", func() (bool, string) {
		out, err := runKubectl("", "get", "configmap", stateNameOf("webapp-secret"), "-n", s.ns, "--ignore-not-found", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", out
	})
	s.createSecret(t, "webapp-secret", "Opaque", map[string]string{"password": "second, made while nobody watched"})

	second := s.start(t)
	second.WaitReady(t)
	recorded := waitSecretRecord(t, s.ns, "webapp-secret", "")
	second.SettleSecrets(t, s.ns)
	assert.NotEqual(t, adopted, recorded, "the new data is recorded")
	assert.Empty(t, podDeletes(t, s.ns, s.user), "a Secret re-created while the controller was down is adopted")
	assert.ElementsMatch(t, original, livePods(t, s.ns, "app=webapp"))
	assert.Contains(t, second.Log(t), `msg=adopted`)
}
