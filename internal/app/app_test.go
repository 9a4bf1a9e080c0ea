package app

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"github.com/k8spatterns/config-watcher/policy"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/internal/testlog"
	"github.com/k8spatterns/config-watcher/selector"
)

// mustSelector parses s by the grammar alone, failing the test if it cannot.
func mustSelector(t *testing.T, s string) *selector.Selector {
	t.Helper()
	sel, err := selector.ParseAny(s)
	require.NoError(t, err)
	return sel
}

// TestLoadConfig ensures each setting is read from its flag, else its
// environment variable, else its default, and that a bad value fails with
// an error naming the variable.
func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	key := []byte("0123456789abcdef0123456789abcdef")
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
		return path
	}
	keyFile := write("key", "  "+base64.StdEncoding.EncodeToString(key)+"\n") // echo's newline
	shortKey := write("short", base64.StdEncoding.EncodeToString(key[:31]))
	longKey := write("long", base64.StdEncoding.EncodeToString(append(key, 'x')))
	rawKey := write("raw", "correct horse battery staple, again")
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, c config)
		wantErr string
	}{
		{name: "Defaults", check: func(t *testing.T, c config) {
			assert.Equal(t, config{Namespaces: []string{"default"}, APIURL: "http://localhost:8001", SelectorAnnotation: "k8spatterns.io/podDeleteSelector",
				HTTPAddr: ":8080", LogFormat: "text", RecordHash: true, DigestKeyFile: "/etc/config-watcher/digest-key/key", Workers: 4, ShutdownTimeout: 10 * time.Second,
				RestartStrategy: "delete", MaxUnavailable: policy.Budget{Percent: 25}, ProgressDeadline: 10 * time.Minute, MaxConcurrent: 10, StormChanges: 5, StormWindow: time.Minute, MaxRestartsPerS: 50, PodIndex: true, Events: true,
				LeaseName: "config-watcher", LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
				NamespaceSelector: mustSelector(t, "config-watcher.k8spatterns.io/enabled=true")}, c)
		}},
		{name: "EnvOverridesDefault", env: map[string]string{"WATCH_NAMESPACE": "team-a", "RECORD_HASH": "false", "POD_NAME": "cw-1", "LOG_LEVEL": "debug"},
			check: func(t *testing.T, c config) {
				assert.Equal(t, []string{"team-a"}, c.Namespaces)
				assert.False(t, c.RecordHash)
				assert.Equal(t, "cw-1", c.PodName)
				assert.Equal(t, "DEBUG", c.LogLevel.String())
			}},
		{name: "FlagOverridesEnv", args: []string{"--watch-namespace=from-flag"}, env: map[string]string{"WATCH_NAMESPACE": "from-env"},
			check: func(t *testing.T, c config) { assert.Equal(t, []string{"from-flag"}, c.Namespaces) }},
		{name: "NamespaceList", env: map[string]string{"WATCH_NAMESPACE": "a, b,c", "LEADER_ELECT": "true", "POD_NAME": "p"},
			check: func(t *testing.T, c config) {
				assert.Equal(t, []string{"a", "b", "c"}, c.Namespaces)
				assert.Equal(t, "a,b,c", c.watched(), "as the start line names them")
				assert.Equal(t, "a", c.LeaseNamespace, "the Lease lives in the first namespace")
			}},
		{name: "AllNamespaces", env: map[string]string{"WATCH_NAMESPACE": "*", "LEADER_ELECT": "true", "POD_NAME": "p", "LEASE_NAMESPACE": "cw"},
			check: func(t *testing.T, c config) {
				assert.Equal(t, []string{""}, c.Namespaces)
				assert.Equal(t, "*", c.watched(), "as the start line names them")
				assert.Equal(t, "cw", c.LeaseNamespace)
			}},
		{name: "AllNamespacesElectionNeedsLeaseNamespace", env: map[string]string{"WATCH_NAMESPACE": "*", "LEADER_ELECT": "true", "POD_NAME": "p"}, wantErr: "needs LEASE_NAMESPACE"},
		{name: "NamespaceListedTwice", env: map[string]string{"WATCH_NAMESPACE": "a,a"}, wantErr: "listed twice"},
		{name: "EmptyNamespaceInList", env: map[string]string{"WATCH_NAMESPACE": "a,,b"}, wantErr: "WATCH_NAMESPACE"},
		{name: "StarInList", env: map[string]string{"WATCH_NAMESPACE": "a,*"}, wantErr: "WATCH_NAMESPACE"},
		{name: "BadLeaseNamespace", env: map[string]string{"LEASE_NAMESPACE": "No"}, wantErr: "LEASE_NAMESPACE"},
		{name: "EmptyEnvIsNotUnset", env: map[string]string{"WATCH_NAMESPACE": ""}, wantErr: `WATCH_NAMESPACE="" (from WATCH_NAMESPACE)`},
		{name: "BadNamespace", env: map[string]string{"WATCH_NAMESPACE": "Team_A"}, wantErr: "WATCH_NAMESPACE"},
		{name: "BadAPIURL", env: map[string]string{"API_URL": "localhost:8001"}, wantErr: "API_URL"},
		{name: "BadAnnotation", env: map[string]string{"SELECTOR_ANNOTATION": "not a key"}, wantErr: "SELECTOR_ANNOTATION"},
		{name: "BadHTTPAddr", env: map[string]string{"HTTP_ADDR": "8080"}, wantErr: "HTTP_ADDR"},
		{name: "BadLogFormat", env: map[string]string{"LOG_FORMAT": "xml"}, wantErr: "LOG_FORMAT"},
		{name: "BadLogLevelListsTheLevels", env: map[string]string{"LOG_LEVEL": "verbose"}, wantErr: `LOG_LEVEL="verbose" (from LOG_LEVEL): must be one of debug, info, warn, error (any case)`},
		{name: "LogLevelAndFormatInAnyCase", env: map[string]string{"LOG_LEVEL": "Warn", "LOG_FORMAT": "JSON", "RESTART_STRATEGY": "Evict"},
			check: func(t *testing.T, c config) {
				assert.Equal(t, slog.LevelWarn, c.LogLevel)
				assert.Equal(t, "json", c.LogFormat)
				assert.Equal(t, "evict", c.RestartStrategy)
			}},
		{name: "BoolFlagAloneIsTrue", args: []string{"--dry-run", "-watch-secrets=false"}, env: map[string]string{"WATCH_SECRETS": "true"},
			check: func(t *testing.T, c config) {
				assert.True(t, c.DryRun)
				assert.False(t, c.WatchSecrets, "--flag=false overrides the variable")
			}},
		{name: "BadBoolFlagNamesFlag", args: []string{"--dry-run=perhaps"}, wantErr: `DRY_RUN="perhaps" (from --dry-run): must be true or false`},
		{name: "DurationFlag", args: []string{"--progress-deadline", "90s"},
			check: func(t *testing.T, c config) { assert.Equal(t, 90*time.Second, c.ProgressDeadline) }},
		{name: "BadRecordHash", env: map[string]string{"RECORD_HASH": "maybe"}, wantErr: "RECORD_HASH"},
		{name: "BadWorkers", env: map[string]string{"WORKERS": "0"}, wantErr: `WORKERS="0" (from WORKERS): must be a whole number from 1 to 64`},
		{name: "BadShutdownTimeout", env: map[string]string{"SHUTDOWN_TIMEOUT": "1h"}, wantErr: "SHUTDOWN_TIMEOUT"},
		{name: "BadFlagValueNamesFlag", args: []string{"--workers=x"}, wantErr: "(from --workers)"},
		{name: "LeaderElectNeedsPodName", env: map[string]string{"LEADER_ELECT": "true"}, wantErr: "needs POD_NAME"},
		{name: "LeaderElectNeedsRecordHash", env: map[string]string{"LEADER_ELECT": "true", "POD_NAME": "a", "RECORD_HASH": "false"}, wantErr: "needs RECORD_HASH=true"},
		{name: "LeaseMustOutlastRenewDeadline", env: map[string]string{"LEADER_ELECT": "true", "POD_NAME": "a", "LEASE_DURATION": "10s"}, wantErr: "LEASE_DURATION must be longer than RENEW_DEADLINE"},
		{name: "RenewDeadlineMustOutlastRetry", env: map[string]string{"LEADER_ELECT": "true", "POD_NAME": "a", "RETRY_PERIOD": "10s"}, wantErr: "RENEW_DEADLINE must be longer than RETRY_PERIOD"},
		{name: "BadLeaseName", env: map[string]string{"LEASE_NAME": "Not_A_Name"}, wantErr: "LEASE_NAME"},
		{name: "BadLeaseDuration", env: map[string]string{"LEASE_DURATION": "1ms"}, wantErr: "LEASE_DURATION"},
		{name: "LeaderElection", env: map[string]string{"LEADER_ELECT": "true", "POD_NAME": "cw-0", "LEASE_NAME": "cw", "RETRY_PERIOD": "1s"},
			check: func(t *testing.T, c config) {
				assert.True(t, c.LeaderElect)
				assert.Equal(t, "cw", c.LeaseName)
				assert.Equal(t, time.Second, c.RetryPeriod)
			}},
		{name: "BadRestartStrategy", env: map[string]string{"RESTART_STRATEGY": "kill"}, wantErr: "RESTART_STRATEGY"},
		{name: "BadMaxConcurrentRestarts", env: map[string]string{"MAX_CONCURRENT_RESTARTS": "-1"}, wantErr: "MAX_CONCURRENT_RESTARTS=\"-1\" (from MAX_CONCURRENT_RESTARTS): must be a whole number from 0 to 10000"},
		{name: "BadEvents", env: map[string]string{"EVENTS": "sometimes"}, wantErr: "EVENTS"},
		{name: "BadPodIndex", env: map[string]string{"POD_INDEX": "maybe"}, wantErr: "POD_INDEX"},
		{name: "BadDryRun", env: map[string]string{"DRY_RUN": "perhaps"}, wantErr: "DRY_RUN"},
		{name: "EvictPacedDryRun", env: map[string]string{"RESTART_STRATEGY": "evict", "PROGRESS_DEADLINE": "1m", "MAX_CONCURRENT_RESTARTS": "1", "DRY_RUN": "true"},
			check: func(t *testing.T, c config) {
				assert.Equal(t, "evict", c.RestartStrategy)
				assert.Equal(t, time.Minute, c.ProgressDeadline)
				assert.Equal(t, 1, c.MaxConcurrent)
				assert.True(t, c.DryRun)
			}},
		{name: "MaxUnavailableCount", env: map[string]string{"MAX_UNAVAILABLE": "2"},
			check: func(t *testing.T, c config) { assert.Equal(t, policy.Budget{Pods: 2}, c.MaxUnavailable) }},
		{name: "MaxUnavailableAllAtOnce", args: []string{"--max-unavailable=100%"},
			check: func(t *testing.T, c config) { assert.Equal(t, policy.Budget{Percent: 100}, c.MaxUnavailable) }},
		{name: "MaxUnavailableZeroRefused", env: map[string]string{"MAX_UNAVAILABLE": "0"}, wantErr: `MAX_UNAVAILABLE="0" (from MAX_UNAVAILABLE): must be a whole number of pods (at least 1) or a percentage from 1% to 100%`},
		{name: "MaxUnavailableOverAllRefused", env: map[string]string{"MAX_UNAVAILABLE": "150%"}, wantErr: "MAX_UNAVAILABLE"},
		{name: "MaxUnavailableFractionRefused", env: map[string]string{"MAX_UNAVAILABLE": "2.5%"}, wantErr: "MAX_UNAVAILABLE"},
		{name: "ProgressDeadlineBelowOneSecondRefused", env: map[string]string{"PROGRESS_DEADLINE": "500ms"}, wantErr: "PROGRESS_DEADLINE"},
		{name: "WatchSecretsReadsTheDigestKey", env: map[string]string{"WATCH_SECRETS": "true", "DIGEST_KEY_FILE": keyFile},
			check: func(t *testing.T, c config) {
				assert.True(t, c.WatchSecrets)
				assert.Equal(t, key, c.DigestKey, "decoded, the blanks around it dropped")
			}},
		{name: "DigestKeyUnreadWithoutSecrets", env: map[string]string{"DIGEST_KEY_FILE": filepath.Join(dir, "absent")},
			check: func(t *testing.T, c config) { assert.Nil(t, c.DigestKey) }},
		{name: "WatchSecretsWithoutAKeyRefusedSayingHowToMakeOne", env: map[string]string{"WATCH_SECRETS": "true", "DIGEST_KEY_FILE": filepath.Join(dir, "absent")},
			wantErr: `WATCH_SECRETS=true needs a digest key of 32 random bytes, base64-encoded, in DIGEST_KEY_FILE (` + filepath.Join(dir, "absent") + `): open`},
		{name: "WatchSecretsWithAShortKeyRefused", env: map[string]string{"WATCH_SECRETS": "true", "DIGEST_KEY_FILE": shortKey},
			wantErr: "the key is 31 bytes once decoded, not 32. In the cluster, create it once with: kubectl -n <controller namespace> create secret generic config-watcher-digest-key --from-literal=key=\"$(head -c 32 /dev/urandom | base64)\""},
		{name: "WatchSecretsWithALongKeyRefused", env: map[string]string{"WATCH_SECRETS": "true", "DIGEST_KEY_FILE": longKey},
			wantErr: "the key is 33 bytes once decoded, not 32"},
		{name: "WatchSecretsWithAKeyNotInBase64Refused", env: map[string]string{"WATCH_SECRETS": "true", "DIGEST_KEY_FILE": rawKey},
			wantErr: "the key is not base64. In the cluster, create it once with"},
		{name: "OwnPodFromTheDownwardAPI", env: map[string]string{"POD_NAME": "cw-1", "POD_NAMESPACE": "ops", "POD_UID": "0c7b5b1e-6f0e-4a8e-9d7e-2f4b1c3d5e6f"},
			check: func(t *testing.T, c config) {
				assert.Equal(t, policy.OwnPod{Namespace: "ops", Name: "cw-1", UID: "0c7b5b1e-6f0e-4a8e-9d7e-2f4b1c3d5e6f"}, c.ownPod())
			}},
		{name: "BadPodNamespace", env: map[string]string{"POD_NAMESPACE": "Ops"}, wantErr: "POD_NAMESPACE"},
		{name: "BadPodUID", env: map[string]string{"POD_UID": "a b"}, wantErr: "POD_UID"},
		{name: "NamespaceSelectorOnlyUnderAllNamespaces", env: map[string]string{"WATCH_NAMESPACE": "a,b"},
			check: func(t *testing.T, c config) { assert.False(t, c.namespaceConsent()) }},
		{name: "NamespaceSelectorByDefaultUnderAllNamespaces", env: map[string]string{"WATCH_NAMESPACE": "*"},
			check: func(t *testing.T, c config) {
				require.True(t, c.namespaceConsent())
				assert.Equal(t, "config-watcher.k8spatterns.io/enabled=true", c.NamespaceSelector.String())
			}},
		{name: "NamespaceSelectorEmptyIsEveryNamespace", env: map[string]string{"WATCH_NAMESPACE": "*", "NAMESPACE_SELECTOR": ""},
			check: func(t *testing.T, c config) { assert.False(t, c.namespaceConsent()) }},
		{name: "NamespaceSelectorByPresence", env: map[string]string{"WATCH_NAMESPACE": "*", "NAMESPACE_SELECTOR": "team"},
			check: func(t *testing.T, c config) { assert.Equal(t, "team", c.NamespaceSelector.String()) }},
		{name: "BadNamespaceSelector", env: map[string]string{"NAMESPACE_SELECTOR": "a&b"}, wantErr: "NAMESPACE_SELECTOR"},
		{name: "PodOptInLabel", env: map[string]string{"POD_OPT_IN_LABEL": "config-watcher.k8spatterns.io/restart=true"},
			check: func(t *testing.T, c config) {
				assert.Equal(t, "config-watcher.k8spatterns.io/restart=true", c.PodOptIn.String())
			}},
		{name: "PodOptInLabelNeedsAValue", env: map[string]string{"POD_OPT_IN_LABEL": "restart"}, wantErr: `POD_OPT_IN_LABEL="restart" (from POD_OPT_IN_LABEL): must be one label as key=value`},
		{name: "StrayArgument", args: []string{"extra"}, wantErr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			c, err := loadConfig(tt.args, lookup, io.Discard)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

// TestHelpListsEverySettingWithWhatItTakes ensures --help names each
// setting's flag with what it takes (a bool flag nothing), its variable and
// its default, in the order of the settings table, and --version.
func TestHelpListsEverySettingWithWhatItTakes(t *testing.T) {
	var out bytes.Buffer
	_, err := loadConfig([]string{"--help"}, func(string) (string, bool) { return "", false }, &out)
	require.ErrorIs(t, err, flag.ErrHelp)
	help := out.String()
	for _, want := range []string{
		"  --dry-run\n", "(env DRY_RUN, default false)",
		"  --shutdown-timeout duration\n", "(env SHUTDOWN_TIMEOUT, default 10s)",
		"  --workers int\n", "  --log-level debug|info|warn|error\n", "  --watch-namespace string\n",
		`(env LEASE_NAMESPACE, default "")`, "  --version\n",
	} {
		assert.Contains(t, help, want)
	}
	last := -1
	for _, s := range settings {
		i := strings.Index(help, "(env "+s.env+",")
		assert.Greater(t, i, last, "%s is missing or out of the table's order", s.env)
		last = i
	}
}

// TestVersionPrintsVersionCommitAndGo ensures --version prints the given
// version, the commit and the Go version on stdout and runs nothing.
func TestVersionPrintsVersionCommitAndGo(t *testing.T) {
	var stdout, stderr bytes.Buffer
	nothing := func(string) (string, bool) { return "", false }
	require.NoError(t, Run(context.Background(), Options{Args: []string{"--version"}, LookupEnv: nothing, Stdout: &stdout, Stderr: &stderr, Version: "v1.2.3", Revision: "0123456789abcdef0123456789abcdef01234567"}))
	assert.Equal(t, "config-watcher v1.2.3 (commit 0123456789abcdef0123456789abcdef01234567, "+runtime.Version()+", "+runtime.GOOS+"/"+runtime.GOARCH+")\n", stdout.String())
	assert.Empty(t, stderr.String())
}

// fakeCluster answers the requests of one scenario: a list (streamed on the
// watch, or paged) with one annotated ConfigMap, a watch that delivers a data
// change and then stays open, and the pod and state calls that follow. A PATCH
// of the ConfigMap's annotations is applied, as the API server applies a merge
// patch, so the controller reads back the intent and record it wrote.
type fakeCluster struct {
	mu          sync.Mutex
	deletes     []string
	patches     int
	cmLists     int               // paged ConfigMap LISTs
	annotations map[string]string // what the PATCHes left beside the selector
}

const (
	cmV1 = `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"webapp-config","namespace":"ns","uid":"u1","resourceVersion":"10","annotations":{"k8spatterns.io/podDeleteSelector":"app=webapp"}},"data":{"message":"Hello"}}`
	cmV2 = `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"webapp-config","namespace":"ns","uid":"u1","resourceVersion":"11","annotations":{"k8spatterns.io/podDeleteSelector":"app=webapp"}},"data":{"message":"Hello again"}}`
	pods = `{"kind":"PodList","metadata":{"resourceVersion":"11"},"items":[` +
		`{"metadata":{"name":"webapp-1","namespace":"ns","uid":"p1","resourceVersion":"5","labels":{"app":"webapp"}},"status":{"phase":"Running"}},` +
		`{"metadata":{"name":"webapp-2","namespace":"ns","uid":"p2","resourceVersion":"6","labels":{"app":"webapp"}},"status":{"phase":"Running"}}]}`
)

func (f *fakeCluster) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	switch {
	case q.Get("watch") == "true":
		w.WriteHeader(http.StatusOK)
		if r.URL.Path == "/api/v1/namespaces/ns/configmaps" && q.Get("resourceVersion") == "10" {
			fmt.Fprintf(w, `{"type":"MODIFIED","object":%s}`+"\n", cmV2)
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done() // a watch stays open until the client leaves
	case r.URL.Path == "/api/v1/namespaces/ns/configmaps":
		f.mu.Lock()
		f.cmLists++
		f.mu.Unlock()
		fmt.Fprintf(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"10"},"items":[%s]}`, cmV1)
	case r.URL.Path == "/api/v1/namespaces/ns/pods" && r.Method == http.MethodGet:
		fmt.Fprint(w, pods)
	case strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/ns/pods/") && r.Method == http.MethodDelete:
		f.mu.Lock()
		f.deletes = append(f.deletes, strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/ns/pods/"))
		f.mu.Unlock()
		fmt.Fprint(w, `{"kind":"Pod"}`)
	case r.URL.Path == "/api/v1/namespaces/ns/configmaps/webapp-config" && r.Method == http.MethodPatch:
		fmt.Fprint(w, f.patch(r.Body))
	default:
		http.Error(w, "unexpected "+r.Method+" "+r.URL.String(), http.StatusNotFound)
	}
}

// patch applies a merge patch's metadata.annotations to the ConfigMap and
// returns it as the server would.
func (f *fakeCluster) patch(body io.Reader) string {
	var p struct {
		Metadata struct {
			Annotations map[string]*string `json:"annotations"`
		} `json:"metadata"`
	}
	_ = json.NewDecoder(body).Decode(&p)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.patches++
	if f.annotations == nil {
		f.annotations = map[string]string{"k8spatterns.io/podDeleteSelector": "app=webapp"}
	}
	for k, v := range p.Metadata.Annotations {
		if v == nil {
			delete(f.annotations, k)
		} else {
			f.annotations[k] = *v
		}
	}
	a, _ := json.Marshal(f.annotations)
	return fmt.Sprintf(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"webapp-config","namespace":"ns","uid":"u1","resourceVersion":"%d","annotations":%s},"data":{"message":"Hello again"}}`, 11+f.patches, a)
}

func (f *fakeCluster) deleted() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.deletes...)
}

