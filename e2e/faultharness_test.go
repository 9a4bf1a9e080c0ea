//go:build e2e

package e2e

// Helpers for the fault-injection tests (issue 7): a kubectl proxy that can be
// killed and restarted on the same port, the fault proxy of hack/faultproxy,
// restarting the control plane's own processes (etcd, kube-apiserver) in
// place, a second kube-apiserver without watch cache, SIGKILL for the
// controller, and audit-log readers for any log file.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/hack/audit"
)

// --- a restartable ambassador ---------------------------------------------------------------

// ambassador is a kubectl proxy on a fixed port that a test can kill and start again.
type ambassador struct {
	t          *testing.T
	kubeconfig string
	port       int
	url        string
	logPath    string
	cmd        *exec.Cmd
	done       chan struct{}
}

// newAmbassador returns a stopped ambassador for kubeconfig on a free port; Start it.
// It is stopped when the test ends.
func newAmbassador(t *testing.T, kubeconfig string) *ambassador {
	t.Helper()
	a := &ambassador{t: t, kubeconfig: kubeconfig, port: freePort(t), logPath: filepath.Join(t.TempDir(), "ambassador.log")}
	a.url = fmt.Sprintf("http://127.0.0.1:%d", a.port)
	t.Cleanup(func() {
		a.Kill()
		if t.Failed() {
			out, _ := os.ReadFile(a.logPath)
			t.Logf("ambassador (kubectl proxy %s) log:\n%s", a.url, out)
		}
	})
	return a
}

// Start runs kubectl proxy and waits until it answers.
func (a *ambassador) Start() {
	t := a.t
	t.Helper()
	logFile, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(t, err)
	a.cmd = exec.Command(env.kubectl, "--kubeconfig="+a.kubeconfig, "proxy",
		"--address=127.0.0.1", "--port="+strconv.Itoa(a.port))
	a.cmd.Stdout, a.cmd.Stderr = logFile, logFile
	require.NoError(t, a.cmd.Start(), "start kubectl proxy")
	done := make(chan struct{})
	a.done = done
	cmd := a.cmd
	go func() { _ = cmd.Wait(); logFile.Close(); close(done) }()
	eventually(t, 30*time.Second, "kubectl proxy on "+a.url, func() (bool, string) {
		select {
		case <-done:
			out, _ := os.ReadFile(a.logPath)
			t.Fatalf("kubectl proxy exited:\n%s", out)
		default:
		}
		resp, err := http.Get(a.url + "/version")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// Kill stops the proxy with SIGKILL (a crashed sidecar) and waits for it.
func (a *ambassador) Kill() {
	if a.cmd == nil {
		return
	}
	_ = a.cmd.Process.Kill()
	<-a.done
	a.cmd = nil
}

// --- the fault proxy --------------------------------------------------------------------------

var (
	faultProxyOnce sync.Once
	faultProxyBin  string
	faultProxyErr  error
)

// faultProxy is hack/faultproxy running in front of an upstream API URL.
type faultProxy struct {
	url     string
	logPath string
}

// startFaultProxy builds hack/faultproxy (once) and runs it in front of upstream
// until the test ends.
func startFaultProxy(t *testing.T, upstream string) *faultProxy {
	t.Helper()
	faultProxyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "faultproxy-")
		if err != nil {
			faultProxyErr = err
			return
		}
		faultProxyBin = filepath.Join(dir, "faultproxy")
		build := exec.Command("go", "build", "-o", faultProxyBin, "./hack/faultproxy")
		build.Dir = repoRoot
		if out, err := build.CombinedOutput(); err != nil {
			faultProxyErr = fmt.Errorf("go build ./hack/faultproxy: %v\n%s", err, out)
		}
	})
	require.NoError(t, faultProxyErr)
	tmp := t.TempDir()
	addrFile := filepath.Join(tmp, "addr")
	logPath := filepath.Join(tmp, "faultproxy.log")
	startLogged(t, "faultproxy", logPath, 5*time.Second,
		exec.Command(faultProxyBin, "-listen", "127.0.0.1:0", "-upstream", upstream, "-addr-file", addrFile))
	var addr []byte
	eventually(t, 10*time.Second, "faultproxy listening", func() (bool, string) {
		var err error
		addr, err = os.ReadFile(addrFile)
		return err == nil && len(addr) > 0, fmt.Sprint(err)
	})
	return &faultProxy{url: "http://" + string(addr), logPath: logPath}
}

func (f *faultProxy) do(t *testing.T, method, path, body string) string {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Less(t, resp.StatusCode, 300, "faultproxy %s %s: %s", method, path, b)
	return string(b)
}

// SetRules replaces the fault rules (a JSON array, see hack/faultproxy).
func (f *faultProxy) SetRules(t *testing.T, rules string) {
	t.Helper()
	f.do(t, http.MethodPut, "/_fault/rules", rules)
}

