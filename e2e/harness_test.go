//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/hack/audit"
)

const (
	selectorAnnotation  = "k8spatterns.io/podDeleteSelector"
	restartedAnnotation = "config-watcher.k8spatterns.io/restarted-for"

	// adminUser is who the shared proxy (CW_PROXY_URL) acts as: the controller's
	// identity in every test that does not bring its own. The harness itself never
	// deletes a pod, so every pod deletion by adminUser is the controller's.
	adminUser = "admin"

	pollInterval = 100 * time.Millisecond
	waitTimeout  = 60 * time.Second
)

// cluster is the control plane described by `hack/cluster.sh env`.
type cluster struct {
	kubeconfig string
	proxyURL   string
	auditLog   string
	kubectl    string
}

var (
	env          cluster
	clusterErr   string // why the tests skip, if they do
	repoRoot     string
	controller   string // path of the config-watcher binary built by TestMain
	buildFailure string // its build output when `go build` failed
)

func TestMain(m *testing.M) {
	code := runTests(m)
	if checkAmbassadorPaths(code == 0) != 0 {
		code = 1
	}
	os.Exit(code)
}

func runTests(m *testing.M) int {
	root, err := filepath.Abs("..")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	repoRoot = root

	env = cluster{
		kubeconfig: os.Getenv("KUBECONFIG"),
		proxyURL:   strings.TrimRight(os.Getenv("CW_PROXY_URL"), "/"),
		auditLog:   os.Getenv("CW_AUDIT_LOG"),
		kubectl:    os.Getenv("CW_KUBECTL"),
	}
	if env.kubectl == "" {
		env.kubectl = "kubectl"
	}
	if env.kubeconfig == "" || env.proxyURL == "" || env.auditLog == "" {
		clusterErr = "no control plane: KUBECONFIG, CW_PROXY_URL and CW_AUDIT_LOG are unset; " +
			`run hack/cluster.sh up && eval "$(hack/cluster.sh env)", or make e2e`
		return m.Run()
	}

	dir, err := os.MkdirTemp("", "config-watcher-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)

	// CW_CONTROLLER_BIN runs a binary built elsewhere (a release, or a deliberately
	// broken one to see the tests fail).
	if bin := os.Getenv("CW_CONTROLLER_BIN"); bin != "" {
		controller = bin
		fmt.Fprintf(os.Stderr, "e2e: testing %s (CW_CONTROLLER_BIN)\n", bin)
		return m.Run()
	}

	// Build the real binary once; tests that need it fail with the build output if
	// it does not build, the others still run.
	controller = filepath.Join(dir, "config-watcher")
	build := exec.Command("go", "build", "-o", controller, ".")
	build.Dir = repoRoot
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		buildFailure = fmt.Sprintf("go build -o %s . (in %s): %v\n%s", controller, repoRoot, err, out)
		fmt.Fprintf(os.Stderr, "e2e: building config-watcher failed; tests that run it will fail:\n%s\n", buildFailure)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: built config-watcher in %s\n", time.Since(start).Round(time.Millisecond))
	}
	return m.Run()
}

// buildAt builds config-watcher as it was at commit, from the repository the
// tests run in, and returns the binary's path. It skips the test where that
// cannot be done for want of history: no git, no repository (a tarball), or
// no such commit (a shallow clone).
func buildAt(t *testing.T, commit string) string {
	t.Helper()
	top, err := exec.Command("git", "-C", repoRoot, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("building config-watcher at %s needs git and the repository's history: %v", commit, err)
	}
	root := strings.TrimSpace(string(top))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in the repository (a shallow clone?): %v", commit, err)
	}
	dir := t.TempDir()
	extract := exec.Command("bash", "-c", `set -o pipefail; git -C "$1" archive "$2" | tar -x -C "$3"`, "extract", root, commit, dir)
	out, err := extract.CombinedOutput()
	require.NoError(t, err, "git archive %s | tar -x: %s", commit, out)
	bin := filepath.Join(dir, "config-watcher-"+commit)
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = dir
	start := time.Now()
	out, err = build.CombinedOutput()
	require.NoError(t, err, "go build at %s: %s", commit, out)
	t.Logf("built config-watcher at %s in %s", commit, time.Since(start).Round(time.Millisecond))
	return bin
}

// requireCluster skips the test when no control plane is configured.
func requireCluster(t *testing.T) {
	t.Helper()
	if clusterErr != "" {
		t.Skip(clusterErr)
	}
}

