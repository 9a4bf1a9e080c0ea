package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/selector"
	"github.com/k8spatterns/config-watcher/watch"
)

// Results of a reconcile, as counted in config_watcher_reconciles_total.
const (
	resultRestarted = "restarted"
	resultAdopted   = "adopted"
	resultUnchanged = "unchanged"
	resultRefused   = "refused"
	resultError     = "error"
	resultGone      = "gone"
)

// round is the restart of the pods one ConfigMap selects, for one digest.
type round struct {
	hash     digest
	selector string
	intent   string // the intent it wrote or resumed ("" while none)
	// writing is the intent being written: its event may come before the
	// write's answer, and must not end the round.
	writing string
	pods    []podRef
	state   []podState // state[i] is pods[i]'s, owned by its restart
	indexed *indexed   // set when the round began from the pod index
}

type podRef struct {
	name, uid string
	rv        string // from the pod index: a precondition of the deletion
	version   uint64 // metadata.resourceVersion as listed, 0 if unknown
}

type podState uint8

const (
	podPending   podState = iota
	podRestarted          // or would be, in a dry run
	podGone               // not found
	podRefused            // a precondition failed: replaced, or changed since the index saw it
	podStuck              // a disruption budget kept refusing its eviction
)

var (
	errNotLeader  = errors.New("not the leader: round stopped")
	errSuperseded = errors.New("the configmap changed: round superseded") // the change queued it again
)

func (c *Controller) mayAct() bool { return c.cfg.MayAct == nil || c.cfg.MayAct() }

// reconcile takes one ConfigMap one step along the state model (doc.go).
// An error means "retry later"; what retrying cannot fix returns nil.
func (c *Controller) reconcile(ctx context.Context, key string) (string, error) {
	c.mu.Lock()
	e := c.entries[key]
	if e == nil || !e.exists {
		c.mu.Unlock()
		return resultGone, nil
	}
	step, cm, r, left := e.decide(c.recordsOnServer()), e.cm, e.round, e.i
	c.mu.Unlock()
	log := c.log.With("namespace", cm.namespace, "configmap", cm.name)

	switch step {
	case stepNothing:
		return resultUnchanged, nil
	case stepRecord, stepAdopt:
		err := c.record(ctx, key, cm, nil)
		switch {
		case errors.Is(err, errSuperseded):
			return resultUnchanged, nil
		case err != nil:
			return resultError, err
		case step == stepAdopt:
			log.Info("adopted configmap", "hash", cm.hash)
			return resultAdopted, nil
		}
		return resultUnchanged, nil
	}

	// stepContinue, stepResume or stepRound.
	sel, err := selector.Parse(cm.selector)
	if err != nil {
		// Not retried: the fix comes as an event, and the change is
		// still pending then.
		c.metrics.InvalidSelectors.Inc()
		log.Error("refusing to restart pods: invalid selector", "selector", truncate(cm.selector, 256), "err", err)
		c.event(cm, events.Warning, "InvalidSelector", fmt.Sprintf("Refusing selector %q: %v. No pod was restarted.", truncate(cm.selector, 256), err))
		return resultRefused, nil
	}
	log = log.With("selector", sel.String())
	if r == nil {
		var resume *intent
		if step == stepResume {
			resume = &left
		}
		if r, err = c.beginRound(ctx, key, cm, sel, resume, log); errors.Is(err, errSuperseded) {
			return resultUnchanged, nil
		}
	}
	if err == nil && r.intent == "" && len(r.pods) > 0 {
		// I before the first restart: a round cut short leaves it behind.
		err = c.writeIntent(ctx, key, cm, r.pods)
	}
	if err == nil {
		err = c.restartAll(ctx, key, cm.namespace, r, log)
	}
	if err == nil && r.indexed != nil && !r.indexed.swept {
		err = c.finishSweep(ctx, key, cm, sel, r, log)
	}
	if err == nil {
		err = c.record(ctx, key, cm, r)
	}
	if errors.Is(err, errSuperseded) {
		log.Info("round superseded by a newer change", "hash", cm.hash)
		return resultUnchanged, nil
	}
	if err != nil {
		c.roundFailed(cm, err)
		return resultError, err
	}
	restarted := 0
	for _, st := range r.state {
		if st == podRestarted {
			restarted++
		}
	}
	log.Info("pods restarted", "hash", cm.hash, "pods", restarted)
	if c.cfg.DryRun {
		c.event(cm, events.Normal, "DryRun", fmt.Sprintf("Would restart %d pod(s) matching %s for data %s (dry run: nothing changed)", restarted, sel, cm.hash.short()))
	} else {
		c.event(cm, events.Normal, "PodsRestarted", fmt.Sprintf("Restarted %d pod(s) matching %s for data %s", restarted, sel, cm.hash.short()))
	}
	return resultRestarted, nil
}

