//go:build e2e

package e2e

// The memory bound of issue 12: the controller runs inside a memory cgroup of
// its own, limited to what the manifests give its container, in a namespace
// holding far more ConfigMap (or Secret) data than that limit.

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	bigConfigMaps    = 40
	bigConfigMapSize = 900_000 // bytes of data each: 36 MB in all, none annotated
	// Bytes of data in each large Secret, decoded: a TLS bundle of 1 MB. Under the API's
	// 1 MiB limit on a Secret's data, and with its base64 form in the object under etcd's
	// 1.5 MiB request limit.
	bigSecretSize = 1_000_000
)

// TestMemoryBoundedUnderManifestLimit ensures the controller, run inside a
// memory cgroup set to the manifests' limit for its container, in a namespace
// holding 40 ConfigMaps of 900 KB next to the webapp, becomes ready, acts on
// a data change of the annotated ConfigMap and is never OOM-killed: not at
// start, and not at a relist forced by a 410 answered to its watch.
func TestMemoryBoundedUnderManifestLimit(t *testing.T) {
	requireCluster(t)
	limit := manifestMemoryLimit(t)
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	createBigConfigMaps(t, ns, bigConfigMaps, bigConfigMapSize)
	original := waitPods(t, ns, "app=webapp", 2)

	cg := newMemCgroup(t, limit)
	fp := startFaultProxy(t, env.proxyURL)
	c := startController(t, controllerOpts{namespace: ns, apiURL: fp.url, wrap: cg.wrap()})
	c.WaitReady(t)
	t.Logf("ready: %s", cg.report(c))
	assert.Zero(t, cg.oomKills(t), "OOM kills during the initial list")

	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	mergePatch(t, ns, "webapp-config", `{"data":{"message":"Hello, bounded memory"}}`)
	waitDeleted(t, ns, adminUser, original)
	waitRestartedFor(t, ns, "webapp-config", adopted)

	// A forced relist: the next ConfigMap watch is answered 410 Gone.
	relists := c.Metric(t, "config_watcher_relists_total")
	fp.SetRules(t, `[{"name":"gone","watch":"true","path":"/configmaps","status":410,"times":1}]`)
	fp.Drop(t)
	c.WaitMetric(t, relists+1, "config_watcher_relists_total")
	c.WaitReady(t)
	c.Settle(t, ns) // acting again after the relist
	assert.Equal(t, 1, fp.Fired(t)["gone"])
	t.Logf("after the relist: %s", cg.report(c))
	assert.Zero(t, cg.oomKills(t), "OOM kills at the relist")
	assertDeletedOnce(t, ns, adminUser, original)
}

