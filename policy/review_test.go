package policy

// Sequences a review of policy/ proved wrong (../shared/reviews), kept under
// the review's names: each failed before its fix. Their setups use this
// package's fakes; what they assert is the review's.

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/internal/testlog"
	"github.com/k8spatterns/config-watcher/metrics"
)

// TestReviewSecretDigestPrefixLeaksThroughATruncatedRefusal: hideDigest
// hides runs of 16 or more hex digits in the text of a refused state
// write, but it runs on the StatusError whose message apiclient has already
// cut at 1024 bytes (StatusFromJSON; plain-text bodies at 256). An
// admission webhook that quotes the annotations it refuses after a long
// enough preamble (a Gatekeeper constraint listing violations) has the cut
// fall inside the keyed digest: the 8-15 hex digits before the cut are not a
// run of 16, are not hidden, and reach the "write refused; will retry" and
// "round failed; will retry" log lines (the WriteRefused Event is cut at
// 1024 bytes after hiding, with a longer prefix, and escapes).
// TestSecretDataNeverLeaves forbids any 8 characters of the keyed digest in
// the logs.
func TestReviewSecretDigestPrefixLeaksThroughATruncatedRefusal(t *testing.T) {
	const shown = 12 // hex digits of the digest before the cut
	api := newFakeAPI(t, webPods()...)
	api.fault = func(r request) (int, string, bool) {
		if r.method != http.MethodPatch {
			return 0, "", false
		}
		head := `admission webhook "validation.gatekeeper.sh" denied the request: [cw-annotations-allowlist] `
		at := strings.Index(r.body, keyedDigestPrefix) + len(keyedDigestPrefix)
		msg := head + strings.Repeat("annotation not in the allowed list; ", 40)
		msg = msg[:1024-shown-at] + r.body // the violations listed before the quoted metadata
		status, _ := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403, "reason": "Forbidden", "message": msg})
		return 403, string(status), true
	}
	logs, rec := &testlog.Buffer{}, &fakeRecorder{}
	cfg := Config{RecordHash: true, SelectorAnnotation: DefaultSelectorAnnotation, DigestKey: testKey, Events: rec, NewBackOff: fastBackOff}
	c := New(cfg, api.client(), slog.New(slog.NewJSONHandler(logs, nil)), NewMetrics(metrics.NewRegistry()))
	listSecrets(t, c, secretSpec{selector: ptr("app=webapp"), data: s1})
	listConfigMaps(t, c)
	start(t, c)
	require.Eventually(t, func() bool { return len(rec.all()) > 0 }, waitFor, time.Millisecond)

	keyed := strings.TrimPrefix(secretHashOf(t, s1), keyedDigestPrefix)
	var events strings.Builder
	for _, e := range rec.all() {
		events.WriteString(e.kind + " " + e.reason + " " + e.message + "\n")
	}
	require.Contains(t, events.String(), "Secret WriteRefused")
	for where, text := range map[string]string{"logs": logs.String(), "events": events.String()} {
		for i := 0; i+8 <= len(keyed); i++ {
			if strings.Contains(text, keyed[i:i+8]) {
				t.Errorf("%s contain %q, 8 hex digits of the Secret's keyed digest", where, keyed[i:i+8])
				break
			}
		}
	}
	if i := strings.Index(logs.String(), keyed[:8]); i >= 40 {
		t.Logf("log: …%s", logs.String()[i-40:i+40])
	}
}