// wrote reports whether the intent text is the round's own: written, or
// being written. A removed intent ("") is ours only before we wrote one.
func (r *round) wrote(text string) bool {
	return text == r.intent || (r.writing != "" && text == r.writing)
}

// beginRound takes the round's pods: for a resumed round those its intent
// names; for a new one those the pod index selects, if it can answer now
// (sweep.go), else those a LIST returns. The round is kept from here on, so
// that a retry does not take pods created since: they run the new data.
func (c *Controller) beginRound(ctx context.Context, key string, cm configMap, sel *selector.Selector, resume *intent, log *slog.Logger) (*round, error) {
	r := &round{hash: cm.hash, selector: cm.selector}
	var pods []podRef
	if resume == nil {
		pods, r.indexed = c.fromIndex(cm.namespace, sel)
	}
	if r.indexed == nil {
		var err error
		if pods, err = c.listPods(ctx, cm.namespace, sel); err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
	}
	if resume != nil {
		// The others were created after the round began, with this data.
		pods = slices.DeleteFunc(pods, func(p podRef) bool { return !resume.has(p.uid) })
		r.intent = resume.text
		log.Info("resuming an interrupted round", "hash", cm.hash, "pods", len(pods))
	} else {
		log.Info("data changed; restarting pods", "hash", cm.hash, "pods", len(pods), "from_index", r.indexed != nil)
	}
	r.pods, r.state = pods, make([]podState, len(pods))

	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil || !e.exists || e.cm.hash != cm.hash || e.cm.selector != cm.selector || (resume != nil && e.i.text != r.intent) {
		return nil, errSuperseded
	}
	e.round = r
	return r, nil
}

// writeIntent writes I: a round for cm.hash over pods.
func (c *Controller) writeIntent(ctx context.Context, key string, cm configMap, pods []podRef) error {
	in := newIntent(cm.hash, pods)
	c.mu.Lock()
	if e := c.entries[key]; e != nil && e.round != nil {
		e.round.writing = in.text
	}
	c.mu.Unlock()
	err := c.writeState(ctx, key, cm, RestartingAnnotation, in.text, func(e *entry) {
		e.i = in
		if e.cm.hash != in.hash {
			e.outdated = in.text // the data moved on while we wrote
		}
		if e.round != nil {
			e.round.intent = in.text
		}
	})
	if err != nil {
		return fmt.Errorf("record the round in progress: %w", err)
	}
	return nil
}

// record writes R = cm.hash and removes I, ending round r (nil for an
// adoption) unless r is no longer the current one.
func (c *Controller) record(ctx context.Context, key string, cm configMap, r *round) error {
	c.mu.Lock()
	e := c.entries[key]
	stale := e == nil || !e.exists || e.cm.hash != cm.hash || (r != nil && e.round != r)
	c.mu.Unlock()
	if stale {
		return errSuperseded
	}
	return c.writeState(ctx, key, cm, RestartedForAnnotation, cm.hash.String(), func(e *entry) {
		e.r, e.i, e.adopted = cm.hash, intent{}, false
		if r != nil && e.round == r {
			e.round = nil
		}
	})
}

