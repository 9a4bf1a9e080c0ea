package policy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/selector"
	"github.com/k8spatterns/config-watcher/watch"
)

// fakePod is a pod as the fake API server keeps it.
type fakePod struct {
	name, uid   string
	labels      map[string]string
	terminating bool
	version     uint64 // resourceVersion; the fake's revision counter when 0
	ready       bool   // its Ready condition is True
	owner       string // the ReplicaSet (or ownerKind) that controls it ("": none)
	ownerKind   string // "": ReplicaSet
	waiting     string // container app's waiting reason, when not ready
	phase       string // "": Running
	// readySince is when its Ready condition last changed (zero: the
	// object shows no time).
	readySince time.Time
	// spec is its spec as JSON ("": one container reading nothing).
	spec string
}

// fakeOwner is a pod's controller, as its scale subresource shows it.
type fakeOwner struct {
	kind, uid string
	replicas  int
}

// request is what the fake server saw.
type request struct {
	method, path string
	query        map[string][]string
	body         string
}

// fakeAPI is an httptest API server for pods and ConfigMap patches that
// behaves like kube-apiserver where the controller depends on it: label
// selector filtering, paging, uid preconditions, 404/409 answers. fault, if
// set, may answer a request itself. It keeps state; watch's tests have a
// server of their own that plays a script of answers in order instead,
// and one server doing both would read harder than either.
type fakeAPI struct {
	t        *testing.T
	mu       sync.Mutex
	pods     map[string]*fakePod
	requests []request
	pageSize int
	fault    func(r request) (status int, body string, ok bool)
	// lose, if set, may have a request carried out but its answer lost: the
	// client sees 504, as when the ambassador or a proxy times out.
	lose func(r request) bool
	// graceful deletion: a deleted pod stays, terminating, at a new
	// revision, as a pod with a grace period does.
	graceful bool
	patchRVs []uint64 // the resourceVersion each ConfigMap write (PATCH or POST) answered
	// takenConfigMaps names ConfigMaps that exist and are not the test's:
	// a POST of one answers 409 AlreadyExists.
	takenConfigMaps map[string]bool
	// seededStates are the state ConfigMaps' annotations as the server
	// had them when the test began, by name (patchedAnnotations).
	seededStates map[string]map[string]*string
	// afterDelete, if set, runs (with mu held) after a pod is deleted.
	afterDelete func(p fakePod)
	removed     []string // pods deleted, in order
	srv         *httptest.Server
	nextUID     int
	// revision numbers writes, as etcd does; pods created by addPod and
	// deletions take the next one.
	revision uint64
	// owners are the pods' controllers, by name; each wants as many
	// replicas as it had live pods at the start.
	owners map[string]*fakeOwner
	// listsAtRevision: a pod LIST answers the revision of the latest write,
	// as kube-apiserver's consistent LIST does (else always 100).
	listsAtRevision bool
}

