package policy

// Consent: which pods the controller may restart at all, whatever a
// selector says (issue 37). Anyone who may edit a ConfigMap of a watched
// namespace chooses a selector; these rules keep that choice from reaching
// pods whose owners never agreed to it: the controller's own replicas
// (OwnPod), pods without the opt-in label (POD_OPT_IN_LABEL, selectorOf),
// and, under WATCH_NAMESPACE=*, namespaces that did not opt in
// (NamespaceConsent).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"sync"

	"github.com/cenkalti/backoff/v4"
	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/selector"
	"github.com/k8spatterns/config-watcher/watch"
)

// OwnPod is the controller's own pod. It and every pod of the same owner
// (the other replicas of its Deployment's ReplicaSet: a standby, or the
// leader seen from a standby) are never restarted: a selector such as
// app.kubernetes.io/name=config-watcher must not take the controller down.
type OwnPod struct {
	Namespace, Name, UID string
	// OwnerUID is the uid of the pod's controller (its ReplicaSet), as the
	// pod's ownerReferences name it; "" for a bare pod or unknown.
	OwnerUID string
}

// Spares reports whether a pod must never be restarted: it is the
// controller's own (by uid, or by name in its namespace when the uid is not
// known), or a sibling (the same owner uid, in its namespace).
func (o OwnPod) Spares(namespace, name, uid, ownerUID string) bool {
	switch {
	case o.UID != "" && uid == o.UID:
		return true
	case o.Namespace != "" && namespace != o.Namespace:
		return false
	case o.OwnerUID != "" && ownerUID == o.OwnerUID:
		return true
	}
	// By name only without a uid to go by (POD_UID unset): a pod of the
	// same name elsewhere is spared too, which errs on the side of doing
	// nothing.
	return o.UID == "" && o.Name != "" && name == o.Name
}

// LearnOwnPod reads the controller's own pod once (a LIST by name: the verb
// the controller has on pods) to learn its owner, so that its siblings are
// spared too. A pod of another uid under that name is an error: POD_UID and
// POD_NAME disagree. What no retry can fix (RBAC, a wrong name or uid) is a
// backoff.Permanent error.
func LearnOwnPod(ctx context.Context, api API, own OwnPod) (OwnPod, error) {
	q := url.Values{"fieldSelector": {"metadata.name=" + own.Name}}
	found, wrongUID := false, ""
	_, err := apiclient.List(ctx, api, apiclient.CorePath(own.Namespace, "pods", ""), q, "application/json", apiclient.ListPageSize, func(raw []byte) {
		meta := gjson.GetBytes(raw, "metadata")
		if meta.Get("name").String() != own.Name {
			return
		}
		found = true
		uid := meta.Get("uid").String()
		if own.UID == "" {
			own.UID = uid
		} else if uid != own.UID {
			wrongUID = uid
		}
		own.OwnerUID = meta.Get(`ownerReferences.#(controller==true).uid`).String()
	})
	switch {
	case apiclient.IsForbidden(err):
		return own, backoff.Permanent(fmt.Errorf("RBAC: the controller may not list pods in its namespace %s (needs verb list on pods) to learn its own pod's owner: %w", own.Namespace, err))
	case err != nil:
		return own, fmt.Errorf("read own pod %s/%s: %w", own.Namespace, own.Name, err)
	case !found:
		return own, backoff.Permanent(fmt.Errorf("own pod %s/%s not found: POD_NAME or POD_NAMESPACE is wrong (both come from the Downward API)", own.Namespace, own.Name))
	case wrongUID != "":
		return own, backoff.Permanent(fmt.Errorf("pod %s/%s has uid %s, not POD_UID %s: POD_NAME or POD_UID is wrong (both come from the Downward API)", own.Namespace, own.Name, wrongUID, own.UID))
	}
	return own, nil
}

// NamespaceConsent is the handler of a watch of the Namespaces that opted in
// (NAMESPACE_SELECTOR, as its labelSelector): under WATCH_NAMESPACE=* the
// controller acts only in them. It matches locally too, so a server that
// ignored the selector still opts no namespace in.
type NamespaceConsent struct {
	sel *selector.Selector
	log *slog.Logger
	// OptedIn and OptedOut, if set, are called (from the watch's goroutine,
	// without the lock) when a namespace joins or leaves after the first
	// list: objects ignored so far must be seen afresh, and those of a
	// namespace that left forgotten.
	OptedIn, OptedOut func(namespace string)

	mu      sync.Mutex
	in      map[string]uint64 // opted-in namespace → list generation last seen
	gen     uint64
	listed  chan struct{} // closed at the end of the first list
	refused map[string]bool
	// streaming: its watch's stream is open, so what it shows is current
	// but for the API's latency. vouched, if set, is called (without the
	// lock) each time a stream opens: what waited for it may go on.
	streaming bool
	vouched   func()
	// joining, if set, is called (without the lock) when a namespace opts
	// in after the first list, before Allows says so: the controller then
	// waits for its objects to be listed again (Controller.relisting).
	joining func(namespace string)
}