// TestMemoryBoundedWithLargeSecrets ensures the controller, watching Secrets
// (WATCH_SECRETS=true) inside a memory cgroup set to the manifests' limit, in a
// namespace holding 1.5 times that limit in Secrets of 1 MB (twice it as the JSON it
// reads), becomes ready, acts on a data change of the annotated Secret and is never
// OOM-killed: not at start, and not at a relist of the Secret watch forced by a 410.
// A Helm release Secret (type helm.sh/release.v1), annotated and changed before the
// annotated Secret is, is never delivered: the Secret watch counts one MODIFIED event
// (the annotated Secret's), nothing is recorded for the release and no pod is
// restarted for it.
func TestMemoryBoundedWithLargeSecrets(t *testing.T) {
	requireCluster(t)
	limit := manifestMemoryLimit(t)
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	const secret, release = "webapp-tls", "sh.helm.release.v1.webapp.v1"
	postSecret(t, ns, secret, "kubernetes.io/tls", "app=webapp", map[string][]byte{
		"tls.crt": randomBytes(4000), "tls.key": randomBytes(1700),
	})
	// What Helm keeps of a release, up to 1 MiB; annotated, so that the controller
	// would act on it if the server sent it.
	postSecret(t, ns, release, "helm.sh/release.v1", "app=webapp", map[string][]byte{"release": randomBytes(bigSecretSize)})
	n := int(limit * 3 / 2 / bigSecretSize)
	for i := range n {
		postSecret(t, ns, fmt.Sprintf("big-%03d", i), "Opaque", "", map[string][]byte{"bundle.pem": randomBytes(bigSecretSize)})
	}
	t.Logf("%d Secrets of %d bytes (%d MiB of data, decoded) next to the webapp", n, bigSecretSize, n*bigSecretSize>>20)
	original := waitPods(t, ns, "app=webapp", 2)

	keyFile := writeDigestKey(t)
	cg := newMemCgroup(t, limit)
	fp := startFaultProxy(t, env.proxyURL)
	c := startController(t, controllerOpts{namespace: ns, apiURL: fp.url, wrap: cg.wrap(),
		extraEnv: []string{"WATCH_SECRETS=true", "DIGEST_KEY_FILE=" + keyFile}})
	c.WaitReady(t)
	t.Logf("ready: %s", cg.report(c))
	assert.Zero(t, cg.oomKills(t), "OOM kills during the initial list")

	// The Secret's state lives in a ConfigMap of the controller's: its record (R).
	state := func(name string) (string, bool) {
		out, err := runKubectl("", "get", "configmap", "config-watcher-secret."+name, "-n", ns, "--ignore-not-found",
			"-o", `jsonpath={.metadata.annotations.config-watcher\.k8spatterns\.io/restarted-for}`)
		require.NoError(t, err)
		return out, out != ""
	}
	waitState := func(not string) string {
		var got string
		eventually(t, waitTimeout, fmt.Sprintf("a record of Secret %s other than %q", secret, not), func() (bool, string) {
			got, _ = state(secret)
			return got != "" && got != not, fmt.Sprintf("record %q", got)
		})
		return got
	}
	adopted := waitState("")
	modified := c.Metric(t, "config_watcher_secret_events_total", "type", "MODIFIED")
	patchSecretData(t, ns, release, map[string][]byte{"release": randomBytes(bigSecretSize)})
	patchSecretData(t, ns, secret, map[string][]byte{"tls.crt": randomBytes(4000), "tls.key": randomBytes(1700)})
	waitDeleted(t, ns, adminUser, original)
	// One watch delivers the namespace's Secrets in order, one worker acts on them:
	// whatever the release's change made the controller do is done by now.
	waitState(adopted)
	assert.Equal(t, modified+1, c.Metric(t, "config_watcher_secret_events_total", "type", "MODIFIED"),
		"MODIFIED Secret events: the annotated Secret's only, not the Helm release's")
	got, recorded := state(release)
	assert.False(t, recorded, "a record for the Helm release Secret: %q", got)
	for line := range strings.SplitSeq(c.Log(t), "\n") {
		assert.NotContains(t, line, release, "the Helm release Secret in the log")
	}

	// A forced relist: the next Secret watch is answered 410 Gone.
	relists := c.Metric(t, "config_watcher_secret_relists_total")
	fp.SetRules(t, `[{"name":"gone","watch":"true","path":"/secrets","status":410,"times":1}]`)
	fp.Drop(t)
	c.WaitMetric(t, relists+1, "config_watcher_secret_relists_total")
	c.WaitReady(t)
	c.Settle(t, ns)
	assert.Equal(t, 1, fp.Fired(t)["gone"])
	t.Logf("after the relist: %s", cg.report(c))
	assert.Zero(t, cg.oomKills(t), "OOM kills at the relist")
	assertDeletedOnce(t, ns, adminUser, original)
}

// TestMemoryBoundedWithForgedObjects ensures what anyone who may write
// ConfigMaps can forge costs the controller no memory it cannot afford: run
// inside a memory cgroup set to the manifests' limit, with Secrets watched, in
// a namespace holding 40 ConfigMaps shaped as the state of a Secret that does
// not exist, each with a 255 KiB intent of short ids, and 20 annotated
// ConfigMaps with 255 KiB of intent or of selector, it becomes ready, is never
// OOM-killed, and acts on a data change of the webapp's ConfigMap.
func TestMemoryBoundedWithForgedObjects(t *testing.T) {
	requireCluster(t)
	limit := manifestMemoryLimit(t)
	ns := newNamespace(t)
	apply(t, ns, webappManifests("app=webapp"))
	long := func(i int) string {
		var b strings.Builder
		b.WriteString("sha256:" + strings.Repeat("ab", 32) + "/")
		for n := 0; b.Len() < 255<<10; n++ {
			fmt.Fprintf(&b, "%d-%d,", i, n)
		}
		return b.String()
	}
	create := func(name string, annotations map[string]string) {
		b, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "annotations": annotations}, "data": map[string]string{"k": "v"}})
		require.NoError(t, err)
		_, err = runKubectl(string(b), "create", "-n", ns, "-f", "-")
		require.NoError(t, err, "create ConfigMap %s", name)
	}
	for i := range 40 {
		secret := fmt.Sprintf("forged-%d", i)
		create("config-watcher-secret."+secret, map[string]string{
			"config-watcher.k8spatterns.io/state-of-secret": secret,
			"config-watcher.k8spatterns.io/digest-key-id":   "00000000",
			"config-watcher.k8spatterns.io/restarting":      long(i),
		})
	}
	for i := range 20 {
		annotations := map[string]string{selectorAnnotation: "app=forged", "config-watcher.k8spatterns.io/restarting": long(i)}
		if i%2 == 1 {
			annotations = map[string]string{selectorAnnotation: "app in (" + strings.Repeat("x,", 255<<9) + "forged)"}
		}
		create(fmt.Sprintf("forged-%d", i), annotations)
	}
	original := waitPods(t, ns, "app=webapp", 2)

	keyFile := writeDigestKey(t)
	cg := newMemCgroup(t, limit)
	c := startController(t, controllerOpts{namespace: ns, wrap: cg.wrap(),
		extraEnv: []string{"WATCH_SECRETS=true", "DIGEST_KEY_FILE=" + keyFile}})
	c.WaitReady(t)
	adopted := waitRestartedFor(t, ns, "webapp-config", "")
	t.Logf("ready: %s", cg.report(c))
	mergePatch(t, ns, "webapp-config", `{"data":{"message":"Hello, forged objects"}}`)
	waitDeleted(t, ns, adminUser, original)
	waitRestartedFor(t, ns, "webapp-config", adopted)
	t.Logf("after the change: %s", cg.report(c))
	assert.Zero(t, cg.oomKills(t), "OOM kills")
	assertDeletedOnce(t, ns, adminUser, original)
}

