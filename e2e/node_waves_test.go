//go:build e2e && e2enode

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of this file watch a change reach a Service without an outage, on the real
// node: the demo's webapp scaled to 8 pods, their readiness judged by the kubelet's probe
// (an empty message makes the server exit, so such a pod never becomes Ready), a client
// that sends each request to an endpoint the Service's EndpointSlice lists as ready, as
// kube-proxy would, and the Ready pods counted on every change a pod watch reports; and a
// StatefulSet of 3 with a bad change.

const (
	wavesReplicas  = 8
	wavesFloor     = 6 // 8 pods, MAX_UNAVAILABLE's default 25%: two pods at a time
	wavesConfigMap = "webapp-config"
	wavesDeadline  = "20s" // PROGRESS_DEADLINE for the halt; the default 10m outlasts any test
)

// watchEvents runs `kubectl get ARGS --watch --output-watch-events -o json` in the node
// namespace and calls handle with every event, in order, on a goroutine of its own, until
// the test ends.
func watchEvents(t *testing.T, handle func(typ string, object json.RawMessage), args ...string) {
	t.Helper()
	cmd := exec.Command(env.kubectl, append(append([]string{"--kubeconfig=" + env.kubeconfig, "get", "-n", nodeNS}, args...),
		"--watch", "--output-watch-events", "-o", "json")...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() {
		defer close(done)
		dec := json.NewDecoder(stdout)
		for {
			var ev struct {
				Type   string          `json:"type"`
				Object json.RawMessage `json:"object"`
			}
			if dec.Decode(&ev) != nil {
				return // killed at the end of the test
			}
			handle(ev.Type, ev.Object)
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done; _ = cmd.Wait() })
}

// readySampler follows the webapp's pods through a watch and keeps, over every state the
// watch reported, the fewest Ready pods not terminating, and the most old pods deleted
// ahead of the new pods Ready (1 when the pods roll one by one).
type readySampler struct {
	mu      sync.Mutex
	old     map[string]bool
	pods    map[string]nodePod
	primed  bool // every old pod seen: the watch's initial list is in
	events  int
	min     int
	minAt   string
	ahead   int
	aheadAt string
}

func sampleReady(t *testing.T, old []nodePod) *readySampler {
	t.Helper()
	return sampleReadyOf(t, webappSel, old)
}

// sampleReadyOf is sampleReady for the pods selector matches; old pods are told by uid,
// so that a StatefulSet's replacement, under the same name, is a new pod.
func sampleReadyOf(t *testing.T, selector string, old []nodePod) *readySampler {
	t.Helper()
	s := &readySampler{old: map[string]bool{}, pods: map[string]nodePod{}, min: len(old)}
	for _, p := range old {
		s.old[p.Metadata.UID] = true
	}
	watchEvents(t, func(typ string, object json.RawMessage) {
		var p nodePod
		if json.Unmarshal(object, &p) != nil {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if typ == "DELETED" {
			delete(s.pods, p.Metadata.Name)
		} else {
			s.pods[p.Metadata.Name] = p
		}
		s.observe()
	}, "pods", "-l", selector)
	eventually(t, waitTimeout, "the pod watch listing the pods of "+selector, func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.primed, fmt.Sprintf("%d pods seen", len(s.pods))
	})
	return s
}

// observe updates the extremes with the current state (s.mu held). The watch lists the
// pods one event each: until every old pod is in, the others would count as deleted.
func (s *readySampler) observe() {
	present := map[string]bool{} // old pods listed and not terminating, by uid
	listed := 0
	for _, p := range s.pods {
		if s.old[p.Metadata.UID] {
			listed++
			if p.Metadata.DeletionTimestamp == nil {
				present[p.Metadata.UID] = true
			}
		}
	}
	if !s.primed {
		if listed < len(s.old) {
			return
		}
		s.primed = true
	}
	s.events++
	ready, fresh := 0, 0
	deleted := len(s.old) - len(present)
	for _, p := range s.pods {
		if p.Metadata.DeletionTimestamp == nil && p.ready() {
			ready++
			if !s.old[p.Metadata.UID] {
				fresh++
			}
		}
	}
	if ready < s.min {
		s.min, s.minAt = ready, s.state()
	}
	if deleted-fresh > s.ahead {
		s.ahead, s.aheadAt = deleted-fresh, s.state()
	}
}

// state describes every pod (s.mu held).
func (s *readySampler) state() string {
	var out []string
	for name, p := range s.pods {
		age := "new"
		if s.old[p.Metadata.UID] {
			age = "old"
		}
		out = append(out, fmt.Sprintf("%s (%s) ready=%v terminating=%v", name, age, p.ready(), p.Metadata.DeletionTimestamp != nil))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// settled reports whether exactly n pods exist, none old, none terminating, all Ready.
func (s *readySampler) settled(n int) (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := len(s.pods) == n
	for _, p := range s.pods {
		ok = ok && !s.old[p.Metadata.UID] && p.Metadata.DeletionTimestamp == nil && p.ready()
	}
	return ok, s.state()
}

// check asserts the webapp's floor and the wave-by-wave order over everything sampled so
// far.
func (s *readySampler) check(t *testing.T, what string) {
	t.Helper()
	s.checkFloor(t, what, wavesReplicas, wavesFloor)
}

// checkFloor asserts that Ready pods never dropped below floor, and that no more old pods
// than replicas - floor were ever deleted ahead of new Ready ones.
func (s *readySampler) checkFloor(t *testing.T, what string, replicas, floor int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("%s: %d pod states sampled; fewest Ready %d, most old pods deleted ahead of new Ready ones %d", what, s.events, s.min, s.ahead)
	assert.GreaterOrEqual(t, s.min, floor, "%s: Ready pods dropped to %d: %s", what, s.min, s.minAt)
	assert.LessOrEqual(t, s.ahead, replicas-floor, "%s: %d old pods deleted ahead of their replacements: %s", what, s.ahead, s.aheadAt)
}

// sliceClient sends requests to the webapp's Service as kube-proxy routes them: each to
// the next endpoint its EndpointSlices list as ready, from inside the node's network
// namespace. A request that finds no ready endpoint fails, as it would through a Service.
type sliceClient struct {
	mu      sync.Mutex
	slices  map[string][]string // slice name -> its ready endpoints, host:port
	answers map[string]int      // body -> count
	failed  []string
	stop    chan struct{}
	done    chan struct{}
}

type endpointSlice struct {
	Metadata  objectMeta `json:"metadata"`
	Endpoints []struct {
		Addresses  []string `json:"addresses"`
		Conditions struct {
			Ready *bool `json:"ready"`
		} `json:"conditions"`
	} `json:"endpoints"`
	Ports []struct {
		Name string `json:"name"`
		Port int    `json:"port"`
	} `json:"ports"`
}

func startSliceClient(t *testing.T, service string, ready int) *sliceClient {
	t.Helper()
	c := &sliceClient{slices: map[string][]string{}, answers: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	watchEvents(t, func(typ string, object json.RawMessage) {
		var s endpointSlice
		if json.Unmarshal(object, &s) != nil {
			return
		}
		var ready []string
		if typ != "DELETED" && len(s.Ports) == 1 {
			for _, e := range s.Endpoints {
				// Unset means ready (discovery.k8s.io/v1); kube-proxy reads it so.
				if e.Conditions.Ready == nil || *e.Conditions.Ready {
					for _, a := range e.Addresses {
						ready = append(ready, fmt.Sprintf("%s:%d", a, s.Ports[0].Port))
					}
				}
			}
		}
		c.mu.Lock()
		c.slices[s.Metadata.Name] = ready
		c.mu.Unlock()
	}, "endpointslices", "-l", "kubernetes.io/service-name="+service)
	eventually(t, waitTimeout, fmt.Sprintf("the EndpointSlices of Service %s listing %d ready endpoints", service, ready), func() (bool, string) {
		eps := c.endpoints()
		return len(eps) == ready, fmt.Sprint(eps)
	})

	// A new connection each time, as a fresh client through kube-proxy: a kept-alive one
	// would stay on a pod after the slice dropped it.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	go func() {
		defer close(c.done)
		tick := time.NewTicker(20 * time.Millisecond) // the request rate, about 50/s
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-c.stop:
				return
			case <-tick.C:
			}
			eps := c.endpoints()
			if len(eps) == 0 {
				c.record(time.Now(), "", "", fmt.Errorf("no ready endpoint"))
				continue
			}
			ep := eps[i%len(eps)]
			body, err := httpGetWith(client, "http://"+ep+"/")
			c.record(time.Now(), ep, body, err)
		}
	}()
	t.Cleanup(c.halt)
	return c
}

// endpoints returns the ready endpoints of every slice, sorted.
func (c *sliceClient) endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var all []string
	for _, eps := range c.slices {
		all = append(all, eps...)
	}
	sort.Strings(all)
	return all
}