// TestRunRestartsPodsAndServesProbes ensures the wired program lists (in
// pages), watches, restarts the pods of a changed ConfigMap, serves its probes and metrics, and returns
// nil when its context ends (as on SIGTERM).
func TestRunRestartsPodsAndServesProbes(t *testing.T) {
	fc := &fakeCluster{}
	api := httptest.NewServer(fc)
	defer api.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // before api.Close, which waits for the program's watches to end
	// All at once, as the book's script: the fake has no owner to replace a pod.
	env := map[string]string{"API_URL": api.URL, "WATCH_NAMESPACE": "ns", "HTTP_ADDR": "127.0.0.1:0", "LOG_FORMAT": "json", "MAX_UNAVAILABLE": "100%"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	ready := make(chan string, 1)
	errc := make(chan error, 1)
	var logs testlog.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("program output:\n%s", logs.String())
		}
	})
	go func() { errc <- Run(ctx, Options{LookupEnv: lookup, Stdout: io.Discard, Stderr: &logs, Ready: ready}) }()
	addr := <-ready

	metrics := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	require.Eventually(t, func() bool {
		return strings.Contains(metrics(), `config_watcher_reconciles_total{result="restarted"} 1`)
	}, 5*time.Second, 5*time.Millisecond)
	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2"}, fc.deleted())
	require.Eventually(t, func() bool { return get(t, "http://"+addr+"/readyz") == 200 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 200, get(t, "http://"+addr+"/healthz"))

	body := metrics()
	assert.Contains(t, body, `config_watcher_events_total{type="MODIFIED"} 1`)
	assert.Contains(t, body, `config_watcher_build_info{`)
	assert.Contains(t, body, `config_watcher_reconciles_total{result="gone"} 0`, "every result is exported from the start")
	assert.Contains(t, body, "config_watcher_leader 1")
	fc.mu.Lock()
	assert.Equal(t, 1, fc.cmLists, "the ConfigMap loop lists once, then watches")
	fc.mu.Unlock()

	cancel()
	select {
	case err := <-errc:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
	assert.NotContains(t, logs.String(), "Hello", "ConfigMap data never reaches the logs")
}

func get(t *testing.T, url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSIGTERMExitsZero ensures the real process stops watching and exits 0
// on SIGTERM. The test binary re-runs itself as the program.
func TestSIGTERMExitsZero(t *testing.T) {
	if os.Getenv("CONFIG_WATCHER_RUN_MAIN") == "1" {
		os.Exit(Main(nil, "dev", "unknown"))
	}
	api := httptest.NewServer(&fakeCluster{})
	t.Cleanup(api.Close) // after the program is killed: its watches hold connections open
	cmd := exec.Command(os.Args[0], "-test.run=^TestSIGTERMExitsZero$")
	cmd.Env = append(os.Environ(), "CONFIG_WATCHER_RUN_MAIN=1", "API_URL="+api.URL, "WATCH_NAMESPACE=ns", "HTTP_ADDR=127.0.0.1:0")
	var out testlog.Buffer
	cmd.Stderr = &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	// A minute: on a loaded machine the race-built subprocess once printed
	// nothing at all within 10 s, not even its first log line.
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "pods restarted") }, time.Minute, 10*time.Millisecond, "the program never acted on the data change; output:\n%s", &out)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	err := cmd.Wait()
	assert.NoError(t, err, "exit status after SIGTERM; output:\n%s", out.String())
	assert.Contains(t, out.String(), "stopped")
}