// writeState patches R (removing I) or I on the ConfigMap, naming its uid
// so that a re-created one of the same name is not marked, then applies
// the write to the entry. Without RECORD_HASH, or in a dry run, the state
// lives in memory only.
func (c *Controller) writeState(ctx context.Context, key string, cm configMap, annotation, value string, apply func(e *entry)) error {
	if !c.mayAct() {
		return errNotLeader
	}
	var written uint64
	if c.recordsOnServer() {
		annotations := map[string]any{annotation: value}
		if annotation == RestartedForAnnotation {
			annotations[RestartingAnnotation] = nil
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": cm.uid, "annotations": annotations}})
		if err != nil {
			return fmt.Errorf("build patch: %w", err)
		}
		answer, err := c.api.MergePatch(ctx, apiclient.CorePath(cm.namespace, "configmaps", cm.name), patch)
		switch {
		case apiclient.IsNotFound(err) || apiclient.IsConflict(err) || apiclient.IsInvalid(err):
			// Deleted or replaced meanwhile: the new object gets its own round.
			return fmt.Errorf("configmap gone or replaced: %w", errSuperseded)
		case apiclient.IsForbidden(err):
			return fmt.Errorf("RBAC: the controller may not patch configmaps in %s (needs verb patch on configmaps, or RECORD_HASH=false): %w", cm.namespace, err)
		case err != nil:
			return fmt.Errorf("write %s on configmap %s/%s: %w", annotation, cm.namespace, cm.name, err)
		}
		written = gjson.GetBytes(answer, "metadata.resourceVersion").Uint()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil {
		e.written = max(e.written, written) // older events show R and I as they were before
		apply(e)
	}
	return nil
}

// listPods returns the selected pods, except terminating ones and the
// controller's own.
func (c *Controller) listPods(ctx context.Context, namespace string, sel *selector.Selector) ([]podRef, error) {
	var pods []podRef
	q := url.Values{"labelSelector": {sel.String()}, "limit": {"500"}}
	path := apiclient.CorePath(namespace, "pods", "")
	for {
		body, err := c.api.Get(ctx, path, q, watch.MetadataListAccept) // names, uids and deletion timestamps, not specs
		if err != nil {
			if apiclient.IsForbidden(err) {
				return nil, fmt.Errorf("RBAC: the controller may not list pods in %s (needs verb list on pods): %w", namespace, err)
			}
			return nil, err
		}
		if !gjson.ValidBytes(body) {
			return nil, fmt.Errorf("pod list is not valid JSON (%d bytes)", len(body))
		}
		page := gjson.ParseBytes(body)
		items := page.Get("items") // null when empty, in a metadata-only list
		if !items.IsArray() {
			items = gjson.Result{}
		}
		items.ForEach(func(_, item gjson.Result) bool {
			meta := item.Get("metadata")
			name, uid := meta.Get("name").String(), meta.Get("uid").String()
			switch {
			case name == "" || uid == "":
				c.log.Warn("skipping pod without name or uid", "namespace", namespace)
			case meta.Get("deletionTimestamp").Exists():
			case name == c.cfg.OwnPod:
				c.log.Info("not deleting own pod", "namespace", namespace, "pod", name)
			default:
				pods = append(pods, podRef{name: name, uid: uid, version: meta.Get("resourceVersion").Uint()})
			}
			return true
		})
		cont := page.Get("metadata.continue").String()
		if cont == "" {
			return pods, nil
		}
		q.Set("continue", cont)
	}
}

func (c *Controller) event(cm configMap, typ, reason, message string) {
	if c.cfg.Events == nil {
		return
	}
	c.cfg.Events.Event(events.Object{APIVersion: "v1", Kind: "ConfigMap", Namespace: cm.namespace, Name: cm.name, UID: cm.uid}, typ, reason, message)
}

// roundFailed reports a failed round, but not a stop for losing the lease
// or for a newer change.
func (c *Controller) roundFailed(cm configMap, err error) {
	if errors.Is(err, errNotLeader) || errors.Is(err, errSuperseded) || errors.Is(err, context.Canceled) {
		return
	}
	c.event(cm, events.Warning, "RestartFailed", truncate(err.Error(), 512)+" (will retry)")
}