// requireBinary fails the test when the controller did not build.
func requireBinary(t *testing.T) {
	t.Helper()
	requireCluster(t)
	if buildFailure != "" {
		t.Fatalf("config-watcher binary not available:\n%s", buildFailure)
	}
}

// eventually polls cond until it reports true or the timeout passes; then it fails
// the test with what and with cond's last description of the state.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last state: %s", timeout, what, state)
		}
		time.Sleep(pollInterval)
	}
}

// --- kubectl ------------------------------------------------------------------------------

// runKubectl runs kubectl with the admin kubeconfig and returns stdout.
func runKubectl(stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.kubectl, append([]string{"--kubeconfig=" + env.kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// kubectl runs kubectl with the admin kubeconfig, fails the test on error, returns stdout.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runKubectl("", args...)
	require.NoError(t, err)
	return out
}

// apply applies manifest (YAML or JSON) in namespace ns.
func apply(t *testing.T, ns, manifest string) {
	t.Helper()
	_, err := runKubectl(manifest, "apply", "-n", ns, "-f", "-")
	require.NoError(t, err)
}

// getJSON runs `kubectl get … -o json` in ns and decodes the answer into v.
func getJSON(t *testing.T, ns string, v any, args ...string) {
	t.Helper()
	out := kubectl(t, append(append([]string{"get", "-n", ns}, args...), "-o", "json")...)
	require.NoError(t, json.Unmarshal([]byte(out), v), "decode kubectl get %v", args)
}

var nsUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// newNamespace creates a namespace for this test, waits for its default ServiceAccount
// (pods are refused before it exists) and deletes the namespace when the test ends.
func newNamespace(t *testing.T) string {
	t.Helper()
	requireCluster(t)
	name := nsUnsafe.ReplaceAllString(strings.ToLower(strings.TrimPrefix(t.Name(), "Test")), "-")
	if len(name) > 40 {
		name = name[:40]
	}
	ns := "cw-" + strings.Trim(name, "-") + "-" + randomSuffix()
	kubectl(t, "create", "namespace", ns)
	t.Cleanup(func() {
		if _, err := runKubectl("", "delete", "namespace", ns, "--wait=false"); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	eventually(t, waitTimeout, "default ServiceAccount in "+ns, func() (bool, string) {
		_, err := runKubectl("", "get", "serviceaccount", "default", "-n", ns)
		return err == nil, fmt.Sprint(err)
	})
	return ns
}

func randomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// --- objects --------------------------------------------------------------------------------

type objectMeta struct {
	Name              string            `json:"name"`
	UID               string            `json:"uid"`
	ResourceVersion   string            `json:"resourceVersion"`
	DeletionTimestamp *string           `json:"deletionTimestamp"`
	CreationTimestamp time.Time         `json:"creationTimestamp"`
	Labels            map[string]string `json:"labels"`
	Annotations       map[string]string `json:"annotations"`
}

type podList struct {
	Items []struct {
		Metadata objectMeta `json:"metadata"`
	} `json:"items"`
}

type configMap struct {
	Metadata objectMeta        `json:"metadata"`
	Data     map[string]string `json:"data"`
}

type pod struct{ name, uid string }

// podConditions is the part of a pod's status that says whether it is Ready.
type podConditions struct {
	Conditions []struct {
		Type   string `json:"type"`
		Status string `json:"status"`
	} `json:"conditions"`
}

// ready reports the Ready condition as the kubelet (or a test playing it) set it.
func (s podConditions) ready() bool {
	for _, c := range s.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// livePods lists the pods in ns matching selector that are not terminating.
func livePods(t *testing.T, ns, selector string) []pod {
	t.Helper()
	var l podList
	getJSON(t, ns, &l, "pods", "-l", selector)
	var pods []pod
	for _, it := range l.Items {
		if it.Metadata.DeletionTimestamp == nil {
			pods = append(pods, pod{it.Metadata.Name, it.Metadata.UID})
		}
	}
	return pods
}

// waitPods waits until exactly n live pods match selector in ns and returns them.
func waitPods(t *testing.T, ns, selector string, n int) []pod {
	t.Helper()
	var pods []pod
	eventually(t, waitTimeout, fmt.Sprintf("%d pods matching %q in %s", n, selector, ns), func() (bool, string) {
		pods = livePods(t, ns, selector)
		return len(pods) == n, fmt.Sprintf("pods: %v", pods)
	})
	return pods
}

// getConfigMap reads a ConfigMap from ns.
func getConfigMap(t *testing.T, ns, name string) configMap {
	t.Helper()
	var cm configMap
	getJSON(t, ns, &cm, "configmap", name)
	return cm
}

// waitRestartedFor waits until the ConfigMap's restarted-for annotation is set and differs
// from not, and returns it: proof that the controller finished acting on that ConfigMap.
func waitRestartedFor(t *testing.T, ns, name, not string) string {
	t.Helper()
	var got string
	eventually(t, waitTimeout, fmt.Sprintf("configmap %s/%s annotated %s (other than %q)", ns, name, restartedAnnotation, not), func() (bool, string) {
		got = getConfigMap(t, ns, name).Metadata.Annotations[restartedAnnotation]
		return got != "" && got != not, fmt.Sprintf("annotation %q", got)
	})
	return got
}

// mergePatch applies a JSON merge patch to a ConfigMap.
func mergePatch(t *testing.T, ns, name, patch string) {
	t.Helper()
	kubectl(t, "patch", "configmap", name, "-n", ns, "--type=merge", "-p", patch)
}

// webappManifests is the book's example: a ConfigMap whose data feeds the webapp
// Deployment's environment, annotated so that a data change restarts the pods.
func webappManifests(selector string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: webapp-config
  annotations:
    %s: %q
data:
  message: "Hello"
---
`, selectorAnnotation, selector) + webappDeployment("configMapKeyRef", "webapp-config", "message")
}

// webappDeployment is the webapp Deployment (two pods, app=webapp) whose
// MESSAGE comes from key of the object name, through ref (configMapKeyRef or
// secretKeyRef).
func webappDeployment(ref, name, key string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: webapp
spec:
  replicas: 2
  selector:
    matchLabels:
      app: webapp
  template:
    metadata:
      labels:
        app: webapp
    spec:
      containers:
      - name: webapp
        image: k8spatterns/mini-http-server
        env:
        - name: MESSAGE
          valueFrom:
            %s:
              name: %s
              key: %s
`, ref, name, key)
}

// --- audit log ------------------------------------------------------------------------------

// auditEvent is one request the API server logged.
type auditEvent = audit.Event

// auditEvents returns the completed requests in the audit log for which keep is true.
func auditEvents(t *testing.T, keep func(auditEvent) bool) []auditEvent {
	t.Helper()
	events, err := audit.Read(env.auditLog, keep)
	require.NoError(t, err, "read audit log")
	return events
}

// podDeletes returns the pod deletions in ns made by user, from the audit log.
func podDeletes(t *testing.T, ns, user string) []auditEvent {
	t.Helper()
	return auditEvents(t, func(e auditEvent) bool {
		return e.Verb == "delete" && e.User.Username == user && e.On(ns, "pods")
	})
}

// deletesByPod counts successful (2xx) deletions per pod name.
func deletesByPod(events []auditEvent) map[string]int {
	n := map[string]int{}
	for _, e := range events {
		if e.OK() {
			n[e.ObjectRef.Name]++
		}
	}
	return n
}

// waitDeleted waits until the audit log shows every pod in pods deleted by user.
func waitDeleted(t *testing.T, ns, user string, pods []pod) {
	t.Helper()
	eventually(t, waitTimeout, fmt.Sprintf("deletion of %v by %s", pods, user), func() (bool, string) {
		n := deletesByPod(podDeletes(t, ns, user))
		for _, p := range pods {
			if n[p.name] == 0 {
				return false, fmt.Sprintf("deletions so far: %v", n)
			}
		}
		return true, ""
	})
}

// --- the controller -------------------------------------------------------------------------

// controllerProc is one running config-watcher.
type controllerProc struct {
	cmd     *exec.Cmd
	httpURL string
	logPath string
	done    chan struct{}
	waitErr error
	stopped bool
}

type controllerOpts struct {
	namespace string
	apiURL    string // default: the shared proxy
	bin       string // default: the binary TestMain built (buildAt builds another)
	extraEnv  []string
	// wrap runs the controller through this command, the controller's path
	// appended as its last argument (e.g. a shell that first joins a cgroup,
	// then execs it: the pid stays the controller's).
	wrap []string
}

// startController starts the binary built by TestMain with env configuration; its
// output goes to a per-test log, shown if the test fails. It is stopped (and required
// to exit 0 on SIGTERM) when the test ends.
func startController(t *testing.T, o controllerOpts) *controllerProc {
	t.Helper()
	bin := o.bin
	if bin == "" {
		requireBinary(t)
		bin = controller
	}
	if o.apiURL == "" {
		o.apiURL = env.proxyURL
	}
	through := o.apiURL
	o.apiURL = recordRequests(t, o.apiURL, buildOf(o))
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	logPath := filepath.Join(t.TempDir(), "config-watcher.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)

	cmd := exec.Command(bin)
	if len(o.wrap) > 0 {
		cmd = exec.Command(o.wrap[0], append(o.wrap[1:], bin)...)
	}
	cmd.Env = append(os.Environ(),
		"WATCH_NAMESPACE="+o.namespace,
		"API_URL="+o.apiURL,
		"HTTP_ADDR="+addr,
		"LOG_FORMAT=text",
		"LOG_LEVEL=debug",
		"POD_NAME=config-watcher-e2e",
		// One worker handles ConfigMaps in the order their events came: what Settle
		// relies on to prove that nothing happened.
		"WORKERS=1",
	)
	cmd.Env = append(cmd.Env, o.extraEnv...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	require.NoError(t, cmd.Start(), "start config-watcher")
	c := &controllerProc{cmd: cmd, httpURL: "http://" + addr, logPath: logPath, done: make(chan struct{})}
	go func() {
		c.waitErr = cmd.Wait()
		logFile.Close()
		close(c.done)
	}()
	t.Logf("started config-watcher (pid %d) watching %s through %s (recorded at %s), http %s", cmd.Process.Pid, o.namespace, through, o.apiURL, addr)

	t.Cleanup(func() {
		if !c.stopped {
			if err := c.stop(); err != nil {
				t.Errorf("stopping config-watcher at the end of the test: %v", err)
			}
		}
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("config-watcher log (pid %d):\n%s", cmd.Process.Pid, out)
		}
	})
	return c
}

// stop sends SIGTERM and requires a clean exit (code 0) within 10 s; it kills the
// process if it does not exit.
func (c *controllerProc) stop() error {
	c.stopped = true
	select {
	case <-c.done:
		return fmt.Errorf("config-watcher had already exited: %v", c.waitErr)
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		if c.waitErr != nil {
			return fmt.Errorf("config-watcher did not exit 0 on SIGTERM: %v", c.waitErr)
		}
		return nil
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
		return errors.New("config-watcher did not exit within 10s of SIGTERM; killed it")
	}
}

// Stop stops the controller and fails the test unless it exits 0 promptly.
func (c *controllerProc) Stop(t *testing.T) {
	t.Helper()
	require.NoError(t, c.stop())
}

// get fetches path from the controller's HTTP server.
func (c *controllerProc) get(path string) (int, string, error) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(c.httpURL + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// WaitReady waits until /readyz answers 200 (initial list done, watching).
func (c *controllerProc) WaitReady(t *testing.T) {
	t.Helper()
	eventually(t, 30*time.Second, "config-watcher /readyz = 200", func() (bool, string) {
		select {
		case <-c.done:
			t.Fatalf("config-watcher exited before it was ready: %v", c.waitErr)
		default:
		}
		code, body, err := c.get("/readyz")
		return code == http.StatusOK, fmt.Sprintf("code %d, body %q, err %v", code, body, err)
	})
}

// Metric returns the sum of the samples of name whose labels include labels
// (e.g. "type", "MODIFIED"); 0 when the metric has no sample yet.
func (c *controllerProc) Metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	code, body, err := c.get("/metrics")
	require.NoError(t, err, "GET /metrics")
	require.Equal(t, http.StatusOK, code, "GET /metrics: %s", body)
	v, err := sumSamples(body, name, labels...)
	require.NoError(t, err)
	return v
}

// WaitMetric waits until Metric(name, labels...) >= min and returns its value.
func (c *controllerProc) WaitMetric(t *testing.T, min float64, name string, labels ...string) float64 {
	t.Helper()
	var v float64
	eventually(t, waitTimeout, fmt.Sprintf("%s%v >= %g", name, labels, min), func() (bool, string) {
		v = c.Metric(t, name, labels...)
		return v >= min, fmt.Sprintf("%g", v)
	})
	return v
}

// Settle proves the controller has processed every change made so far in ns: it
// creates a sentinel ConfigMap (annotated with a selector that matches no pod) and waits
// until the controller adopts it. One watch delivers a namespace's events in order and
// the tests run the controller with a single worker (WORKERS=1), which takes ConfigMaps
// first in, first out: whatever an earlier edit made the controller do has been done by
// the time the sentinel is adopted. It asks the API, never the controller's logs.
func (c *controllerProc) Settle(t *testing.T, ns string) {
	t.Helper()
	name := "e2e-settle-" + randomSuffix()
	apply(t, ns, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: %s
  annotations:
    %s: "e2e.k8spatterns.io/settle=%s"
data:
  purpose: "sentinel: adopted once the controller has caught up"
`, name, selectorAnnotation, name))
	waitRestartedFor(t, ns, name, "")
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)`)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// sumSamples parses Prometheus text exposition and sums the samples of name whose
// labels include every key/value pair in labels.
func sumSamples(text, name string, labels ...string) (float64, error) {
	if len(labels)%2 != 0 {
		return 0, fmt.Errorf("labels must be key/value pairs, got %v", labels)
	}
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		m := sampleLine.FindStringSubmatch(line)
		if m == nil || m[1] != name {
			continue
		}
		got := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			got[p[1]] = p[2]
		}
		match := true
		for i := 0; i < len(labels); i += 2 {
			if got[labels[i]] != labels[i+1] {
				match = false
			}
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
	}
	return sum, nil
}

// --- ports and proxies ----------------------------------------------------------------------

var portMu sync.Mutex

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startLogged starts cmd with its output in logPath and stops it when the test
// ends: SIGTERM, then SIGKILL after grace. A failed test shows the log's tail.
// The returned channel closes when the process exits.
func startLogged(t *testing.T, name, logPath string, grace time.Duration, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	require.NoError(t, cmd.Start(), "start %s", name)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logFile.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(grace):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			if len(out) > 8000 {
				out = out[len(out)-8000:]
			}
			t.Logf("%s log (tail):\n%s", name, out)
		}
	})
	return done
}

// startProxy runs `kubectl proxy` with kubeconfig on a free port until the test ends
// and returns its URL: an ambassador acting with that kubeconfig's identity.
func startProxy(t *testing.T, kubeconfig string) string {
	t.Helper()
	port := freePort(t)
	logPath := filepath.Join(t.TempDir(), "kubectl-proxy.log")
	args := append([]string{"--kubeconfig=" + kubeconfig, "proxy", "--address=127.0.0.1", "--port=" + strconv.Itoa(port)}, ambassadorFilters(t)...)
	done := startLogged(t, "kubectl proxy", logPath, 5*time.Second, exec.Command(env.kubectl, args...))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	eventually(t, 30*time.Second, "kubectl proxy on "+url, func() (bool, string) {
		select {
		case <-done:
			out, _ := os.ReadFile(logPath)
			t.Fatalf("kubectl proxy exited:\n%s", out)
		default:
		}
		// /api/v1: a path the ambassador's filters pass (not /version).
		resp, err := http.Get(url + "/api/v1")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return url
}

// ambassadorFilter is a line of the ambassador's args that narrows what it
// passes on.
var ambassadorFilter = regexp.MustCompile(`(?m)^\s*- (--(?:accept-paths|reject-methods)=\S+)$`)

// ambassadorFilters are the ambassador's --accept-paths and --reject-methods as
// the namespaced install (manifests/) has them: every test through a
// ServiceAccount's proxy checks that they let through each request the
// controller makes there.
func ambassadorFilters(t *testing.T) []string {
	t.Helper()
	f, err := buildFilters(namespacedBuild)
	require.NoError(t, err)
	return f.args
}

// serviceAccountKubeconfig writes a kubeconfig for the admin kubeconfig's cluster that
// authenticates with a fresh token of ServiceAccount sa in ns.
func serviceAccountKubeconfig(t *testing.T, ns, sa string) string {
	t.Helper()
	token := strings.TrimSpace(kubectl(t, "create", "token", sa, "-n", ns, "--duration=1h"))
	server := kubectl(t, "config", "view", "--minify", "--raw", "-o", "jsonpath={.clusters[0].cluster.server}")
	ca := kubectl(t, "config", "view", "--minify", "--raw", "-o", "jsonpath={.clusters[0].cluster.certificate-authority}")
	require.NotEmpty(t, server)
	require.NotEmpty(t, ca, "admin kubeconfig has no certificate-authority file")
	path := filepath.Join(t.TempDir(), sa+".kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: e2e
  context: {cluster: e2e, user: %s, namespace: %s}
current-context: e2e
`, server, ca, sa, token, sa, ns)
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	return path
}