var (
	_ watch.Handler  = (*NamespaceConsent)(nil)
	_ watch.Streamer = (*NamespaceConsent)(nil)
)

// NewNamespaceConsent returns the consent of the Namespaces sel matches.
func NewNamespaceConsent(sel *selector.Selector, log *slog.Logger) *NamespaceConsent {
	return &NamespaceConsent{sel: sel, log: log, in: map[string]uint64{}, listed: make(chan struct{}), refused: map[string]bool{}}
}

// Listed is closed once the first list has ended: before that no namespace
// is known to have opted in, and the watches of ConfigMaps wait for it.
func (n *NamespaceConsent) Listed() <-chan struct{} { return n.listed }

// Allows reports whether namespace opted in, as last shown.
func (n *NamespaceConsent) Allows(namespace string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.in[namespace]
	return ok
}

// Vouches reports whether what Allows answers is current: the watch's
// stream is open. While it is cut or relisting, a namespace may have opted
// out unseen.
func (n *NamespaceConsent) Vouches() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.streaming
}

// Streaming implements watch.Streamer.
func (n *NamespaceConsent) Streaming(open bool) {
	n.mu.Lock()
	n.streaming = open
	vouched := n.vouched
	n.mu.Unlock()
	if open && vouched != nil {
		vouched()
	}
}

// onVouched has f called each time the watch's stream opens.
func (n *NamespaceConsent) onVouched(f func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.vouched = f
}

// onJoining has f called when a namespace opts in after the first list,
// before Allows reports it.
func (n *NamespaceConsent) onJoining(f func(namespace string)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.joining = f
}

// firstRefusal reports whether namespace was not refused since it last
// opted in: its log line is written once.
func (n *NamespaceConsent) firstRefusal(namespace string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.refused[namespace] {
		return false
	}
	n.refused[namespace] = true
	return true
}

// BeginList implements watch.Handler.
func (n *NamespaceConsent) BeginList() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gen++
}

// Handle implements watch.Handler.
func (n *NamespaceConsent) Handle(ev watch.Event) {
	meta := gjson.GetBytes(ev.Object, "metadata")
	name := meta.Get("name").String()
	if name == "" {
		n.log.Warn("skipping namespace without a name", "rv", ev.ResourceVersion)
		return
	}
	labels := map[string]string{}
	meta.Get("labels").ForEach(func(k, v gjson.Result) bool {
		labels[k.String()] = v.String()
		return true
	})
	n.set(name, ev.Type != watch.Deleted && n.sel.Matches(labels))
}

// EndList implements watch.Handler: namespaces the list did not show left.
func (n *NamespaceConsent) EndList() {
	n.mu.Lock()
	var left []string
	for ns, gen := range n.in {
		if gen != n.gen {
			left = append(left, ns)
		}
	}
	n.mu.Unlock()
	for _, ns := range left {
		n.set(ns, false)
	}
	select {
	case <-n.listed:
	default:
		close(n.listed)
	}
}

// set records whether namespace opts in now, and says so when that changed
// after the first list.
func (n *NamespaceConsent) set(namespace string, in bool) {
	n.mu.Lock()
	_, was := n.in[namespace]
	if joining := n.joining; in && !was && n.afterFirstList() && joining != nil {
		n.mu.Unlock()
		joining(namespace) // set runs on the watch's goroutine alone: was still holds
		n.mu.Lock()
	}
	if in {
		n.in[namespace] = n.gen
		delete(n.refused, namespace)
	} else {
		delete(n.in, namespace)
	}
	n.mu.Unlock()
	if !n.afterFirstList() {
		return // the first list: nothing was judged yet
	}
	switch {
	case in && !was:
		n.log.Info("namespace opted in", "namespace", namespace)
		if n.OptedIn != nil {
			n.OptedIn(namespace)
		}
	case !in && was:
		n.log.Info("namespace opted out: its ConfigMaps and Secrets are ignored", "namespace", namespace)
		if n.OptedOut != nil {
			n.OptedOut(namespace)
		}
	}
}

// afterFirstList reports whether the first list has ended.
func (n *NamespaceConsent) afterFirstList() bool {
	select {
	case <-n.listed:
		return true
	default:
		return false
	}
}

