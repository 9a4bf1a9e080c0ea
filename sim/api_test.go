package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/selector"
)

// The in-memory API server: one store, one resourceVersion counter, an event
// log for watches (compacted on the seed's say), and requests that wait in
// pending until the driver answers them, in the order the seed picks.

// object is one stored object, as JSON decodes it.
type object = map[string]any

// key names a stored object: resource, namespace ("" for a cluster-scoped
// one) and name.
type key struct{ res, ns, name string }

func (k key) String() string { return k.res + "/" + k.ns + "/" + k.name }

// change is one entry of the event log: the object after (or, deleted, as
// it was), and before, to tell a selector-filtered watch which it left.
type change struct {
	rv     uint64
	typ    string // ADDED, MODIFIED, DELETED
	k      key
	obj    object
	before object // nil for ADDED
}

// request is one request received, waiting for the driver.
type request struct {
	conn   *conn
	method string
	path   string
	query  url.Values
	body   []byte
	ctx    context.Context
	answer chan answer // buffered: the driver never waits on a client
	at     time.Duration
	// shows: the ConfigMaps and Secrets a LIST's answer holds; gone: the
	// deletions (world.removals) it shows by their absence.
	shows, gone []sighting
	// podList: the namespace of a LIST of pods (not a limit=1 mark) whose
	// answer takes the server's pods as they were when served ("*": all).
	podList string
	served  time.Duration
	canon   string // what orders it among those pending; twins' are equal
}

func (r *request) String() string {
	q := r.query.Encode()
	if q != "" {
		q = "?" + q
	}
	return r.method + " " + r.path + q
}

type answer struct {
	resp *http.Response
	err  error
}

// conn is one controller process's connection to the server: killed, none
// of its requests reaches the server and no answer reaches it.
type conn struct {
	api  *api
	gen  int
	dead bool // under api.mu
}

// RoundTrip hands the request to the server and waits for its answer.
func (c *conn) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	a := c.api
	r := &request{conn: c, method: req.Method, path: req.URL.Path, query: req.URL.Query(), body: body, ctx: req.Context(), answer: make(chan answer, 1)}
	a.mu.Lock()
	if c.dead {
		a.mu.Unlock()
		return nil, errors.New("sim: process killed")
	}
	r.at = a.w.now()
	a.pending = append(a.pending, r)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	select {
	case ans := <-r.answer:
		if ans.resp != nil {
			ans.resp.Request = req
		}
		return ans.resp, ans.err
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
}

// api is the server's state. The driver alone changes it, but RoundTrip
// (any goroutine) appends to pending, and watch streams read their buffers:
// mu guards those.
type api struct {
	w       *world
	mu      sync.Mutex
	pending []*request
	wake    chan struct{}

	rv        uint64
	objects   map[key]object
	log       []change
	compacted uint64 // events at or below this revision are gone
	watches   []*stream
	snapshots map[string][]object // continue token -> the rest of a paged list
	tokens    int
	outbox    []*delivery // sent, not delivered yet; in order per stream
}

func newAPI(w *world) *api {
	return &api{w: w, wake: make(chan struct{}, 1), objects: map[key]object{}, snapshots: map[string][]object{}}
}

// takePending returns the requests received so far, in a canonical order
// (what arrived when within one step depends on the goroutines' schedule),
// those of dead processes dropped.
func (a *api) takePending() []*request {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pending
	a.pending = nil
	p = slices.DeleteFunc(p, func(r *request) bool { return r.conn.dead })
	for _, r := range p {
		r.canon = fmt.Sprintf("%d %s %s", r.conn.gen, r, r.body)
	}
	slices.SortStableFunc(p, func(x, y *request) int { return strings.Compare(x.canon, y.canon) })
	return p
}

// --- the store ---

func meta(o object) map[string]any {
	m, _ := o["metadata"].(map[string]any)
	if m == nil {
		m = map[string]any{}
		o["metadata"] = m
	}
	return m
}

func str(m map[string]any, k string) string { s, _ := m[k].(string); return s }

func labelsOf(o object) map[string]string {
	out := map[string]string{}
	if l, ok := meta(o)["labels"].(map[string]any); ok {
		for k, v := range l {
			out[k], _ = v.(string)
		}
	}
	return out
}

func annotationsOf(o object) map[string]string {
	out := map[string]string{}
	if l, ok := meta(o)["annotations"].(map[string]any); ok {
		for k, v := range l {
			out[k], _ = v.(string)
		}
	}
	return out
}