// Clear removes every fault.
func (f *faultProxy) Clear(t *testing.T) { t.Helper(); f.do(t, http.MethodDelete, "/_fault/rules", "") }

// Drop closes every connection in flight, as a proxy restart would.
func (f *faultProxy) Drop(t *testing.T) { t.Helper(); f.do(t, http.MethodPost, "/_fault/drop", "") }

// Fired returns how often each rule fired, by rule name.
func (f *faultProxy) Fired(t *testing.T) map[string]int {
	t.Helper()
	var s struct {
		Fired map[string]int `json:"fired"`
	}
	require.NoError(t, json.Unmarshal([]byte(f.do(t, http.MethodGet, "/_fault/stats", "")), &s))
	return s.Fired
}

// --- the controller -------------------------------------------------------------------------

// Kill sends SIGKILL to the controller and waits for it to die: a crash, no
// shutdown path runs.
func (c *controllerProc) Kill(t *testing.T) {
	t.Helper()
	c.stopped = true
	_ = c.cmd.Process.Kill()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("config-watcher did not die within 10 s of SIGKILL")
	}
}

// Log returns what the controller has logged so far.
func (c *controllerProc) Log(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(c.logPath)
	require.NoError(t, err)
	return string(b)
}

// --- the control plane's processes ------------------------------------------------------------

// requireStateDir returns the control plane's state dir (pid files, logs), or
// skips: restarting components needs a cluster started by hack/cluster.sh.
func requireStateDir(t *testing.T) string {
	t.Helper()
	requireCluster(t)
	dir := os.Getenv("CW_STATE_DIR")
	if dir == "" {
		t.Skip("CW_STATE_DIR is unset: restarting control-plane components needs a cluster from hack/cluster.sh (make e2e)")
	}
	return dir
}

// restartComponent stops a control-plane process started by hack/cluster.sh
// (SIGTERM, or SIGKILL with kill), waits down for downFor, and starts it again
// with the same command line, appending to its log and updating its pid file
// so that `hack/cluster.sh down` still stops it.
func restartComponent(t *testing.T, name string, kill bool, downFor time.Duration) {
	t.Helper()
	dir := requireStateDir(t)
	pidFile := filepath.Join(dir, name+".pid")
	b, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	require.NoError(t, err, "%s (pid %d) is not running", name, pid)
	argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	require.True(t, strings.Contains(string(raw), dir), "pid %d is not %s of %s", pid, name, dir)

	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	require.NoError(t, syscall.Kill(pid, sig))
	exited := func() bool {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		// A zombie has exited; its parent (hack/cluster.sh's shell) is gone or will reap it.
		return err != nil || bytes.Contains(st, []byte(") Z "))
	}
	// As hack/cluster.sh does: SIGKILL after 5 s (kube-apiserver can hang in
	// its graceful shutdown while long-running requests drain).
	for deadline := time.Now().Add(5 * time.Second); !exited() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if !exited() {
		t.Logf("%s (pid %d) still running 5 s after %v; sending SIGKILL", name, pid, sig)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		eventually(t, 10*time.Second, name+" exited", func() (bool, string) { return exited(), "still running" })
	}
	t.Logf("%s (pid %d) stopped with %v; down for %s", name, pid, sig, downFor)
	time.Sleep(downFor)
	startComponent(t, dir, name, argv)
}

// startComponent starts argv as the control plane's process name, in its own
// session (it outlives the test binary; hack/cluster.sh down stops it).
func startComponent(t *testing.T, dir, name string, argv []string) {
	t.Helper()
	logFile, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(t, err)
	defer logFile.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	require.NoError(t, cmd.Start(), "restart %s", name)
	go func() { _ = cmd.Wait() }()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644))
	t.Logf("%s restarted (pid %d)", name, cmd.Process.Pid)
}

// waitAPIReady waits until the API server answers /readyz through kubectl.
func waitAPIReady(t *testing.T, kubeconfig string) {
	t.Helper()
	eventually(t, 90*time.Second, "kube-apiserver /readyz", func() (bool, string) {
		out, err := runKubectl("", "--kubeconfig="+kubeconfig, "get", "--raw", "/readyz")
		return err == nil && strings.TrimSpace(out) == "ok", fmt.Sprintf("%q %v", out, err)
	})
}