func (c *sliceClient) record(at time.Time, ep, body string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.failed = append(c.failed, fmt.Sprintf("%s %s: %v", at.Format(time.StampMilli), ep, err))
		return
	}
	c.answers[body]++
}

// halt stops the requests; it may be called more than once.
func (c *sliceClient) halt() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

// results stops the requests and returns the answers by body and the failures.
func (c *sliceClient) results() (map[string]int, []string) {
	c.halt()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.answers, c.failed
}

// checkAnswers asserts that no request failed and every answer was one of want.
func checkAnswers(t *testing.T, c *sliceClient, want ...string) {
	t.Helper()
	answers, failed := c.results()
	total := len(failed)
	for _, n := range answers {
		total += n
	}
	t.Logf("%d requests through the EndpointSlice, %d failed; answers %v", total, len(failed), answers)
	require.NotZero(t, total, "no request was sent")
	shown := failed
	if len(shown) > 10 {
		shown = append(shown[:10:10], fmt.Sprintf("… and %d more", len(failed)-10))
	}
	assert.Zero(t, len(failed), "failed requests:\n%s", strings.Join(shown, "\n"))
	for body := range answers {
		assert.Contains(t, want, body, "an answer no pod should have given")
	}
}

// scaleWebapp runs the webapp with n replicas, all Ready, until the test ends, then with
// the manifest's 2 again.
func scaleWebapp(t *testing.T, n int) []nodePod {
	t.Helper()
	kubectl(t, "scale", "deployment/webapp", "-n", nodeNS, fmt.Sprintf("--replicas=%d", n))
	t.Cleanup(func() {
		kubectl(t, "scale", "deployment/webapp", "-n", nodeNS, "--replicas=2")
		waitReadyPods(t, webappSel, 2)
	})
	return waitReadyPods(t, webappSel, n)
}

