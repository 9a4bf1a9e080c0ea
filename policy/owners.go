package policy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/internal/k8sname"
	"github.com/k8spatterns/config-watcher/internal/truncate"
)

// The budget counts the pods a round's owners want (expected), as
// Kubernetes' disruption controller does: each owner's desired replicas,
// read from its scale subresource. What cannot be read (RBAC, no scale
// subresource) is estimated, never waited for (budget.go); a read that got
// no answer that tells is read again, and no Ready pod goes meanwhile.

// scaleRead is an owner's desired replicas as last read; done is closed
// once they are.
type scaleRead struct {
	done     chan struct{}
	replicas int
	sent, at time.Time // when the read was sent, and answered
	err      error     // why it could not be read; replicas is then unknown
}

// scaleReadEvery bounds how often one owner's scale is read, but for a
// wave that would restart a Ready pod on a read older than its view (wave).
const scaleReadEvery = time.Second

// errNoScale: the owner's kind has no scale subresource (a DaemonSet, a Job).
var errNoScale = errors.New("its kind has no scale subresource")

// errUnanswered: a read of the owner's scale got no answer that tells (none,
// a cut one, a 5xx, a 429): a scale-up it would have shown, its pods not
// created yet, shows in no estimate, so no Ready pod goes on one (as the
// disruption controller allows no disruption while it cannot count); the
// next read, a second later, may tell.
var errUnanswered = errors.New("no answer that tells: read again")

// errNotRead: no read of the owner's scale was asked for (no pod needed
// the budget), it has not been answered, or its caller cut it: nothing
// failed.
var errNotRead = errors.New("not read yet")

// knownScales are the scale subresources of the owners of most pods,
// by apiVersion and kind: no discovery is needed for them.
var knownScales = map[[2]string]string{
	{"apps/v1", "ReplicaSet"}:       "replicasets",
	{"apps/v1", "StatefulSet"}:      "statefulsets",
	{"v1", "ReplicationController"}: "replicationcontrollers",
	{"apps/v1", "DaemonSet"}:        "",
	{"batch/v1", "Job"}:             "",
}

// discovered is what a group-version's discovery document says: the
// resource with a scale subresource of each kind that has one.
type discovered struct {
	scalable map[string]string // kind → resource
	at       time.Time
	err      error
}

// rediscoverAfter: a group-version that did not know a kind, or could not
// be read, is read again after this (a CRD installed since).
const rediscoverAfter = time.Minute

// maxDiscovered bounds the discovery documents kept: the apiVersions of
// the owners of the rounds in progress, which pods' creators write. An
// owner of one more is estimated.
const maxDiscovered = 64

// owners reads the desired replicas of pods' owners for the rounds of every
// namespace, and caches them (per owner uid) and the discovery documents
// (per apiVersion) while a round that asked for them is in progress
// (forget).
type owners struct {
	api API

	mu        sync.Mutex
	scales    map[string]*scaleRead  // owner uid → its last read
	discovery map[string]*discovered // apiVersion → its document
	asked     map[*round]*asked      // what each round asked for
}

// asked is what one round asked owners for: owner uids and apiVersions.
type asked struct{ uids, versions map[string]bool }

func newOwners(api API) *owners {
	return &owners{api: api, scales: map[string]*scaleRead{}, discovery: map[string]*discovered{}, asked: map[*round]*asked{}}
}

// refresh reads, side by side, the scale of each owner in list not read in
// the last scaleReadEvery, or by a request sent before since (if not
// zero), for round r, and waits for those being read.
func (o *owners) refresh(ctx context.Context, r *round, namespace string, list []ownerRef, since time.Time) {
	now := time.Now()
	var reads []*scaleRead
	o.mu.Lock()
	a := o.asked[r]
	if a == nil && len(list) > 0 {
		a = &asked{uids: map[string]bool{}, versions: map[string]bool{}}
		o.asked[r] = a
	}
	for _, owner := range list {
		a.uids[owner.uid], a.versions[owner.apiVersion] = true, true
		s := o.scales[owner.uid]
		if s == nil || (isDone(s.done) && now.Sub(s.at) >= scaleReadEvery) || (s.sent.Before(since) && !errors.Is(s.err, errNoScale)) {
			s = &scaleRead{done: make(chan struct{}), sent: now}
			o.scales[owner.uid] = s
			go func() {
				defer close(s.done)
				replicas, err := o.read(ctx, namespace, owner)
				if err != nil && ctx.Err() != nil {
					err = errNotRead // cut by its caller (stopping, the lead lost): no answer of the owner's
				}
				o.mu.Lock()
				s.replicas, s.err, s.at = replicas, err, time.Now()
				o.mu.Unlock()
			}()
		}
		reads = append(reads, s)
	}
	o.mu.Unlock()
	for _, s := range reads {
		select {
		case <-s.done:
		case <-ctx.Done():
			return
		}
	}
}