// TestReadyzSaysWhyAndTheFix ensures /readyz, while a list is refused,
// answers 503 naming the collection, the error and the RBAC rule that
// grants the list, and that the log says it once.
func TestReadyzSaysWhyAndTheFix(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"configmaps is forbidden","reason":"Forbidden","code":403}`)
	}))
	defer api.Close()
	addr, logs := runWith(t, map[string]string{"API_URL": api.URL, "WATCH_NAMESPACE": "ns", "POD_INDEX": "false"})
	url := "http://" + addr + "/readyz"

	const fix = `fix: RBAC: the controller may not list configmaps in namespace ns; grant it with the rule {apiGroups: [""], resources: ["configmaps"], verbs: ["list"]} in a Role in namespace ns bound to the controller's ServiceAccount`
	var code int
	var body string
	require.Eventually(t, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		code, body = resp.StatusCode, string(b)
		return strings.Contains(body, fix)
	}, 10*time.Second, 5*time.Millisecond, "last answer: %d %s", code, body)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.True(t, strings.HasPrefix(body, "/api/v1/namespaces/ns/configmaps: list /api/v1/namespaces/ns/configmaps: 403 Forbidden: configmaps is forbidden; "+fix), body)
	assert.Equal(t, 1, strings.Count(logs.String(), `msg="list failed; retrying"`), logs.String())
}

// runWith runs the program with env (and HTTP_ADDR on a free loopback port)
// until the test ends, and returns its HTTP address and its log. Its lists
// may never end: it stops without waiting for rounds.
func runWith(t *testing.T, env map[string]string) (addr string, logs *testlog.Buffer) {
	t.Helper()
	env = maps.Clone(env)
	env["HTTP_ADDR"], env["SHUTDOWN_TIMEOUT"] = "127.0.0.1:0", "1ms"
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan string, 1), make(chan error, 1)
	logs = &testlog.Buffer{}
	go func() {
		done <- Run(ctx, Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }, Stdout: io.Discard, Stderr: logs, Ready: ready})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		if t.Failed() {
			t.Logf("program output:\n%s", logs.String())
		}
	})
	select {
	case addr = <-ready:
	case err := <-done:
		require.FailNow(t, "the program ended before it listened", "%v\n%s", err, logs.String())
	}
	return addr, logs
}