// setControllerEnv sets an environment variable of the installed controller until the
// test ends, and waits for each rollout of its Deployment.
func setControllerEnv(t *testing.T, name, value string) {
	t.Helper()
	set := func(arg string) {
		kubectl(t, "set", "env", "deployment/config-watcher", "-n", nodeNS, "-c", "config-watcher", arg)
		kubectl(t, "rollout", "status", "deployment/config-watcher", "-n", nodeNS, "--timeout=3m")
	}
	set(name + "=" + value)
	t.Cleanup(func() { set(name + "-") })
}

// oldDeletes counts the controller's successful deletions of each of pods.
func oldDeletes(t *testing.T, pods []nodePod) map[string]int {
	t.Helper()
	all := deletesByPod(podDeletes(t, nodeNS, nodeSA))
	n := map[string]int{}
	for _, p := range pods {
		n[p.Metadata.Name] = all[p.Metadata.Name]
	}
	return n
}

// TestNodeWavesKeepTheServiceUp ensures three good changes in a row each roll an 8-pod
// Deployment two pods at a time: the Ready pods the kubelet reports never drop below 6,
// each old pod is deleted once by the controller, and not one request sent to a ready
// endpoint of the Service's EndpointSlice fails, from before each change until the last
// of its old pods is gone.
func TestNodeWavesKeepTheServiceUp(t *testing.T) {
	requireNode(t)
	old := scaleWebapp(t, wavesReplicas)
	before := getConfigMap(t, nodeNS, wavesConfigMap).Data["message"]
	for i := range 3 {
		sampler := sampleReady(t, old)
		client := startSliceClient(t, "webapp", wavesReplicas)
		message := fmt.Sprintf("waves %d %s", i+1, randomSuffix())
		rollTo(t, message, before, old, sampler, client, fmt.Sprintf("rollout %d of 3", i+1))
		before, old = message, waitReadyPods(t, webappSel, wavesReplicas)
	}
}

