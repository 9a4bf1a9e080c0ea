//go:build e2e && e2enode

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of this file install what a user installs, as the README says: a release's
// install.yaml, unmodified (its images imported from the release, as a node would pull
// them; pods placed by kube-scheduler), and manifests/demo, on a real kubelet with
// containerd and runc, inside the network namespace hack/node.sh creates: `make e2e-node`.
// They observe what the manifests only configure: readiness, the token's place, the
// probes, the sidecar's shutdown order, read-only root filesystems and the UID, and the
// book's demo served over HTTP.

const (
	nodeNS        = "default" // where install.yaml installs, and the demo goes beside it
	nodeSA        = "system:serviceaccount:" + nodeNS + ":config-watcher"
	controllerSel = "app.kubernetes.io/name=config-watcher"
	webappSel     = "app=webapp"
	tokenDir      = "/var/run/secrets/kubernetes.io/serviceaccount"
	nodeTimeout   = 3 * time.Minute
)

type containerStatus struct {
	Name         string `json:"name"`
	ContainerID  string `json:"containerID"`
	Ready        bool   `json:"ready"`
	RestartCount int    `json:"restartCount"`
	State        struct {
		Running *struct {
			StartedAt string `json:"startedAt"`
		} `json:"running"`
		Terminated *struct {
			ExitCode   int    `json:"exitCode"`
			Reason     string `json:"reason"`
			FinishedAt string `json:"finishedAt"`
		} `json:"terminated"`
	} `json:"state"`
}

type nodePod struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		NodeName   string `json:"nodeName"`
		Containers []struct {
			Name  string `json:"name"`
			Image string `json:"image"`
		} `json:"containers"`
	} `json:"spec"`
	Status struct {
		PodIP string `json:"podIP"`
		podConditions
		InitContainerStatuses []containerStatus `json:"initContainerStatuses"`
		ContainerStatuses     []containerStatus `json:"containerStatuses"`
	} `json:"status"`
}

func (p nodePod) ready() bool { return p.Status.ready() }