func isDone(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// desired returns an owner's desired replicas as last read; err says why
// they are unknown.
func (o *owners) desired(uid string) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.scales[uid]
	switch {
	case s == nil || !isDone(s.done):
		return 0, errNotRead
	case s.err != nil:
		return 0, s.err
	}
	return s.replicas, nil
}

// readSince reports whether the scale of every owner of list that has one
// was last read by a request sent at or after t (a wave's view).
func (o *owners) readSince(list []ownerRef, t time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, owner := range list {
		if s := o.scales[owner.uid]; s == nil || (s.sent.Before(t) && !errors.Is(s.err, errNoScale)) {
			return false
		}
	}
	return true
}

// readAgainAt returns when the first owner of list whose scale was read
// no later than t (a wave's view), or got no answer that tells, may be
// read again; zero if none. What the view shows may follow a change of
// scale the read missed (a scale-down's deletions), and the new scale
// itself comes as no pod event.
func (o *owners) readAgainAt(list []ownerRef, t time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	var first time.Time
	for _, owner := range list {
		s := o.scales[owner.uid]
		if s == nil || !isDone(s.done) || (s.sent.After(t) && !errors.Is(s.err, errUnanswered)) || errors.Is(s.err, errNoScale) {
			continue // read since, or no scale to read
		}
		if at := s.at.Add(scaleReadEvery); first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first
}

// forget drops the scales and discovery documents that no round in
// progress asked for, once a round that asked for some has ended: the
// caches hold what the rounds in progress use, not every ReplicaSet ever
// read (one more at each rollout).
func (o *owners) forget(inProgress func(r *round) bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ended := false
	for r := range o.asked {
		if !inProgress(r) {
			delete(o.asked, r)
			ended = true
		}
	}
	if !ended {
		return
	}
	for uid := range o.scales {
		if !o.isAsked(func(a *asked) bool { return a.uids[uid] }) {
			delete(o.scales, uid)
		}
	}
	for version := range o.discovery {
		if !o.isAsked(func(a *asked) bool { return a.versions[version] }) {
			delete(o.discovery, version)
		}
	}
}

// isAsked: a round in progress asked for what has says. o.mu must be held.
func (o *owners) isAsked(has func(a *asked) bool) bool {
	for _, a := range o.asked {
		if has(a) {
			return true
		}
	}
	return false
}

// read reads owner's desired replicas (spec.replicas of its Scale).
func (o *owners) read(ctx context.Context, namespace string, owner ownerRef) (int, error) {
	resource, err := o.scaleResource(ctx, owner)
	if err != nil {
		return 0, err
	}
	path := apiclient.ObjectPath(owner.apiVersion, namespace, resource, owner.name) + "/scale"
	body, err := o.api.GetBody(ctx, path, nil, "application/json")
	if err != nil {
		return 0, scaleError(owner, resource, err)
	}
	defer body.Close()
	raw, err := readAll(body, maxScaleBytes)
	if err != nil {
		return 0, fmt.Errorf("read the scale of %s %s: %w (%w)", owner.kind, owner.name, err, errUnanswered)
	}
	scale := gjson.ParseBytes(raw)
	replicas := scale.Get("spec.replicas")
	switch {
	case scale.Get("metadata.uid").String() != owner.uid:
		// Another object under the owner's name: the pods' owner is gone.
		return 0, fmt.Errorf("%s %s is another object now (uid %q, the pods name %q)", owner.kind, owner.name, truncate.String(scale.Get("metadata.uid").String(), 64), owner.uid)
	case replicas.Type != gjson.Number || replicas.Int() < 0:
		return 0, fmt.Errorf("the scale of %s %s has no spec.replicas", owner.kind, owner.name)
	}
	return int(replicas.Int()), nil
}

// maxScaleBytes bounds a Scale's answer: a few hundred bytes.
const maxScaleBytes = 64 << 10

// readAll reads r whole, up to limit bytes.
func readAll(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("answer longer than %d bytes", limit)
	}
	return b, err
}