// postSecret creates a Secret of type typ in ns, annotated with selector unless
// it is empty, through the shared proxy: one request, with no last-applied copy of
// its data, and quicker than kubectl for a megabyte of it.
func postSecret(t *testing.T, ns, name, typ, selector string, data map[string][]byte) {
	t.Helper()
	meta := map[string]any{"name": name}
	if selector != "" {
		meta["annotations"] = map[string]string{selectorAnnotation: selector}
	}
	proxyJSON(t, http.MethodPost, "/api/v1/namespaces/"+ns+"/secrets", "application/json",
		map[string]any{"apiVersion": "v1", "kind": "Secret", "type": typ, "metadata": meta, "data": data}, http.StatusCreated)
}

// patchSecretData sets the given keys of the data of Secret name in ns (a merge patch).
func patchSecretData(t *testing.T, ns, name string, data map[string][]byte) {
	t.Helper()
	proxyJSON(t, http.MethodPatch, "/api/v1/namespaces/"+ns+"/secrets/"+name, "application/merge-patch+json",
		map[string]any{"data": data}, http.StatusOK)
}

// proxyJSON sends body as JSON through the shared proxy and requires status want.
func proxyJSON(t *testing.T, method, path, contentType string, body any, want int) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(method, env.proxyURL+path, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "%s %s", method, path)
	defer resp.Body.Close()
	if resp.StatusCode != want {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1000))
		t.Fatalf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, want, msg)
	}
}

// randomBytes returns n bytes that no two calls share: Secret data as a key or a
// certificate would be.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
}

// manifestMemoryLimit reads the config-watcher container's memory limit from
// manifests/base/deployment.yaml, so the test follows the manifests.
func manifestMemoryLimit(t *testing.T) int64 {
	t.Helper()
	out := kubectl(t, "create", "--dry-run=client", "-f", filepath.Join(repoRoot, "manifests", "base", "deployment.yaml"),
		"-o", `jsonpath={.spec.template.spec.containers[?(@.name=="config-watcher")].resources.limits.memory}`)
	q := strings.TrimSpace(out)
	units := map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
	for suffix, mult := range units {
		if n, ok := strings.CutSuffix(q, suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			require.NoError(t, err, "memory limit %q", q)
			return v * mult
		}
	}
	v, err := strconv.ParseInt(q, 10, 64)
	require.NoError(t, err, "memory limit %q in the manifests", q)
	return v
}

// createBigConfigMaps creates n ConfigMaps of size bytes of data in ns, none
// annotated, one request each (kubectl create: no last-applied copy).
func createBigConfigMaps(t *testing.T, ns string, n, size int) {
	t.Helper()
	const line = "line of a large generated configuration file\n"
	value := strings.Repeat(line, size/len(line)+1)[:size]
	for i := range n {
		cm := map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": fmt.Sprintf("big-%03d", i)},
			"data":     map[string]string{"config.txt": value},
		}
		b, err := json.Marshal(cm)
		require.NoError(t, err)
		_, err = runKubectl(string(b), "create", "-n", ns, "-f", "-")
		require.NoError(t, err, "create big ConfigMap %d", i)
	}
}