// secondAPIServer starts another kube-apiserver on the cluster's etcd, with the
// main one's flags except: its own port, its own audit log, and extra flags
// replacing same-named ones (e.g. --watch-cache=false). It returns a kubeconfig
// for it (the admin identity) and its audit log path; it is stopped when the
// test ends.
func secondAPIServer(t *testing.T, extra ...string) (kubeconfig, auditLog string) {
	t.Helper()
	dir := requireStateDir(t)
	b, err := os.ReadFile(filepath.Join(dir, "kube-apiserver.pid"))
	require.NoError(t, err)
	raw, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/cmdline")
	require.NoError(t, err)
	argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	tmp := t.TempDir()
	port := freePort(t)
	auditLog = filepath.Join(tmp, "audit.log")
	override := map[string]string{
		"--secure-port":    strconv.Itoa(port),
		"--audit-log-path": auditLog,
	}
	for _, e := range extra {
		k, v, _ := strings.Cut(e, "=")
		override[k] = v
	}
	for i, a := range argv {
		k, _, ok := strings.Cut(a, "=")
		if v, found := override[k]; ok && found {
			argv[i] = k + "=" + v
			delete(override, k)
		}
	}
	for k, v := range override {
		argv = append(argv, k+"="+v)
	}
	startLogged(t, "second kube-apiserver", filepath.Join(tmp, "kube-apiserver.log"), 15*time.Second,
		exec.Command(argv[0], argv[1:]...))
	admin, err := os.ReadFile(env.kubeconfig)
	require.NoError(t, err)
	server := kubectl(t, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
	kubeconfig = filepath.Join(tmp, "admin.kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig,
		[]byte(strings.ReplaceAll(string(admin), server, fmt.Sprintf("https://127.0.0.1:%d", port))), 0o600))
	waitAPIReady(t, kubeconfig)
	t.Logf("second kube-apiserver on port %d with %v", port, extra)
	return kubeconfig, auditLog
}

// etcdPost posts a JSON body to the cluster's etcd gRPC gateway.
func etcdPost(t *testing.T, path, body string) map[string]any {
	t.Helper()
	etcd := os.Getenv("CW_ETCD_URL")
	if etcd == "" {
		t.Skip("CW_ETCD_URL is unset (a cluster from hack/cluster.sh has it)")
	}
	resp, err := http.Post(etcd+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "etcd %s: %s", path, b)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

// compactEtcd compacts etcd's history up to its current revision and returns it.
func compactEtcd(t *testing.T) int64 {
	t.Helper()
	st := etcdPost(t, "/v3/maintenance/status", "{}")
	hdr, _ := st["header"].(map[string]any)
	rev, err := strconv.ParseInt(fmt.Sprint(hdr["revision"]), 10, 64)
	require.NoError(t, err, "etcd status: %v", st)
	etcdPost(t, "/v3/kv/compaction", fmt.Sprintf(`{"revision":%d,"physical":true}`, rev))
	t.Logf("etcd compacted at revision %d", rev)
	return rev
}

// --- audit logs -------------------------------------------------------------------------------

// podDeletesIn returns the pod deletions in ns by user from the audit logs given
// (the cluster's by default).
func podDeletesIn(t *testing.T, ns, user string, logs ...string) []auditEvent {
	t.Helper()
	if len(logs) == 0 {
		logs = []string{env.auditLog}
	}
	var all []auditEvent
	for _, l := range logs {
		events, err := audit.Read(l, func(e auditEvent) bool {
			return e.Verb == "delete" && e.User.Username == user && e.On(ns, "pods")
		})
		if errors.Is(err, os.ErrNotExist) {
			continue // that API server has not logged a request yet
		}
		require.NoError(t, err, "read audit log")
		all = append(all, events...)
	}
	return all
}

// requireEachDeletedOnce checks "no change lost, each pod deleted once": every pod
// in pods has exactly one successful deletion by user in the audit logs, and
// no pod at all was deleted successfully twice. Answers other than 2xx (404
// after a lost response, 409) are allowed: they delete nothing. It returns
// the successful deletions of pods not in pods (replacements).
func requireEachDeletedOnce(t *testing.T, ns, user string, pods []pod, logs ...string) map[string]int {
	t.Helper()
	events := podDeletesIn(t, ns, user, logs...)
	n := deletesByPod(events)
	others := map[string]int{}
	for name, k := range n {
		require.LessOrEqual(t, k, 1, "pod %s deleted successfully %d times; audit: %v", name, k, events)
		others[name] = k
	}
	for _, p := range pods {
		require.Equal(t, 1, n[p.name], "pod %s: successful deletions; audit: %v", p.name, events)
		delete(others, p.name)
	}
	return others
}

// waitDeletedIn is waitDeleted over the given audit logs.
func waitDeletedIn(t *testing.T, ns, user string, pods []pod, timeout time.Duration, logs ...string) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("deletion of %d pods by %s", len(pods), user), func() (bool, string) {
		n := deletesByPod(podDeletesIn(t, ns, user, logs...))
		missing := 0
		for _, p := range pods {
			if n[p.name] == 0 {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d not deleted yet", missing, len(pods))
	})
}