func newFakeAPI(t *testing.T, pods ...*fakePod) *fakeAPI {
	f := &fakeAPI{t: t, pods: map[string]*fakePod{}, pageSize: 2, revision: 10, owners: map[string]*fakeOwner{}}
	for _, p := range pods {
		if p.version == 0 {
			f.revision++
			p.version = f.revision
		}
		f.pods[p.name] = p
		if p.owner == "" {
			continue
		}
		o := f.owners[p.owner]
		if o == nil {
			o = &fakeOwner{kind: cmp.Or(p.ownerKind, "ReplicaSet"), uid: "uid-" + p.owner}
			f.owners[p.owner] = o
		}
		if !p.terminating && p.phase != "Failed" && p.phase != "Succeeded" {
			o.replicas++
		}
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) client() *apiclient.Client {
	c, err := apiclient.New(f.srv.URL, "test")
	require.NoError(f.t, err)
	return c
}

// becomeReady has pod p become Ready now, at the next revision, as the
// kubelet would report it. f.mu must be held.
func (f *fakeAPI) becomeReady(p *fakePod) {
	f.revision++
	p.ready, p.version, p.readySince = true, f.revision, time.Now()
}

// addPod adds a pod, as a ReplicaSet would, and returns it.
func (f *fakeAPI) addPod(name string, labels map[string]string) fakePod {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addPodLocked(name, labels)
}

// addPodLocked is addPod with f.mu held.
func (f *fakeAPI) addPodLocked(name string, labels map[string]string) fakePod {
	f.nextUID++
	f.revision++
	p := &fakePod{name: name, uid: fmt.Sprintf("uid-new-%d", f.nextUID), labels: labels, version: f.revision}
	f.pods[name] = p
	return *p
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := request{method: r.Method, path: r.URL.Path, query: r.URL.Query(), body: string(body)}
	f.mu.Lock()
	f.requests = append(f.requests, req)
	fault, lose := f.fault, f.lose
	f.mu.Unlock()
	if fault != nil {
		if code, body, ok := fault(req); ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			io.WriteString(w, body)
			return
		}
	}
	if lose != nil && lose(req) {
		defer http.Error(w, "upstream request timeout", http.StatusGatewayTimeout)
		w = httptest.NewRecorder()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/") // api v1 namespaces NS resource [name]
	if parts[0] == "apis" && len(parts) > 2 {
		parts = parts[1:] // apis GROUP v1 …: the same shape from v1 on
	}
	if len(parts) == 7 && parts[6] == "scale" && r.Method == http.MethodGet {
		f.serveScale(w, parts[4], parts[5])
		return
	}
	if len(parts) < 5 {
		http.NotFound(w, r)
		return
	}
	resource, name := parts[4], ""
	if len(parts) > 5 {
		name = parts[5]
	}
	switch {
	case resource == "pods" && r.Method == http.MethodGet && name == "":
		f.listPods(w, req)
	case resource == "pods" && r.Method == http.MethodDelete:
		f.deletePod(w, name, body, false)
	case resource == "pods" && r.Method == http.MethodPost && len(parts) == 7 && parts[6] == "eviction":
		var ev struct {
			Kind          string          `json:"kind"`
			DeleteOptions json.RawMessage `json:"deleteOptions"`
		}
		if err := json.Unmarshal(body, &ev); err != nil || ev.Kind != "Eviction" {
			writeStatus(w, 400, "BadRequest", "body is not an Eviction")
			return
		}
		f.deletePod(w, name, ev.DeleteOptions, true)
	case resource == "configmaps" && r.Method == http.MethodPatch:
		if ct := r.Header.Get("Content-Type"); ct != "application/merge-patch+json" {
			writeStatus(w, 415, "UnsupportedMediaType", ct)
			return
		}
		// The object as written, at the next revision of the test's events.
		f.answerConfigMapWrite(w, http.StatusOK, gjson.GetBytes(body, "metadata.uid").String())
	case resource == "configmaps" && r.Method == http.MethodPost && name == "":
		cm := gjson.GetBytes(body, "metadata.name").String()
		if f.takenConfigMaps[cm] {
			writeStatus(w, 409, "AlreadyExists", `configmaps "`+cm+`" already exists`)
			return
		}
		f.answerConfigMapWrite(w, http.StatusCreated, "state-uid-"+gjson.GetBytes(body, "metadata.annotations").Get(gjson.Escape(StateOfSecretAnnotation)).String())
	default:
		writeStatus(w, 405, "MethodNotAllowed", r.Method+" "+r.URL.Path)
	}
}

// answerConfigMapWrite answers a ConfigMap written: the revision after the
// test's last event, and uid.
func (f *fakeAPI) answerConfigMapWrite(w http.ResponseWriter, code int, uid string) {
	rv := lastRV.Add(1)
	f.patchRVs = append(f.patchRVs, rv)
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"kind":"ConfigMap","metadata":{"resourceVersion":"%d","uid":%q}}`, rv, uid)
}

// serveScale answers the scale subresource of an owner of pods, as
// kube-apiserver does: an autoscaling/v1 Scale carrying the owner's uid.
func (f *fakeAPI) serveScale(w http.ResponseWriter, resource, name string) {
	o := f.owners[name]
	if o == nil || resource != strings.ToLower(o.kind)+"s" {
		writeStatus(w, 404, "NotFound", resource+" "+name+" not found")
		return
	}
	json.NewEncoder(w).Encode(map[string]any{"kind": "Scale", "apiVersion": "autoscaling/v1",
		"metadata": map[string]any{"name": name, "namespace": "ns", "uid": o.uid},
		"spec":     map[string]any{"replicas": o.replicas}, "status": map[string]any{"replicas": o.replicas}})
}

func (f *fakeAPI) listPods(w http.ResponseWriter, req request) {
	matches := func(map[string]string) bool { return true }
	if ls := strings.Join(req.query["labelSelector"], ""); ls != "" {
		sel, err := selector.Parse(ls)
		if err != nil {
			writeStatus(w, 400, "BadRequest", err.Error())
			return
		}
		matches = sel.Matches
	}
	name, byName := strings.CutPrefix(strings.Join(req.query["fieldSelector"], ""), "metadata.name=")
	var names []string
	for n, p := range f.pods {
		if matches(p.labels) && (!byName || n == name) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	start := 0
	if c := strings.Join(req.query["continue"], ""); c != "" {
		start, _ = strconv.Atoi(c)
	}
	end := min(start+f.pageSize, len(names))
	items := []map[string]any{}
	for _, n := range names[start:end] {
		items = append(items, f.pods[n].object())
	}
	listMeta := map[string]any{"resourceVersion": "100"}
	if f.listsAtRevision {
		listMeta["resourceVersion"] = strconv.FormatUint(f.revision, 10)
	}
	if end < len(names) {
		listMeta["continue"] = strconv.Itoa(end)
	}
	json.NewEncoder(w).Encode(map[string]any{"kind": "PodList", "apiVersion": "v1", "metadata": listMeta, "items": items})
}

// object is the pod as the server shows it: what the controller reads of
// it, and a spec it must not need.
func (p *fakePod) object() map[string]any {
	meta := map[string]any{"name": p.name, "namespace": "ns", "uid": p.uid, "labels": p.labels, "resourceVersion": strconv.FormatUint(p.version, 10)}
	if p.terminating {
		meta["deletionTimestamp"] = "2026-12-02T10:00:00Z"
	}
	if p.owner != "" {
		meta["ownerReferences"] = []map[string]any{{"apiVersion": "apps/v1", "kind": cmp.Or(p.ownerKind, "ReplicaSet"), "name": p.owner, "uid": "uid-" + p.owner, "controller": true}}
	}
	ready, app := "False", map[string]any{"name": "app", "ready": p.ready, "state": map[string]any{"running": map[string]any{}}}
	if p.ready {
		ready = "True"
	} else if p.waiting != "" {
		app["state"] = map[string]any{"waiting": map[string]any{"reason": p.waiting}}
	}
	condition := map[string]any{"type": "Ready", "status": ready}
	if !p.readySince.IsZero() {
		condition["lastTransitionTime"] = p.readySince.UTC().Format(time.RFC3339)
	}
	status := map[string]any{"phase": cmp.Or(p.phase, "Running"), "conditions": []map[string]any{condition}, "containerStatuses": []map[string]any{app}}
	if p.phase == "Failed" {
		status["reason"] = "Evicted"
	}
	var spec any = map[string]any{"containers": []map[string]any{{"name": "app", "image": "webapp:1"}}}
	if p.spec != "" {
		spec = json.RawMessage(p.spec)
	}
	return map[string]any{"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": status}
}

// deletePod deletes (or, evict, evicts) a pod: a DELETE answers the pod at
// the revision of its deletion, an eviction a Status, as kube-apiserver
// does.
func (f *fakeAPI) deletePod(w http.ResponseWriter, name string, body []byte, evict bool) {
	var opts struct {
		Kind          string `json:"kind"`
		Preconditions struct {
			UID             string `json:"uid"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"preconditions"`
		DryRun []string `json:"dryRun"`
	}
	if err := json.Unmarshal(body, &opts); err != nil || opts.Kind != "DeleteOptions" {
		writeStatus(w, 400, "BadRequest", "body is not DeleteOptions")
		return
	}
	p, ok := f.pods[name]
	switch {
	case !ok:
		writeStatus(w, 404, "NotFound", `pods "`+name+`" not found`)
	case opts.Preconditions.UID != p.uid:
		writeStatus(w, 409, "Conflict", "Precondition failed: UID in precondition: "+opts.Preconditions.UID+", UID in object meta: "+p.uid)
	case opts.Preconditions.ResourceVersion != "" && opts.Preconditions.ResourceVersion != strconv.FormatUint(p.version, 10):
		writeStatus(w, 409, "Conflict", "Precondition failed: ResourceVersion in precondition: "+opts.Preconditions.ResourceVersion+", ResourceVersion in object meta: "+strconv.FormatUint(p.version, 10))
	case p.terminating && f.graceful:
		fmt.Fprintf(w, `{"kind":"Pod","metadata":{"name":%q,"resourceVersion":"%d"}}`, name, p.version)
		return
	default:
		rv := p.version
		if len(opts.DryRun) == 0 {
			f.revision++
			rv = f.revision
			if f.graceful {
				p.terminating, p.version = true, rv
			} else {
				delete(f.pods, name)
			}
			f.removed = append(f.removed, name)
			if f.afterDelete != nil {
				f.afterDelete(*p)
			}
		}
		if evict {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","code":201}`)
			return
		}
		fmt.Fprintf(w, `{"kind":"Pod","metadata":{"name":%q,"resourceVersion":"%d"}}`, name, rv)
	}
}