// scaleError says what a failed scale read means and, for a 403, the rule
// that grants it.
func scaleError(owner ownerRef, resource string, err error) error {
	switch {
	case apiclient.IsForbidden(err):
		group, _, _ := strings.Cut(owner.apiVersion, "/")
		if !strings.Contains(owner.apiVersion, "/") {
			group = ""
		}
		return fmt.Errorf("RBAC: may not read the scale of %s %s (needs verb get on %s/scale in API group %q): %w", owner.kind, owner.name, resource, group, err)
	case apiclient.IsNotFound(err):
		return fmt.Errorf("%s %s is gone: %w", owner.kind, owner.name, err)
	case classify(err) == answerRetry || classify(err) == answerBusy:
		return fmt.Errorf("read the scale of %s %s: %w (%w)", owner.kind, owner.name, err, errUnanswered)
	}
	return fmt.Errorf("read the scale of %s %s: %w", owner.kind, owner.name, err)
}

// scaleResource returns the resource whose scale subresource owner's kind
// has: known for the usual owners, else from the discovery document of its
// group-version (readable by every authenticated user).
func (o *owners) scaleResource(ctx context.Context, owner ownerRef) (string, error) {
	if resource, ok := knownScales[[2]string{owner.apiVersion, owner.kind}]; ok {
		if resource == "" {
			return "", errNoScale
		}
		return resource, nil
	}
	if err := checkAPIVersion(owner.apiVersion); err != nil {
		return "", fmt.Errorf("%s %s: %w", owner.kind, owner.name, err)
	}
	o.mu.Lock()
	d := o.discovery[owner.apiVersion]
	full := d == nil && len(o.discovery) >= maxDiscovered
	o.mu.Unlock()
	if full {
		return "", fmt.Errorf("the owners of the rounds in progress have more than %d apiVersions: %s is not read", maxDiscovered, truncate.String(owner.apiVersion, 64))
	}
	if d == nil || ((d.err != nil || d.scalable[owner.kind] == "") && time.Since(d.at) > rediscoverAfter) {
		d = o.discover(ctx, owner.apiVersion)
		o.mu.Lock()
		o.discovery[owner.apiVersion] = d
		o.mu.Unlock()
	}
	switch {
	case d.err != nil:
		return "", d.err
	case d.scalable[owner.kind] == "":
		return "", errNoScale
	}
	return d.scalable[owner.kind], nil
}

// checkAPIVersion refuses an owner's apiVersion that is not a group of DNS
// labels and a version (or a version alone, the core group): it names a
// path on the server, and a discovery document kept.
func checkAPIVersion(apiVersion string) error {
	group, version, grouped := strings.Cut(apiVersion, "/")
	if !grouped {
		group, version = "", group
	}
	if k8sname.Label(version) != nil || (grouped && k8sname.Subdomain(group) != nil) {
		return fmt.Errorf("apiVersion %q is not an API group and version", truncate.String(apiVersion, 64))
	}
	return nil
}

// discover reads the discovery document of apiVersion.
func (o *owners) discover(ctx context.Context, apiVersion string) *discovered {
	d := &discovered{scalable: map[string]string{}, at: time.Now()}
	body, err := o.api.GetBody(ctx, apiclient.DiscoveryPath(apiVersion), nil, "application/json")
	if err != nil {
		d.err = fmt.Errorf("read the API discovery of %s: %w", apiVersion, err)
		return d
	}
	defer body.Close()
	raw, err := readAll(body, maxDiscoveryBytes)
	if err != nil {
		d.err = fmt.Errorf("read the API discovery of %s: %w", apiVersion, err)
		return d
	}
	resources := gjson.GetBytes(raw, "resources")
	subresources := map[string]bool{}
	resources.ForEach(func(_, r gjson.Result) bool {
		subresources[r.Get("name").String()] = true
		return true
	})
	resources.ForEach(func(_, r gjson.Result) bool {
		name := r.Get("name").String()
		if !strings.Contains(name, "/") && subresources[name+"/scale"] {
			d.scalable[strings.Clone(r.Get("kind").String())] = strings.Clone(name)
		}
		return true
	})
	return d
}

// maxDiscoveryBytes bounds a discovery document: the largest built-in one
// is a few tens of KiB.
const maxDiscoveryBytes = 4 << 20