// rollTo changes the message, waits until every pod is a new Ready one and the old ones
// are gone, then checks the requests sent meanwhile, the samples since the sampler
// began, each old pod deleted once, and the new message served.
func rollTo(t *testing.T, message, before string, old []nodePod, sampler *readySampler, client *sliceClient, what string) {
	t.Helper()
	mergePatch(t, nodeNS, wavesConfigMap, fmt.Sprintf(`{"data":{"message":%q}}`, message))
	eventually(t, nodeTimeout, fmt.Sprintf("%d Ready webapp pods, none old, none terminating", wavesReplicas), func() (bool, string) {
		return sampler.settled(wavesReplicas)
	})
	checkAnswers(t, client, before, message)
	sampler.check(t, what)
	for name, n := range oldDeletes(t, old) {
		assert.Equal(t, 1, n, "deletions of %s by %s", name, nodeSA)
	}
	for name, body := range serve(t, nodePods(t, webappSel)) {
		assert.Equal(t, message, body, "pod %s after %s", name, what)
	}
}

// TestNodeWavesHaltOnABadChange ensures a change the pods cannot become Ready with (an
// empty message: the server exits) stops after the first wave (2 of 8 pods): a
// RolloutHalted Warning Event on the ConfigMap names the container that fails, the 6
// other pods go on serving the old message and no request fails; the fixed data then
// completes the rollout.
func TestNodeWavesHaltOnABadChange(t *testing.T) {
	requireNode(t)
	setControllerEnv(t, "PROGRESS_DEADLINE", wavesDeadline)
	old := scaleWebapp(t, wavesReplicas)
	before := getConfigMap(t, nodeNS, wavesConfigMap).Data["message"]
	earlier := map[string]bool{}
	for _, e := range haltEvents(t) {
		earlier[e.Metadata.Name] = true
	}
	sampler := sampleReady(t, old)
	client := startSliceClient(t, "webapp", wavesReplicas)

	mergePatch(t, nodeNS, wavesConfigMap, `{"data":{"message":""}}`)
	// Run before the scale-down's wait for Ready pods: a test that failed before the fix
	// leaves pods that cannot become Ready.
	t.Cleanup(func() {
		if getConfigMap(t, nodeNS, wavesConfigMap).Data["message"] == "" {
			mergePatch(t, nodeNS, wavesConfigMap, fmt.Sprintf(`{"data":{"message":%q}}`, before))
		}
	})
	var halt event
	eventually(t, nodeTimeout, "a RolloutHalted Event on ConfigMap "+wavesConfigMap, func() (bool, string) {
		for _, e := range haltEvents(t) {
			if !earlier[e.Metadata.Name] {
				halt = e
				return true, ""
			}
		}
		return false, sampler.stateNow()
	})
	t.Logf("%s %s: %s", halt.Type, halt.Reason, halt.Message)
	assert.Equal(t, "Warning", halt.Type)
	assert.Contains(t, halt.Message, fmt.Sprintf("%d of %d pods", wavesReplicas-wavesFloor, wavesReplicas), "the Event says how far the round got")
	assert.Contains(t, halt.Message, "container app", "the Event names the failing container")

	deleted := oldDeletes(t, old)
	var serving []nodePod
	for _, p := range nodePods(t, webappSel) {
		if deleted[p.Metadata.Name] == 0 && p.ready() {
			serving = append(serving, p)
		}
	}
	assert.Len(t, serving, wavesFloor, "old pods still live and Ready after the halt; deletions %v", deleted)
	for name, body := range serve(t, serving) {
		assert.Equal(t, before, body, "pod %s after the halt", name)
	}
	checkAnswers(t, client, before)
	sampler.check(t, "the bad change")
	sum := 0
	for _, n := range deleted {
		sum += n
	}
	assert.Equal(t, wavesReplicas-wavesFloor, sum, "old pods deleted by the halted round: %v", deleted)

	client = startSliceClient(t, "webapp", wavesFloor)
	rollTo(t, "fixed "+randomSuffix(), before, old, sampler, client, "the bad change and its fix")
}

// stateNow describes every pod now.
func (s *readySampler) stateNow() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state()
}

type event struct {
	Metadata objectMeta `json:"metadata"`
	Type     string     `json:"type"`
	Reason   string     `json:"reason"`
	Message  string     `json:"message"`
}