// clone copies o deeply (through JSON: what a client would see).
func clone(o object) object {
	if o == nil {
		return nil
	}
	b, _ := json.Marshal(o)
	var c object
	_ = json.Unmarshal(b, &c)
	return c
}

func (a *api) get(k key) object { return a.objects[k] }

// put stores o under k with the next resourceVersion and logs the change.
func (a *api) put(k key, o object) object {
	before := a.objects[k]
	a.rv++
	m := meta(o)
	m["resourceVersion"] = strconv.FormatUint(a.rv, 10)
	m["name"] = k.name
	if k.ns != "" {
		m["namespace"] = k.ns
	}
	typ := "MODIFIED"
	if before == nil {
		typ = "ADDED"
		a.w.uids++
		if str(m, "uid") == "" {
			m["uid"] = fmt.Sprintf("uid-%d", a.w.uids)
		}
		if _, ok := m["creationTimestamp"]; !ok {
			m["creationTimestamp"] = a.w.clockTime().UTC().Format(time.RFC3339)
		}
	}
	a.objects[k] = o
	a.emit(change{rv: a.rv, typ: typ, k: k, obj: clone(o), before: clone(before)})
	return o
}

// remove deletes k; the DELETED event carries the last state at a new
// revision, as the API server's does.
func (a *api) remove(k key) object {
	o := a.objects[k]
	if o == nil {
		return nil
	}
	delete(a.objects, k)
	a.rv++
	meta(o)["resourceVersion"] = strconv.FormatUint(a.rv, 10)
	a.emit(change{rv: a.rv, typ: "DELETED", k: k, obj: clone(o), before: clone(o)})
	if k.res == "pods" {
		a.w.podRemoved(k)
	}
	return o
}

func (a *api) emit(c change) {
	a.log = append(a.log, c)
	for _, s := range a.watches {
		s.send(c)
	}
}

// compact forgets the log up to now: watches from before answer 410, and
// so do the continue tokens of lists begun before.
func (a *api) compact() {
	a.compacted = a.rv
	a.log = nil
	a.snapshots = map[string][]object{}
}

// --- requests ---

// route is what a path names.
type route struct {
	k   key    // k.name empty: the collection
	sub string // "scale", "eviction", "status"
	raw string // a discovery or review path
}

// parse reads /api/v1/..., /apis/g/v/... paths.
func parse(path string) (route, bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api" && parts[1] == "v1":
		parts = parts[2:]
	case len(parts) == 3 && parts[0] == "apis":
		return route{raw: "discovery " + parts[1] + "/" + parts[2]}, true
	case len(parts) == 4 && parts[0] == "apis" && parts[3] == "selfsubjectaccessreviews":
		return route{raw: "review"}, true
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return route{}, false
	}
	var r route
	switch {
	case len(parts) == 1:
		r.k.res = parts[0]
	case len(parts) == 2 && parts[0] == "namespaces":
		r.k = key{"namespaces", "", parts[1]}
	case len(parts) >= 3 && parts[0] == "namespaces":
		r.k = key{parts[2], parts[1], ""}
		if len(parts) >= 4 {
			r.k.name = parts[3]
		}
		if len(parts) == 5 {
			r.sub = parts[4]
		}
		if len(parts) > 5 {
			return r, false
		}
	default:
		return r, false
	}
	return r, true
}

func jsonResponse(code int, body []byte) *http.Response {
	return &http.Response{StatusCode: code, Status: fmt.Sprintf("%d %s", code, http.StatusText(code)),
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(bytes.NewReader(body))}
}

func status(code int, reason, msg string) *http.Response {
	b, _ := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": msg, "reason": reason, "code": code})
	return jsonResponse(code, b)
}

func objectResponse(code int, o object) *http.Response {
	b, _ := json.Marshal(o)
	return jsonResponse(code, b)
}