// memCgroup is a memory cgroup this test created; it is removed when the test
// ends, after the controller has stopped.
type memCgroup struct {
	dir string
	v2  bool
}

// newMemCgroup creates a memory cgroup limited to limit bytes, without swap:
// on the v1 memory controller when it is mounted (these machines), else on the
// unified hierarchy. It skips the test when neither can be written.
func newMemCgroup(t *testing.T, limit int64) *memCgroup {
	t.Helper()
	name := "config-watcher-e2e-mem-" + randomSuffix()
	var cg *memCgroup
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		parent := filepath.Join("/sys/fs/cgroup/memory", ownCgroup(t, "memory"))
		if _, err := os.Stat(parent); err != nil {
			parent = "/sys/fs/cgroup/memory"
		}
		cg = &memCgroup{dir: filepath.Join(parent, name)}
	} else if ctl, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); err == nil && strings.Contains(string(ctl), "memory") {
		// A leaf under the root: a v2 cgroup with processes of its own (ours)
		// cannot hand the memory controller to a child.
		cg = &memCgroup{dir: filepath.Join("/sys/fs/cgroup", name), v2: true}
	} else {
		t.Skip("no writable memory cgroup: neither the v1 memory controller nor memory on the unified hierarchy")
	}
	if err := os.Mkdir(cg.dir, 0o755); err != nil {
		t.Skipf("cannot create a memory cgroup (needs root): %v", err)
	}
	t.Cleanup(func() { cg.remove(t) })
	if cg.v2 {
		cg.write(t, "memory.max", strconv.FormatInt(limit, 10))
		cg.writeIfPresent(t, "memory.swap.max", "0")
	} else {
		cg.write(t, "memory.limit_in_bytes", strconv.FormatInt(limit, 10))
		cg.writeIfPresent(t, "memory.memsw.limit_in_bytes", strconv.FormatInt(limit, 10))
	}
	t.Logf("memory cgroup %s limited to %d MiB", cg.dir, limit>>20)
	return cg
}

// ownCgroup returns this process's cgroup path for a v1 controller.
func ownCgroup(t *testing.T, controller string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && strings.Contains(","+parts[1]+",", ","+controller+",") {
			return parts[2]
		}
	}
	return "/"
}

func (cg *memCgroup) write(t *testing.T, file, value string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(cg.dir, file), []byte(value), 0o644), "write %s", file)
}

func (cg *memCgroup) writeIfPresent(t *testing.T, file, value string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(cg.dir, file)); err == nil {
		cg.write(t, file, value)
	}
}

// wrap is the command that moves the controller into the cgroup before it
// runs: the shell joins the cgroup and execs the controller, whose path
// startController appends.
func (cg *memCgroup) wrap() []string {
	return []string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$1"`, filepath.Join(cg.dir, "cgroup.procs")}
}

// stat reads one counter of a flat keyed file such as memory.events.
func (cg *memCgroup) stat(t *testing.T, file, key string) int64 {
	t.Helper()
	f, err := os.Open(filepath.Join(cg.dir, file))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			require.NoError(t, err, "%s %s", file, key)
			return n
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("%s has no %s counter (kernel too old to count OOM kills?)", file, key)
	return 0
}

// oomKills is the cgroup's OOM-kill counter.
func (cg *memCgroup) oomKills(t *testing.T) int64 {
	t.Helper()
	if cg.v2 {
		return cg.stat(t, "memory.events", "oom_kill")
	}
	return cg.stat(t, "memory.oom_control", "oom_kill")
}

// report describes the cgroup's and the process's peak memory, for the log.
func (cg *memCgroup) report(c *controllerProc) string {
	file := "memory.max_usage_in_bytes"
	if cg.v2 {
		file = "memory.peak"
	}
	peak := "?"
	if b, err := os.ReadFile(filepath.Join(cg.dir, file)); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			peak = fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
		}
	}
	hwm, rss := "?", "?"
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid)); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				hwm = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				rss = strings.TrimSpace(v)
			}
		}
	}
	return fmt.Sprintf("cgroup peak %s, VmHWM %s, VmRSS %s", peak, hwm, rss)
}

// remove deletes the cgroup once its processes have gone (the controller is
// stopped by then; a straggler is killed).
func (cg *memCgroup) remove(t *testing.T) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := os.Remove(cg.dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("remove cgroup %s: %v", cg.dir, err)
			return
		}
		if b, rerr := os.ReadFile(filepath.Join(cg.dir, "cgroup.procs")); rerr == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, perr := strconv.Atoi(f); perr == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL) // only processes this test put there
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}