// relabel gives a pod new labels at a new revision, as kubectl label does.
func (f *fakeAPI) relabel(name string, labels map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revision++
	f.pods[name].labels, f.pods[name].version = labels, f.revision
}

// replaceAll replaces every pod by a new one with the same labels, as a
// rollout restart does.
func (f *fakeAPI) replaceAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, p := range f.pods {
		delete(f.pods, name)
		f.addPodLocked(name+"r", p.labels)
	}
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%q,"reason":%q,"code":%d}`, msg, reason, code)
}

// seen returns the requests with the given method (any if "") and resource ("pods",
// "configmaps").
func (f *fakeAPI) seen(method, resource string) []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []request
	for _, r := range f.requests {
		if (method == "" || r.method == method) && strings.Contains(r.path, "/"+resource) {
			out = append(out, r)
		}
	}
	return out
}

// evictedPods lists the pod names an eviction was posted for, in order.
func (f *fakeAPI) evictedPods() []string {
	var names []string
	for _, r := range f.seen(http.MethodPost, "pods") {
		names = append(names, strings.Split(r.path, "/")[6])
	}
	return names
}

// deletedPods lists the pod names DELETE was sent for, in order.
func (f *fakeAPI) deletedPods() []string {
	var names []string
	for _, r := range f.seen(http.MethodDelete, "pods") {
		names = append(names, r.path[strings.LastIndexByte(r.path, '/')+1:])
	}
	return names
}

// patchedAnnotations decodes the annotations of each ConfigMap write
// (PATCH or POST), in order. A Secret's state is written whole (with its
// MAC): for such a write it returns what the write changed, against the
// state as the server had it, so that one write reads as the record, the
// intent or the halt it is.
func (f *fakeAPI) patchedAnnotations() []map[string]*string {
	states := map[string]map[string]*string{}
	for name, ann := range f.seededStates {
		states[name] = maps.Clone(ann)
	}
	var out []map[string]*string
	for _, r := range f.seen("", "configmaps") {
		if r.method != http.MethodPatch && r.method != http.MethodPost {
			continue
		}
		var p struct {
			Metadata struct {
				Name        string             `json:"name"`
				Annotations map[string]*string `json:"annotations"`
			} `json:"metadata"`
		}
		require.NoError(f.t, json.Unmarshal([]byte(r.body), &p))
		written := p.Metadata.Annotations
		if _, ok := written[StateMACAnnotation]; !ok {
			out = append(out, written)
			continue
		}
		name := cmp.Or(p.Metadata.Name, r.path[strings.LastIndexByte(r.path, '/')+1:])
		before := states[name]
		if r.method == http.MethodPost {
			before = nil // created anew
		}
		after, changed := map[string]*string{}, map[string]*string{}
		for a, v := range before {
			after[a] = v
		}
		for a, v := range written {
			if old, had := before[a]; had != (v != nil) || (had && *old != *v) {
				changed[a] = v
			}
			if v == nil {
				delete(after, a)
			} else {
				after[a] = v
			}
		}
		states[name] = after
		out = append(out, changed)
	}
	return out
}

// seedStates tells the fake the state ConfigMaps among specs, as the
// server has them before the test's writes.
func (f *fakeAPI) seedStates(specs []cmSpec) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range specs {
		if s.annotations[StateOfSecretAnnotation] == "" {
			continue
		}
		ann := map[string]*string{}
		for a, v := range s.annotations {
			ann[a] = ptr(v)
		}
		if s.recorded != "" {
			ann[RestartedForAnnotation] = ptr(s.recorded)
		}
		if s.intent != "" {
			ann[RestartingAnnotation] = ptr(s.intent)
		}
		if f.seededStates == nil {
			f.seededStates = map[string]map[string]*string{}
		}
		f.seededStates[s.name] = ann
	}
}

// recordedHashes lists the restarted-for values patched, in order.
func (f *fakeAPI) recordedHashes() []string {
	var out []string
	for _, a := range f.patchedAnnotations() {
		if v := a[RestartedForAnnotation]; v != nil {
			out = append(out, *v)
		}
	}
	return out
}

// intents lists the restarting values patched, in order ("" for a removal).
func (f *fakeAPI) intents() []string {
	var out []string
	for _, a := range f.patchedAnnotations() {
		if v, ok := a[RestartingAnnotation]; ok {
			if v == nil {
				out = append(out, "")
			} else {
				out = append(out, *v)
			}
		}
	}
	return out
}

// cmSpec describes a ConfigMap event for tests.
type cmSpec struct {
	name, uid   string
	selector    *string // nil: no selector annotation
	recorded    string  // restarted-for annotation, "" for none
	data        map[string]string
	binaryData  map[string]string
	labels      map[string]string
	annotations map[string]string
	rv          string // resourceVersion; "" for the next one in sequence
	intent      string // restarting annotation, "" for none
	ownerSecret string // the Secret that owns it, "" for none
}

// lastRV numbers test events in the order they are made.
var lastRV atomic.Uint64

func ptr(s string) *string { return &s }

func (s cmSpec) json(t *testing.T) []byte {
	ann := map[string]string{}
	for k, v := range s.annotations {
		ann[k] = v
	}
	if s.selector != nil {
		ann[DefaultSelectorAnnotation] = *s.selector
	}
	if s.recorded != "" {
		ann[RestartedForAnnotation] = s.recorded
	}
	if s.intent != "" {
		ann[RestartingAnnotation] = s.intent
	}
	uid := s.uid
	if uid == "" {
		uid = "cm-uid-1"
	}
	name := s.name
	if name == "" {
		name = "webapp-config"
	}
	rv := s.rv
	if rv == "" {
		rv = strconv.FormatUint(lastRV.Add(1), 10) // each event newer than the last, as on a watch
	}
	meta := map[string]any{"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv, "annotations": ann, "labels": s.labels}
	if s.ownerSecret != "" {
		meta["ownerReferences"] = []map[string]any{{"apiVersion": "v1", "kind": "Secret", "name": s.ownerSecret, "uid": "secret-uid-1"}}
	}
	obj := map[string]any{"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta}
	if s.data != nil {
		obj["data"] = s.data
	}
	if s.binaryData != nil {
		obj["binaryData"] = s.binaryData
	}
	b, err := json.Marshal(obj)
	require.NoError(t, err)
	return b
}

// hashOf is the digest the controller computes for a ConfigMap's data.
func hashOf(t *testing.T, data map[string]string) string {
	cm, err := parseObject(cmSpec{data: data, selector: ptr("app=x")}.json(t), kindConfigMap, DefaultSelectorAnnotation, nil)
	require.NoError(t, err)
	return cm.hash.text()
}

// DefaultSelectorAnnotation is the book's annotation, used by the tests.
const DefaultSelectorAnnotation = "k8spatterns.io/podDeleteSelector"

// newTestController returns a controller on api with fast retries and its
// metrics registry.
func newTestController(t *testing.T, api API, cfg Config) (*Controller, *Metrics) {
	if cfg.SelectorAnnotation == "" {
		cfg.SelectorAnnotation = DefaultSelectorAnnotation
	}
	if cfg.NewBackOff == nil {
		cfg.NewBackOff = fastBackOff
	}
	m := NewMetrics(metrics.NewRegistry())
	c := New(cfg, api, slog.New(slog.NewTextHandler(io.Discard, nil)), m)
	c.sweepWait = 100 * time.Millisecond // the index of a test has no watch: nothing comes later
	c.wavePoll = 5 * time.Millisecond
	c.replacedWait = 50 * time.Millisecond // the events of a test come from the test itself
	return c, m
}

func handle(t *testing.T, c *Controller, typ watch.EventType, s cmSpec) {
	configMaps(c).Handle(watch.Event{Type: typ, Object: s.json(t), ResourceVersion: "42"})
}

// Len is the number of keys waiting or due for a retry.
func (q *queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) + len(q.timers)
}

// configMaps returns the handler main gives the ConfigMap watch of every
// namespace (ForConfigMaps("")). The first time, it ends an empty first
// list, as that watch would before its events, so that workers do not wait
// for it (syncWait).
func configMaps(c *Controller) watch.Handler {
	c.mu.Lock()
	listed := c.all[kindConfigMap].listed
	c.mu.Unlock()
	h := c.ForConfigMaps("")
	if !listed {
		h.BeginList()
		h.EndList()
	}
	return h
}