// serve acts on r and returns its answer (nil resp: a watch, answered by
// its stream).
func (a *api) serve(r *request) *http.Response {
	rt, ok := parse(r.path)
	if !ok {
		return status(404, "NotFound", "sim: no such path "+r.path)
	}
	switch {
	case strings.HasPrefix(rt.raw, "discovery "):
		return a.discovery(strings.TrimPrefix(rt.raw, "discovery "))
	case rt.raw == "review":
		return jsonResponse(201, []byte(`{"kind":"SelfSubjectAccessReview","apiVersion":"authorization.k8s.io/v1","status":{"allowed":true}}`))
	}
	k := rt.k
	switch {
	case r.method == http.MethodGet && k.name == "" && r.query.Get("watch") == "true":
		return a.watch(r, k)
	case r.method == http.MethodGet && k.name == "":
		return a.list(r, k)
	case r.method == http.MethodGet && rt.sub == "scale":
		return a.scale(r, k)
	case r.method == http.MethodGet && rt.sub == "":
		if o := a.get(k); o != nil {
			return objectResponse(200, o)
		}
		return status(404, "NotFound", k.String()+" not found")
	case r.method == http.MethodPost && k.name == "":
		return a.create(k, r.body)
	case r.method == http.MethodPost && rt.sub == "eviction" && k.res == "pods":
		return a.evict(r, k)
	case r.method == http.MethodPut && rt.sub == "":
		return a.update(k, r.body)
	case r.method == http.MethodPatch && rt.sub == "":
		return a.patch(k, r.body)
	case r.method == http.MethodDelete && rt.sub == "" && k.name != "":
		return a.delete(r, k)
	}
	return status(405, "MethodNotAllowed", "sim: "+r.method+" "+r.path+" not served")
}