// haltEvents lists the RolloutHalted Events on the webapp's ConfigMap.
func haltEvents(t *testing.T) []event {
	t.Helper()
	var l struct {
		Items []event `json:"items"`
	}
	getJSON(t, nodeNS, &l, "events", "--field-selector",
		"involvedObject.kind=ConfigMap,involvedObject.name="+wavesConfigMap+",reason=RolloutHalted")
	return l.Items
}

// statefulSet is a StatefulSet of 3 (app=db) serving the message of db-config, with the
// webapp's image and readiness probe, and the ConfigMap annotated to restart its pods.
const statefulSet = `apiVersion: v1
kind: ConfigMap
metadata:
  name: db-config
  annotations:
    k8spatterns.io/podDeleteSelector: "app=db"
data:
  message: "db 1"
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
spec:
  serviceName: db
  replicas: 3
  podManagementPolicy: Parallel
  selector:
    matchLabels:
      app: db
  template:
    metadata:
      labels:
        app: db
    spec:
      automountServiceAccountToken: false
      enableServiceLinks: false
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
      containers:
      - name: app
        image: hashicorp/http-echo:1.0.0
        args: ["-listen=:8080", "-text=$(MESSAGE)"]
        env:
        - name: MESSAGE
          valueFrom:
            configMapKeyRef:
              name: db-config
              key: message
        ports:
        - name: http
          containerPort: 8080
        readinessProbe:
          httpGet:
            path: /
            port: http
          periodSeconds: 2
        resources:
          requests:
            cpu: 5m
            memory: 8Mi
          limits:
            memory: 32Mi
        securityContext:
          readOnlyRootFilesystem: true
          allowPrivilegeEscalation: false
          capabilities:
            drop: ["ALL"]
`

// TestNodeStatefulSetHaltsAfterOnePod ensures a bad change to the data of a StatefulSet
// of 3 (a quorum; MAX_UNAVAILABLE's 25 % is one pod) restarts one pod, whose replacement
// of the same name never becomes Ready, then halts (RolloutHalted, "1 of 3 pods") with the
// 2 others Ready on the old data, never 2 down; and that the fix completes the round, the
// Ready pods never below 2 throughout.
func TestNodeStatefulSetHaltsAfterOnePod(t *testing.T) {
	requireNode(t)
	setControllerEnv(t, "PROGRESS_DEADLINE", wavesDeadline)
	kubectlStdin(t, statefulSet, "apply", "-n", nodeNS, "-f", "-")
	t.Cleanup(func() { kubectlStdin(t, statefulSet, "delete", "-n", nodeNS, "--wait=false", "-f", "-") })
	const sel = "app=db"
	old := waitReadyPods(t, sel, 3)
	eventually(t, nodeTimeout, "db-config adopted", func() (bool, string) {
		v := getConfigMap(t, nodeNS, "db-config").Metadata.Annotations[restartedAnnotation]
		return v != "", v
	})
	sampler := sampleReadyOf(t, sel, old)

	mergePatch(t, nodeNS, "db-config", `{"data":{"message":""}}`) // the server exits
	eventually(t, nodeTimeout, "a RolloutHalted Event on ConfigMap db-config", func() (bool, string) {
		return slicesContainReason(objectEvents(t, "ConfigMap", nodeNS, "db-config"), "RolloutHalted"), sampler.stateNow()
	})
	for _, e := range objectEvents(t, "ConfigMap", nodeNS, "db-config") {
		if e.Reason == "RolloutHalted" {
			assert.Contains(t, e.Message, "1 of 3 pods", "the Event says how far the round got")
		}
	}
	deleted := 0
	for _, n := range oldDeletes(t, old) {
		deleted += n
	}
	assert.Equal(t, 1, deleted, "old pods deleted before the halt")
	sampler.checkFloor(t, "the bad change", 3, 2)

	mergePatch(t, nodeNS, "db-config", `{"data":{"message":"db 2"}}`)
	eventually(t, nodeTimeout, "3 Ready db pods, none old", func() (bool, string) { return sampler.settled(3) })
	sampler.checkFloor(t, "the bad change and its fix", 3, 2)
	for name, body := range serve(t, nodePods(t, sel)) {
		assert.Equal(t, "db 2", body, "pod %s after the fix", name)
	}
}