// container returns the status of the (init or app) container called name.
func (p nodePod) container(name string) (containerStatus, bool) {
	for _, c := range append(append([]containerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if c.Name == name {
			return c, true
		}
	}
	return containerStatus{}, false
}

// nodePods lists the live (not terminating) pods of the node namespace matching selector.
func nodePods(t *testing.T, selector string) []nodePod {
	t.Helper()
	return nodePodsIn(t, nodeNS, selector)
}

// nodePodsIn lists the live (not terminating) pods of ns matching selector.
func nodePodsIn(t *testing.T, ns, selector string) []nodePod {
	t.Helper()
	var l struct {
		Items []nodePod `json:"items"`
	}
	getJSON(t, ns, &l, "pods", "-l", selector)
	var live []nodePod
	for _, p := range l.Items {
		if p.Metadata.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

// waitReadyPods waits until exactly n live pods of the node namespace match selector
// and all are Ready.
func waitReadyPods(t *testing.T, selector string, n int) []nodePod {
	t.Helper()
	return waitReadyPodsIn(t, nodeNS, selector, n)
}

// waitReadyPodsIn waits until exactly n live pods of ns match selector and all are Ready.
func waitReadyPodsIn(t *testing.T, ns, selector string, n int) []nodePod {
	t.Helper()
	var pods []nodePod
	eventually(t, nodeTimeout, fmt.Sprintf("%d Ready pods matching %s in %s", n, selector, ns), func() (bool, string) {
		pods = nodePodsIn(t, ns, selector)
		var state []string
		ready := 0
		for _, p := range pods {
			if p.ready() {
				ready++
			}
			state = append(state, fmt.Sprintf("%s ready=%v", p.Metadata.Name, p.ready()))
		}
		return len(pods) == n && ready == n, strings.Join(state, ", ")
	})
	return pods
}

var (
	nodeOnce sync.Once
	nodeErr  error
)

// requireNode skips without a node (hack/node.sh sets CW_NODE_NAME, CW_CTR and
// CW_RELEASE_DIST), then, once for all tests, applies the release's install.yaml and the
// demo as the README says, and waits until every pod is Ready.
func requireNode(t *testing.T) {
	t.Helper()
	requireCluster(t)
	if os.Getenv("CW_NODE_NAME") == "" || os.Getenv("CW_CTR") == "" || os.Getenv("CW_RELEASE_DIST") == "" {
		t.Skip("no node: CW_NODE_NAME, CW_CTR or CW_RELEASE_DIST is unset; run make e2e-node (hack/node.sh run …)")
	}
	nodeOnce.Do(func() {
		if _, nodeErr = runKubectl("", "apply", "-f", filepath.Join(os.Getenv("CW_RELEASE_DIST"), "install.yaml")); nodeErr != nil {
			return
		}
		_, nodeErr = runKubectl("", "apply", "-n", nodeNS, "-k", filepath.Join(repoRoot, "manifests", "demo"))
	})
	require.NoError(t, nodeErr, "kubectl apply -f $CW_RELEASE_DIST/install.yaml; kubectl apply -n default -k manifests/demo")
	waitReadyPods(t, controllerSel, 2)
	waitReadyPods(t, webappSel, 2)
}

// ctr runs containerd's ctr in the node's namespace (k8s.io, where the kubelet's
// containers live) and returns its output.
func ctr(t *testing.T, args ...string) string {
	t.Helper()
	base := strings.Fields(os.Getenv("CW_CTR"))
	out, err := exec.Command(base[0], append(base[1:], args...)...).CombinedOutput()
	require.NoError(t, err, "ctr %v: %s", args, out)
	return string(out)
}

// taskPID returns the host PID of a running container ("containerd://ID").
func taskPID(t *testing.T, containerID string) int {
	t.Helper()
	id := strings.TrimPrefix(containerID, "containerd://")
	for _, line := range strings.Split(ctr(t, "tasks", "ls"), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id && f[2] == "RUNNING" {
			pid, err := strconv.Atoi(f[1])
			require.NoError(t, err)
			return pid
		}
	}
	t.Fatalf("no running task %s", id)
	return 0
}

// procField returns the values of a "Key:\tv1\tv2…" line of /proc/PID/status.
func procField(t *testing.T, pid int, key string) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.Fields(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return nil
}

// rootMountOptions returns the mount options of / as the container sees it.
func rootMountOptions(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	require.NoError(t, err)
	var opts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == "/" {
			opts = strings.Split(f[5], ",") // the last mount on / is the one in effect
		}
	}
	require.NotEmpty(t, opts, "no / in /proc/%d/mountinfo", pid)
	return opts
}

// TestNodeManifestsBecomeReady ensures the release's install.yaml runs as written on a
// kubelet: both controller replicas and both webapp replicas Ready, scheduled onto the
// node, the controller's image the one install.yaml names by digest, the ambassador
// started as a native sidecar and nothing restarted.
func TestNodeManifestsBecomeReady(t *testing.T) {
	requireNode(t)
	version := strings.TrimSpace(kubectl(t, "get", "deployment", "config-watcher", "-n", nodeNS,
		"-o", "jsonpath={.metadata.labels.app\\.kubernetes\\.io/version}"))
	require.NotEmpty(t, version, "install.yaml's Deployment has no app.kubernetes.io/version")
	install, err := os.ReadFile(filepath.Join(os.Getenv("CW_RELEASE_DIST"), "install.yaml"))
	require.NoError(t, err)
	for _, p := range waitReadyPods(t, controllerSel, 2) {
		assert.Equal(t, os.Getenv("CW_NODE_NAME"), p.Spec.NodeName, "pod %s not scheduled onto the node", p.Metadata.Name)
		for _, c := range p.Spec.Containers {
			if c.Name == "config-watcher" {
				assert.Contains(t, c.Image, "@sha256:", "image of %s", p.Metadata.Name)
				assert.Contains(t, string(install), "image: "+c.Image+"\n", "image of %s", p.Metadata.Name)
			}
		}
		amb, ok := p.container("ambassador")
		require.True(t, ok, "pod %s has no ambassador status", p.Metadata.Name)
		assert.NotNil(t, amb.State.Running, "ambassador of %s not running", p.Metadata.Name)
		ctl, ok := p.container("config-watcher")
		require.True(t, ok)
		assert.True(t, ctl.Ready, "controller of %s not ready", p.Metadata.Name)
		assert.Zero(t, amb.RestartCount+ctl.RestartCount, "restarts in %s", p.Metadata.Name)
		// kubectl logs goes through the kubelet: the image's binary says the release's version.
		logs := kubectl(t, "logs", "-n", nodeNS, p.Metadata.Name, "-c", "config-watcher")
		assert.Contains(t, logs, `"version":"`+version+`"`, "logs of %s", p.Metadata.Name)
	}
	for _, p := range waitReadyPods(t, webappSel, 2) {
		assert.Equal(t, os.Getenv("CW_NODE_NAME"), p.Spec.NodeName, "pod %s not scheduled onto the node", p.Metadata.Name)
	}
}

// TestNodeTokenOnlyInTheAmbassador ensures the ServiceAccount token is mounted in the
// ambassador, valid for the controller's ServiceAccount, and absent from the controller
// container, as seen through each container's own root.
func TestNodeTokenOnlyInTheAmbassador(t *testing.T) {
	requireNode(t)
	for _, p := range waitReadyPods(t, controllerSel, 2) {
		amb, _ := p.container("ambassador")
		ctl, _ := p.container("config-watcher")

		token, err := os.ReadFile(fmt.Sprintf("/proc/%d/root%s/token", taskPID(t, amb.ContainerID), tokenDir))
		require.NoError(t, err, "ambassador of %s: token", p.Metadata.Name)
		review := kubectlStdin(t, fmt.Sprintf(`{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":%q}}`, strings.TrimSpace(string(token))),
			"create", "-f", "-", "-o", "jsonpath={.status.authenticated} {.status.user.username}")
		assert.Equal(t, "true "+nodeSA, review, "the ambassador's token of %s", p.Metadata.Name)

		ctlPID := taskPID(t, ctl.ContainerID)
		_, err = os.Stat(fmt.Sprintf("/proc/%d/root%s", ctlPID, tokenDir))
		assert.True(t, os.IsNotExist(err), "controller of %s: %s exists (err %v)", p.Metadata.Name, tokenDir, err)
		mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", ctlPID))
		require.NoError(t, err)
		assert.False(t, strings.Contains(string(mounts), "serviceaccount"), "controller of %s mounts a service account volume", p.Metadata.Name)
	}
}

func kubectlStdin(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	out, err := runKubectl(stdin, args...)
	require.NoError(t, err)
	return strings.TrimSpace(out)
}

// TestNodeContainersRunReadOnlyAsNonRoot ensures both containers of every controller
// pod run as 65532:65532 on a read-only root filesystem, as the kernel reports it, and
// that the ambassador works that way (it has never restarted).
func TestNodeContainersRunReadOnlyAsNonRoot(t *testing.T) {
	requireNode(t)
	for _, p := range waitReadyPods(t, controllerSel, 2) {
		for _, name := range []string{"ambassador", "config-watcher"} {
			c, ok := p.container(name)
			require.True(t, ok)
			pid := taskPID(t, c.ContainerID)
			assert.Equal(t, []string{"65532", "65532", "65532", "65532"}, procField(t, pid, "Uid"), "%s/%s", p.Metadata.Name, name)
			assert.Equal(t, []string{"65532", "65532", "65532", "65532"}, procField(t, pid, "Gid"), "%s/%s", p.Metadata.Name, name)
			assert.Contains(t, rootMountOptions(t, pid), "ro", "%s/%s: root filesystem", p.Metadata.Name, name)
			assert.Equal(t, []string{"0000000000000000"}, procField(t, pid, "CapEff"), "%s/%s: capabilities", p.Metadata.Name, name)
		}
	}
}

// TestNodeReadinessFollowsTheAmbassador ensures the kubelet's readiness probe of the
// controller (/readyz: a watch is open through the ambassador) turns false while the
// ambassador is down and true again once the kubelet has restarted it, without the
// controller container being restarted.
func TestNodeReadinessFollowsTheAmbassador(t *testing.T) {
	requireNode(t)
	p := waitReadyPods(t, controllerSel, 2)[0]
	ctlBefore, _ := p.container("config-watcher")
	ambBefore, _ := p.container("ambassador")

	// The kubelet restarts the sidecar at once the first time: keep killing it until
	// the probe has failed often enough to mark the controller not ready.
	eventually(t, nodeTimeout, "the controller of "+p.Metadata.Name+" not ready while its ambassador is killed", func() (bool, string) {
		var cur nodePod
		getJSON(t, nodeNS, &cur, "pod", p.Metadata.Name)
		ctl, _ := cur.container("config-watcher")
		if !ctl.Ready {
			return true, ""
		}
		amb, _ := cur.container("ambassador")
		if amb.State.Running != nil && amb.ContainerID != "" {
			// It may exit between the read and the kill: then there is nothing to kill.
			base := strings.Fields(os.Getenv("CW_CTR"))
			_, _ = exec.Command(base[0], append(base[1:], "tasks", "kill", "--signal", "SIGKILL",
				strings.TrimPrefix(amb.ContainerID, "containerd://"))...).CombinedOutput()
		}
		return false, fmt.Sprintf("controller ready=%v, ambassador restarts=%d", ctl.Ready, amb.RestartCount)
	})
	var after nodePod
	eventually(t, nodeTimeout, "the controller of "+p.Metadata.Name+" ready again", func() (bool, string) {
		getJSON(t, nodeNS, &after, "pod", p.Metadata.Name)
		ctl, _ := after.container("config-watcher")
		return ctl.Ready, fmt.Sprintf("controller ready=%v", ctl.Ready)
	})
	ctlAfter, _ := after.container("config-watcher")
	ambAfter, _ := after.container("ambassador")
	t.Logf("ambassador restarted %d times by the kubelet; controller restarts %d -> %d",
		ambAfter.RestartCount-ambBefore.RestartCount, ctlBefore.RestartCount, ctlAfter.RestartCount)
	assert.Equal(t, p.Metadata.UID, after.Metadata.UID, "the pod was replaced")
	assert.Equal(t, ctlBefore.ContainerID, ctlAfter.ContainerID, "the controller container was restarted")
	assert.Equal(t, ctlBefore.RestartCount, ctlAfter.RestartCount, "the controller container was restarted")
	assert.Greater(t, ambAfter.RestartCount, ambBefore.RestartCount, "the ambassador was not restarted by the kubelet")
}

var nodeHTTP = &http.Client{Timeout: 5 * time.Second}

// httpGet fetches url from inside the node's network namespace.
func httpGet(url string) (string, error) { return httpGetWith(nodeHTTP, url) }

// httpGetWith fetches url with client and returns the body of a 200 answer.
func httpGetWith(client *http.Client, url string) (string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return strings.TrimSpace(string(b)), nil
}

// serve returns what each webapp pod answers over HTTP, by pod name.
func serve(t *testing.T, pods []nodePod) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, p := range pods {
		require.NotEmpty(t, p.Status.PodIP, "pod %s has no IP", p.Metadata.Name)
		body, err := httpGet("http://" + p.Status.PodIP + ":8080/")
		require.NoError(t, err, "pod %s", p.Metadata.Name)
		got[p.Metadata.Name] = body
	}
	return got
}

// waitReplaced waits until as many live pods of ns match selector as old holds, all
// Ready and none of them one of old, and returns them.
func waitReplaced(t *testing.T, ns, selector string, old []nodePod) []nodePod {
	t.Helper()
	var fresh []nodePod
	eventually(t, nodeTimeout, fmt.Sprintf("%d Ready pods matching %s in %s, none of them an old one", len(old), selector, ns), func() (bool, string) {
		fresh = nodePodsIn(t, ns, selector)
		var state []string
		ok := len(fresh) == len(old)
		for _, p := range fresh {
			for _, o := range old {
				ok = ok && p.Metadata.UID != o.Metadata.UID
			}
			ok = ok && p.ready()
			state = append(state, fmt.Sprintf("%s ready=%v", p.Metadata.Name, p.ready()))
		}
		return ok, strings.Join(state, ", ")
	})
	return fresh
}

// TestNodeDemoServesTheNewMessage is the book's demo, for real: the webapp serves the
// ConfigMap's message; after a patch the controller deletes each old pod once and the
// new pods serve the new message.
func TestNodeDemoServesTheNewMessage(t *testing.T) {
	requireNode(t)
	demoServesTheNewMessage(t, nodeNS, nodeSA)
}

// demoServesTheNewMessage patches the message of the demo in ns, once the controller
// acting as user has adopted its ConfigMap (a change it saw first would be adopted as it
// is), and checks that it deleted each old webapp pod once and that the new pods serve
// the new message.
func demoServesTheNewMessage(t *testing.T, ns, user string) {
	t.Helper()
	waitRestartedFor(t, ns, "webapp-config", "")
	old := waitReadyPodsIn(t, ns, webappSel, 2)
	before := getConfigMap(t, ns, "webapp-config")
	for name, body := range serve(t, old) {
		assert.Equal(t, before.Data["message"], body, "pod %s before the change", name)
	}

	message := "message B " + randomSuffix()
	mergePatch(t, ns, "webapp-config", fmt.Sprintf(`{"data":{"message":%q}}`, message))

	fresh := waitReplaced(t, ns, webappSel, old)
	for name, body := range serve(t, fresh) {
		assert.Equal(t, message, body, "pod %s after the change", name)
	}
	n := deletesByPod(podDeletes(t, ns, user))
	for _, o := range old {
		assert.Equal(t, 1, n[o.Metadata.Name], "deletions of %s by %s", o.Metadata.Name, user)
	}
}

// TestNodeRolloutAndFailoverLoseNoChange ensures that a rolling update of the
// controller's Deployment and the loss of the leader's pod, each with data changes in
// flight, lose no change and act on none twice: every webapp pod ends up created after
// the last change, and the audit log shows each deleted pod deleted once, for a change
// made after it was created.
func TestNodeRolloutAndFailoverLoseNoChange(t *testing.T) {
	requireNode(t)
	h := trackChanges(t, nodeNS, webappSel)

	h.set(t, "rollout 1 "+randomSuffix())
	kubectl(t, "rollout", "restart", "deployment/config-watcher", "-n", nodeNS)
	h.set(t, "rollout 2 "+randomSuffix())
	kubectl(t, "rollout", "status", "deployment/config-watcher", "-n", nodeNS, "--timeout=3m")
	h.set(t, "rollout 3 "+randomSuffix())

	// A leader that shuts down releases the Lease (empty holder): wait for a new one
	// among the pods of the rollout.
	var leader string
	eventually(t, nodeTimeout, "a leader among the controller's pods", func() (bool, string) {
		leader = strings.TrimSpace(kubectl(t, "get", "lease", "config-watcher", "-n", nodeNS, "-o", "jsonpath={.spec.holderIdentity}"))
		for _, p := range nodePods(t, controllerSel) {
			if p.Metadata.Name == leader {
				return true, ""
			}
		}
		return false, fmt.Sprintf("holder %q", leader)
	})
	kubectl(t, "delete", "pod", leader, "-n", nodeNS, "--wait=false")
	h.set(t, "failover "+randomSuffix())
	waitReadyPods(t, controllerSel, 2)

	last := h.list[len(h.list)-1]
	eventually(t, nodeTimeout, "every webapp pod created after the last change, and Ready", func() (bool, string) {
		created := h.created(t)
		pods := nodePods(t, webappSel)
		var state []string
		ok := len(pods) == 2
		for _, p := range pods {
			rv, seen := created[p.Metadata.Name]
			ok = ok && seen && rv > last.rv && p.ready()
			state = append(state, fmt.Sprintf("%s rv=%d ready=%v", p.Metadata.Name, rv, p.ready()))
		}
		return ok, strings.Join(state, ", ")
	})
	created := h.created(t)
	events := podDeletes(t, nodeNS, nodeSA)
	for name, k := range deletesByPod(events) {
		assert.Equal(t, 1, k, "pod %s deleted %d times", name, k)
	}
	inTest := 0
	for _, e := range events {
		if !e.OK() || !h.list[0].at.Before(e.Received) {
			continue
		}
		inTest++
		received := e.Received
		i := len(h.list) - 1
		for i > 0 && h.list[i].at.After(received) {
			i--
		}
		rv, ok := created[e.ObjectRef.Name]
		assert.True(t, ok && rv < h.list[i].rv, "pod %s (created at revision %d) deleted at %s, after change %d (revision %d)",
			e.ObjectRef.Name, rv, received.Format(time.StampMicro), i, h.list[i].rv)
	}
	t.Logf("%d changes during a rollout and a failover (leader %s deleted): %d pod deletions, none twice", len(h.list), leader, inTest)
	for name, body := range serve(t, nodePods(t, webappSel)) {
		assert.Equal(t, getConfigMap(t, nodeNS, "webapp-config").Data["message"], body, "pod %s", name)
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	return ts
}

// TestNodeShutdownOrder ensures that when a controller pod is deleted the controller
// exits 0 before the ambassador stops: the order of containerd's task exit events, and
// the exit codes and times the kubelet reports to the API.
func TestNodeShutdownOrder(t *testing.T) {
	requireNode(t)
	p := waitReadyPods(t, controllerSel, 2)[0]
	amb, _ := p.container("ambassador")
	ctl, _ := p.container("config-watcher")
	ambID := strings.TrimPrefix(amb.ContainerID, "containerd://")
	ctlID := strings.TrimPrefix(ctl.ContainerID, "containerd://")

	dir := t.TempDir()
	eventsLog := filepath.Join(dir, "events")
	podLog := filepath.Join(dir, "pod.json")
	base := strings.Fields(os.Getenv("CW_CTR"))
	startCapture(t, eventsLog, exec.Command(base[0], append(base[1:], "events")...))
	startCapture(t, podLog, exec.Command(env.kubectl, "--kubeconfig="+env.kubeconfig, "get", "pod", p.Metadata.Name,
		"-n", nodeNS, "--watch", "-o", "json"))
	// Both streams are open once they show something: the watch its first state, the
	// event stream an image tag made for the purpose. A tag made before `ctr events`
	// subscribed is never shown, so a new one is made every second until one is.
	var probes []string
	t.Cleanup(func() {
		for _, probe := range probes {
			ctr(t, "images", "rm", probe)
		}
	})
	var tagged time.Time
	eventually(t, waitTimeout, "ctr events and the pod watch streaming", func() (bool, string) {
		ev, _ := os.ReadFile(eventsLog)
		shown, watching := strings.Contains(string(ev), "/images/create"), lastPodState(t, podLog).Metadata.UID == p.Metadata.UID
		if shown && watching {
			return true, ""
		}
		if time.Since(tagged) > time.Second {
			probe := "cw-e2e.invalid/events-subscribed:" + randomSuffix()
			ctr(t, "images", "tag", "registry.k8s.io/pause:3.10.2", probe)
			probes = append(probes, probe)
			tagged = time.Now()
		}
		return false, fmt.Sprintf("a tag shown by ctr events: %v (%d made); the pod watch streaming: %v", shown, len(probes), watching)
	})

	kubectl(t, "delete", "pod", p.Metadata.Name, "-n", nodeNS, "--wait=true", "--timeout=60s")

	var exits []string // container IDs in the order containerd reported their exit
	status := map[string]int{}
	var at map[string]time.Time
	eventually(t, waitTimeout, "task exit events of both containers", func() (bool, string) {
		exits, status, at = taskExits(t, eventsLog, ctlID, ambID)
		return len(exits) == 2, fmt.Sprintf("exits so far: %v", exits)
	})
	t.Logf("containerd: controller exited (status %d) at %s, ambassador (status %d) %s later",
		status[ctlID], at[ctlID].Format(time.StampMicro), status[ambID], at[ambID].Sub(at[ctlID]))
	assert.Equal(t, []string{ctlID, ambID}, exits, "exit order (controller %s, ambassador %s)", ctlID, ambID)
	assert.Zero(t, status[ctlID], "the controller's exit status")

	last := lastPodState(t, podLog)
	ctlEnd, _ := last.container("config-watcher")
	ambEnd, _ := last.container("ambassador")
	require.NotNil(t, ctlEnd.State.Terminated, "the API never showed the controller terminated")
	assert.Zero(t, ctlEnd.State.Terminated.ExitCode, "the controller's exit code in the API")
	if ambEnd.State.Terminated != nil {
		assert.LessOrEqual(t, mustTime(t, ctlEnd.State.Terminated.FinishedAt), mustTime(t, ambEnd.State.Terminated.FinishedAt))
	}
}

// startCapture runs cmd with its output in path until the test ends.
func startCapture(t *testing.T, path string, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	out, err := os.Create(path)
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); out.Close() })
	return cmd
}