// optedIn reports whether namespace opted in, as last shown.
func (c *Controller) optedIn(namespace string) bool {
	return c.cfg.Namespaces == nil || c.cfg.Namespaces.Allows(namespace)
}

// errNotVouched: a view that consent or selection is decided on may hide
// a change, for its watch is cut or relisting: the Namespaces' (an
// opt-out), or the object's own (a narrowed selector, a removed
// annotation); or, in a namespace that opted in again, its objects are not
// all listed yet (another's change, whose budget a wave keeps). The pods'
// views need no such check: the index is used only while its watch
// streams, and every restart carries the pod's resourceVersion, which the
// server checks. Nothing is written until the watch streams (or lists)
// again, and what waited is queued again then (vouchedAgain).
var errNotVouched = errors.New("the namespaces' consent, the object's selection or its namespace's other objects are not known now (their watch is down or relisting): waiting for it")

// vouched reports whether the views obj's consent and selection are decided
// on are current: the Namespaces' watch (if any) and obj's own watch
// stream; and, in a namespace that opted in again, whether its objects
// have all been listed since (relisting), so that another's pending change
// counts in the budget. c.mu must be held.
func (c *Controller) vouched(obj object) bool {
	return (c.cfg.Namespaces == nil || c.cfg.Namespaces.Vouches()) && !c.scopeOf(obj.kind, obj.namespace).cut && c.relisting[obj.namespace] == nil
}

// waitForViews has key queued again once the views its object's consent
// and selection are decided on stream (at once if they do already: one
// may have reopened since current asked).
func (c *Controller) waitForViews(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.viewWaits[key] = true
	if e := c.entries[key]; e == nil || c.vouched(e.obj) {
		c.vouchedAgain()
	}
}

// vouchedAgain queues the keys that waited for a view: one streams again,
// and each asks again. c.mu must be held.
func (c *Controller) vouchedAgain() {
	c.queue.AddAll(slices.Collect(maps.Keys(c.viewWaits))) // lock order: c.mu, then the queue's
	clear(c.viewWaits)
}

// consentVouched: the Namespaces' watch streams again.
func (c *Controller) consentVouched() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.vouchedAgain()
}

// ignoreNotOptedIn forgets an object of a namespace that did not opt in,
// and says so once per namespace. Nothing of it is kept: when the namespace
// opts in, the watch lists it again and it is adopted as new. Its event is
// counted as a reconcile with the result not_opted_in.
func (c *Controller) ignoreNotOptedIn(obj object) {
	c.drop(obj.key())
	if c.cfg.Namespaces.firstRefusal(obj.namespace) {
		c.log.Warn("ignoring annotated objects in a namespace that did not opt in (NAMESPACE_SELECTOR)", "namespace", obj.namespace, obj.kind.logKey(), obj.name)
	}
}

// relist is a namespace's wait, after it opted in again, for its objects
// to be listed again: by the lists that began at seq from or later, of
// each watched kind still left.
type relist struct {
	from uint64
	left [2]bool // by kind
}

// namespaceJoining: namespace opts in again (its objects were forgotten,
// and are listed again). Until every watched kind has listed it, a round
// there would decide without another object's change made meanwhile, and
// without its pods' budget (waves.go, otherRounds).
func (c *Controller) namespaceJoining(namespace string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++ // lists that begin from here on show what it holds
	r := &relist{from: c.seq}
	for k := range r.left {
		r.left[k] = c.scopeOf(kind(k), namespace).counted
	}
	if r.left != [2]bool{} {
		c.relisting[namespace] = r
	}
}

// relisted: scope s has listed; a namespace that waited for it to list
// since it opted in again no longer does once every kind has, and what
// waited for it goes on. c.mu must be held.
func (c *Controller) relisted(s *scope) {
	for ns, r := range c.relisting {
		if !s.covers(ns) || s.start < r.from {
			continue
		}
		r.left[s.kind] = false
		if r.left == [2]bool{} {
			delete(c.relisting, ns)
			c.vouchedAgain()
		}
	}
}

// awaitsSecrets reports whether namespace opted in again and its Secrets
// have not been listed since. c.mu must be held.
func (c *Controller) awaitsSecrets(namespace string) bool {
	r := c.relisting[namespace]
	return r != nil && r.left[kindSecret]
}

// ForgetNamespace drops every object of namespace, which opted out: a round
// in flight there finds its entry gone and stops before its next write.
// Its Secrets' states are kept until its Secrets are listed again.
func (c *Controller) ForgetNamespace(namespace string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.relisting, namespace)
	for key, e := range c.entries {
		if e.obj.namespace == namespace {
			c.setExists(e, false)
			delete(c.entries, key)
		}
	}
}