func (a *api) discovery(gv string) *http.Response {
	if gv != "apps/v1" {
		return status(404, "NotFound", "sim: no group "+gv)
	}
	return jsonResponse(200, []byte(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"apps/v1","resources":[`+
		`{"name":"replicasets","namespaced":true,"kind":"ReplicaSet"},{"name":"replicasets/scale","namespaced":true,"kind":"Scale","group":"autoscaling","version":"v1"},`+
		`{"name":"deployments","namespaced":true,"kind":"Deployment"},{"name":"deployments/scale","namespaced":true,"kind":"Scale","group":"autoscaling","version":"v1"},`+
		`{"name":"daemonsets","namespaced":true,"kind":"DaemonSet"}]}`))
}

// scale answers a ReplicaSet's scale from the world's workload.
func (a *api) scale(r *request, k key) *http.Response {
	wl := a.w.workloadByName(k.ns, k.name)
	if k.res != "replicasets" || wl == nil || wl.kind != "ReplicaSet" {
		return status(404, "NotFound", k.String()+" not found")
	}
	if wl.scaleRead == nil {
		wl.scaleRead = map[int]time.Duration{}
	}
	wl.scaleRead[r.conn.gen] = a.w.now()
	return objectResponse(200, object{"kind": "Scale", "apiVersion": "autoscaling/v1",
		"metadata": map[string]any{"name": k.name, "namespace": k.ns, "uid": wl.uid},
		"spec":     map[string]any{"replicas": wl.replicas}, "status": map[string]any{"replicas": len(wl.live())}})
}

// matches reports whether o passes a request's label and field selectors.
func matches(o object, q url.Values) bool {
	if ls := q.Get("labelSelector"); ls != "" {
		sel, err := selector.ParseAny(ls)
		if err != nil || !sel.Matches(labelsOf(o)) {
			return false
		}
	}
	for _, f := range strings.Split(q.Get("fieldSelector"), ",") {
		switch {
		case f == "":
		case strings.HasPrefix(f, "metadata.name="):
			if str(meta(o), "name") != strings.TrimPrefix(f, "metadata.name=") {
				return false
			}
		case strings.HasPrefix(f, "type!="):
			if t, _ := o["type"].(string); t == strings.TrimPrefix(f, "type!=") {
				return false
			}
		}
	}
	return true
}

// inScope reports whether k is in the collection c (namespace "" is all).
func inScope(k, c key) bool { return k.res == c.res && (c.ns == "" || k.ns == c.ns) }

// list answers a LIST, consistent (always the latest state), paged by
// limit with a continue token that holds its snapshot until compaction.
func (a *api) list(r *request, c key) *http.Response {
	var items []object
	if tok := r.query.Get("continue"); tok != "" {
		rest, ok := a.snapshots[tok]
		if !ok {
			return status(410, "Expired", "sim: the provided continue parameter is too old")
		}
		delete(a.snapshots, tok)
		items = rest
	} else {
		keys := make([]key, 0)
		for k := range a.objects {
			if inScope(k, c) {
				keys = append(keys, k)
			}
		}
		slices.SortFunc(keys, func(x, y key) int { return strings.Compare(x.String(), y.String()) })
		for _, k := range keys {
			if o := a.objects[k]; matches(o, r.query) {
				items = append(items, clone(o))
			}
		}
	}
	m := map[string]any{"resourceVersion": strconv.FormatUint(a.rv, 10)}
	if limit, _ := strconv.Atoi(r.query.Get("limit")); limit > 0 && len(items) > limit {
		a.tokens++
		tok := strconv.Itoa(a.tokens)
		a.snapshots[tok] = items[limit:]
		items = items[:limit]
		m["continue"] = tok
	}
	if items == nil {
		items = []object{}
	}
	if c.res == "configmaps" || c.res == "secrets" {
		for _, o := range items {
			r.shows = append(r.shows, sightingOf(c.res, o))
		}
		if r.query.Get("continue") == "" {
			for _, rm := range a.w.removals {
				if d := a.w.datas[rm.data]; d != nil && rm.rv <= a.rv && inScope(key{d.kind, d.ns, d.name}, c) {
					r.gone = append(r.gone, rm.sighting)
				}
			}
		}
	}
	return objectResponse(200, object{"kind": "List", "apiVersion": "v1", "metadata": m, "items": items})
}

func decode(body []byte) (object, error) {
	var o object
	if err := json.Unmarshal(body, &o); err != nil || o == nil {
		return nil, fmt.Errorf("sim: body is not an object")
	}
	return o, nil
}

func (a *api) create(c key, body []byte) *http.Response {
	o, err := decode(body)
	if err != nil {
		return status(400, "BadRequest", err.Error())
	}
	name := str(meta(o), "name")
	if name == "" {
		if gen := str(meta(o), "generateName"); gen != "" {
			a.w.uids++
			name = fmt.Sprintf("%s%d", gen, a.w.uids)
		} else {
			return status(422, "Invalid", "sim: no name")
		}
	}
	k := key{c.res, c.ns, name}
	if a.objects[k] != nil {
		return status(409, "AlreadyExists", k.String()+" already exists")
	}
	delete(meta(o), "resourceVersion")
	delete(meta(o), "uid")
	a.put(k, o)
	a.w.objectWritten(k)
	return objectResponse(201, o)
}

func (a *api) update(k key, body []byte) *http.Response {
	o, err := decode(body)
	if err != nil {
		return status(400, "BadRequest", err.Error())
	}
	cur := a.objects[k]
	if cur == nil {
		return status(404, "NotFound", k.String()+" not found")
	}
	if rv := str(meta(o), "resourceVersion"); rv != "" && rv != str(meta(cur), "resourceVersion") {
		return status(409, "Conflict", "sim: the object has been modified")
	}
	meta(o)["uid"] = str(meta(cur), "uid")
	meta(o)["creationTimestamp"] = meta(cur)["creationTimestamp"]
	a.put(k, o)
	a.w.objectWritten(k)
	return objectResponse(200, o)
}

// mergePatch applies an RFC 7386 merge patch.
func mergePatch(target, patch map[string]any) map[string]any {
	if target == nil {
		target = map[string]any{}
	}
	for k, v := range patch {
		switch pv := v.(type) {
		case nil:
			delete(target, k)
		case map[string]any:
			t, _ := target[k].(map[string]any)
			target[k] = mergePatch(t, pv)
		default:
			target[k] = v
		}
	}
	return target
}

func (a *api) patch(k key, body []byte) *http.Response {
	p, err := decode(body)
	if err != nil {
		return status(400, "BadRequest", err.Error())
	}
	cur := a.objects[k]
	if cur == nil {
		return status(404, "NotFound", k.String()+" not found")
	}
	o := mergePatch(clone(cur), p)
	if rv := str(meta(o), "resourceVersion"); rv != str(meta(cur), "resourceVersion") {
		return status(409, "Conflict", "sim: the object has been modified")
	}
	if str(meta(o), "uid") != str(meta(cur), "uid") {
		return status(409, "Conflict", "sim: precondition failed: uid")
	}
	a.put(k, o)
	a.w.objectWritten(k)
	return objectResponse(200, o)
}

// preconditionsFail checks DeleteOptions' preconditions against o.
func preconditionsFail(o object, opts map[string]any) string {
	pre, _ := opts["preconditions"].(map[string]any)
	if uid := str(pre, "uid"); uid != "" && uid != str(meta(o), "uid") {
		return "Precondition failed: UID in precondition: " + uid + ", UID in object meta: " + str(meta(o), "uid")
	}
	if rv := str(pre, "resourceVersion"); rv != "" && rv != str(meta(o), "resourceVersion") {
		return "Precondition failed: ResourceVersion in precondition: " + rv + ", ResourceVersion in object meta: " + str(meta(o), "resourceVersion")
	}
	return ""
}

func (a *api) delete(r *request, k key) *http.Response {
	o := a.objects[k]
	if o == nil {
		return status(404, "NotFound", k.String()+" not found")
	}
	opts := map[string]any{}
	if len(r.body) > 0 {
		if err := json.Unmarshal(r.body, &opts); err != nil {
			return status(400, "BadRequest", "sim: bad DeleteOptions")
		}
	}
	if why := preconditionsFail(o, opts); why != "" {
		return status(409, "Conflict", why)
	}
	if k.res != "pods" {
		return status(405, "MethodNotAllowed", "sim: the controller deletes pods only")
	}
	if len(r.query["dryRun"]) > 0 {
		return objectResponse(200, o)
	}
	a.w.controllerDeletes(r, k)
	return objectResponse(200, a.remove(k))
}

func (a *api) evict(r *request, k key) *http.Response {
	o := a.objects[k]
	if o == nil {
		return status(404, "NotFound", k.String()+" not found")
	}
	ev, err := decode(r.body)
	if err != nil {
		return status(400, "BadRequest", err.Error())
	}
	opts, _ := ev["deleteOptions"].(map[string]any)
	if why := preconditionsFail(o, opts); why != "" {
		return status(409, "Conflict", why)
	}
	a.w.controllerDeletes(r, k)
	a.remove(k)
	return jsonResponse(201, []byte(`{"kind":"Status","apiVersion":"v1","status":"Success","code":201}`))
}

// sighting is a ConfigMap or Secret as an answer or an event shows it.
type sighting struct {
	uid, data string // data: its dataKey
	rv        uint64
}

func sightingOf(res string, o object) sighting {
	rv, _ := strconv.ParseUint(str(meta(o), "resourceVersion"), 10, 64)
	return sighting{uid: str(meta(o), "uid"), data: dataKey(res, str(meta(o), "namespace"), str(meta(o), "name")), rv: rv}
}

// --- watches ---

// stream is one watch's body: events are queued without blocking the
// server and read by the client.
type stream struct {
	a        *api
	c        key
	q        url.Values
	ctx      context.Context
	mu       sync.Mutex
	buf      bytes.Buffer
	end      error // io.EOF: a clean end; another: cut
	wake     chan struct{}
	closeAt  time.Duration
	bookmark bool
	conn     *conn
	closing  bool // its end is queued: nothing more is sent (the driver's)
}

// delivery is one thing the server sends, held until the driver hands it
// over: an answer, a watch event line, a watch's end.
type delivery struct {
	r    *request
	ans  answer
	s    *stream
	line []byte
	end  error
	// added: the uid of the pod an ADDED event of a pods watch shows.
	added string
	// shows: the ConfigMap or Secret an event shows (uid "": none); gone:
	// the one a DELETED event shows deleted.
	shows, gone sighting
	// pod: the uid of the pod an event of a pods watch shows, as it was
	// at made.
	pod  string
	made time.Duration
	twin int // answers to twin requests, delivered together (0: none)
}

// push queues one line for the client; the driver delivers it.
func (s *stream) push(line []byte) *delivery {
	if s.closing {
		return nil
	}
	d := &delivery{s: s, line: append(line, '\n')}
	s.a.outbox = append(s.a.outbox, d)
	return d
}

// close queues the stream's end after what it holds (io.EOF: a clean
// end), or, cut, drops what it holds and ends it now.
func (s *stream) close(err error, cut bool) {
	if s.closing {
		return
	}
	s.closing = true
	if cut {
		s.a.outbox = slices.DeleteFunc(s.a.outbox, func(d *delivery) bool { return d.s == s })
		s.finish(err)
		return
	}
	s.a.outbox = append(s.a.outbox, &delivery{s: s, end: err})
}

// finish ends the stream for its reader.
func (s *stream) finish(err error) {
	s.mu.Lock()
	if s.end == nil {
		s.end = err
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// write hands the reader one line.
func (s *stream) write(line []byte) {
	s.mu.Lock()
	s.buf.Write(line)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *stream) Read(p []byte) (int, error) {
	for {
		s.mu.Lock()
		if s.buf.Len() > 0 {
			n, _ := s.buf.Read(p)
			s.mu.Unlock()
			return n, nil
		}
		if s.end != nil {
			err := s.end
			s.mu.Unlock()
			return 0, err
		}
		s.mu.Unlock()
		select {
		case <-s.wake:
		case <-s.ctx.Done():
			return 0, s.ctx.Err()
		}
	}
}

// Close is the client's: it leaves the watch.
func (s *stream) Close() error {
	s.finish(io.EOF)
	return nil
}

func (s *stream) ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing || s.end != nil || s.ctx.Err() != nil
}

func (s *stream) event(typ string, o object) {
	b, _ := json.Marshal(map[string]any{"type": typ, "object": o})
	d := s.push(b)
	switch {
	case d == nil:
	case s.c.res == "pods":
		d.pod, d.made = str(meta(o), "uid"), s.a.w.now()
		if typ == "ADDED" {
			d.added = d.pod
		}
	case (typ == "ADDED" || typ == "MODIFIED") && (s.c.res == "configmaps" || s.c.res == "secrets"):
		d.shows = sightingOf(s.c.res, o)
	case typ == "DELETED" && (s.c.res == "configmaps" || s.c.res == "secrets"):
		d.gone = sightingOf(s.c.res, o)
	}
}

// send passes c to the stream as a filtered watch sees it: an object that
// stops matching is DELETED, one that starts matching ADDED.
func (s *stream) send(c change) {
	if !inScope(c.k, s.c) {
		return
	}
	now := matches(c.obj, s.q)
	was := c.before != nil && matches(c.before, s.q)
	switch {
	case c.typ == "DELETED" && was:
		s.event("DELETED", c.obj)
	case c.typ == "DELETED":
	case now && was:
		s.event("MODIFIED", c.obj)
	case now:
		s.event("ADDED", c.obj)
	case was:
		s.event("DELETED", c.obj)
	}
}

func (a *api) watch(r *request, c key) *http.Response {
	s := &stream{a: a, c: c, q: r.query, ctx: r.ctx, wake: make(chan struct{}, 1), conn: r.conn,
		bookmark: r.query.Get("allowWatchBookmarks") == "true"}
	// The server, not the client's random timeoutSeconds, ends a watch:
	// at a time the seed picks, before any client's own deadline.
	s.closeAt = a.w.now() + time.Duration(60+a.w.rng.IntN(200))*time.Second
	from, err := strconv.ParseUint(r.query.Get("resourceVersion"), 10, 64)
	if err != nil {
		from = a.rv
	}
	resp := jsonResponse(200, nil)
	resp.Body = s
	if from < a.compacted {
		s.event("ERROR", object{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
			"message": fmt.Sprintf("too old resource version: %d (%d)", from, a.compacted)})
		s.close(io.EOF, false)
		return resp
	}
	for _, ch := range a.log {
		if ch.rv > from {
			s.send(ch)
		}
	}
	a.watches = append(a.watches, s)
	return resp
}

// tickWatches ends watches whose time is up, drops those ended, and sends
// every open one a bookmark now and then.
func (a *api) tickWatches(bookmark bool) {
	now := a.w.now()
	a.watches = slices.DeleteFunc(a.watches, func(s *stream) bool {
		if s.conn.dead {
			s.close(errors.New("sim: process killed"), true)
		}
		if now >= s.closeAt {
			s.close(io.EOF, false)
		}
		return s.ended()
	})
	if !bookmark {
		return
	}
	for _, s := range a.watches {
		if s.bookmark {
			kind := map[string]string{"configmaps": "ConfigMap", "secrets": "Secret", "pods": "Pod", "namespaces": "Namespace"}[s.c.res]
			s.event("BOOKMARK", object{"kind": kind, "apiVersion": "v1", "metadata": map[string]any{"resourceVersion": strconv.FormatUint(a.rv, 10)}})
		}
	}
}

// cutWatches ends every open watch at once, cleanly or with a broken
// connection (the seed picks).
func (a *api) cutWatches(broken bool) {
	for _, s := range a.watches {
		if broken {
			s.close(io.ErrUnexpectedEOF, true)
		} else {
			s.close(io.EOF, false)
		}
	}
	a.watches = nil
}