// taskExits reads `ctr events` output for /tasks/exit of the given containers: their
// IDs in the order of the events, and each one's exit status and event time.
func taskExits(t *testing.T, path string, ids ...string) ([]string, map[string]int, map[string]time.Time) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var order []string
	status := map[string]int{}
	at := map[string]time.Time{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, "/tasks/exit ")
		if i < 0 {
			continue
		}
		var ev struct {
			ContainerID string `json:"container_id"`
			ID          string `json:"id"`
			ExitStatus  int    `json:"exit_status"`
		}
		if json.Unmarshal([]byte(line[i+len("/tasks/exit "):]), &ev) != nil || ev.ContainerID != ev.ID {
			continue // an exec's exit, or a line still being written
		}
		for _, id := range ids {
			if ev.ContainerID == id {
				order = append(order, id)
				status[id] = ev.ExitStatus
				// The line begins with the event's time, as Go prints a time.Time.
				if f := strings.Fields(line); len(f) >= 4 {
					at[id], _ = time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", strings.Join(f[:4], " "))
				}
			}
		}
	}
	return order, status, at
}

// lastPodState returns the last state of the pod in a `kubectl get --watch -o json` log.
func lastPodState(t *testing.T, path string) nodePod {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var last nodePod
	dec := json.NewDecoder(f)
	for {
		var p nodePod
		if dec.Decode(&p) != nil {
			return last
		}
		last = p
	}
}
