package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/internal/jsonview"
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

// round is the restart of the pods selected by one ConfigMap for one digest.
type round struct {
	hash     digest
	selector string
	pods     []podRef // the pods that existed when the round began
	done     []bool   // done[i]: pods[i] is handled
	indexed  *indexed // set when the round began from the pod index
}

type podRef struct {
	name, uid string
	version   uint64 // metadata.resourceVersion as listed, 0 if unknown
}

// errNotLeader stops a round when this replica may no longer act.
var errNotLeader = errors.New("not the leader: round stopped")

func (c *Controller) mayAct() bool { return c.cfg.MayAct == nil || c.cfg.MayAct() }

// reconcile brings one ConfigMap's pods in line with its data. An error means
// "retry later"; anything that retrying cannot fix returns nil.
func (c *Controller) reconcile(ctx context.Context, key string) (string, error) {
	c.mu.Lock()
	e := c.entries[key]
	if e == nil || !e.exists {
		c.mu.Unlock()
		return resultGone, nil
	}
	cm, done, adopted, r := e.cm, e.done, e.adopted, e.round
	c.mu.Unlock()
	log := c.log.With("namespace", cm.namespace, "configmap", cm.name)

	if done == cm.hash {
		// Nothing to restart. Write the record if it is missing: after an
		// adoption, or because someone removed it (a controller restart
		// would otherwise adopt a later change instead of acting on it).
		if c.cfg.RecordHash && cm.recorded.isZero() {
			if err := c.record(ctx, cm); err != nil {
				return resultError, err
			}
		}
		if adopted {
			c.finish(key, cm.hash, nil)
			log.Info("adopted configmap", "hash", cm.hash)
			return resultAdopted, nil
		}
		return resultUnchanged, nil
	}

	sel, err := selector.Parse(cm.selector)
	if err != nil {
		// Retrying cannot fix the selector; a new event will bring a fixed
		// one, and the data change is still pending then.
		c.metrics.InvalidSelectors.Inc()
		log.Error("refusing to restart pods: invalid selector", "selector", truncate(cm.selector, 256), "err", err)
		c.event(cm, events.Warning, "InvalidSelector", fmt.Sprintf("Refusing selector %q: %v. No pod was restarted.", truncate(cm.selector, 256), err))
		return resultRefused, nil
	}
	log = log.With("selector", sel.String())

	var intent *intentWrite
	if r == nil || r.hash != cm.hash || r.selector != sel.String() {
		r, intent, err = c.beginRound(ctx, cm, sel, log)
		if err != nil {
			return resultError, err
		}
		c.mu.Lock()
		e.round = r
		c.mu.Unlock()
	}
	err = c.restartAll(ctx, cm.namespace, r, log, intent.begin)
	intent.wait(log)
	if err == nil && r.indexed != nil && !r.indexed.swept {
		err = c.finishSweep(ctx, cm, sel, r, log)
	}
	if err != nil {
		c.roundFailed(cm, err)
		return resultError, err
	}
	if err := c.record(ctx, cm); err != nil {
		c.roundFailed(cm, err)
		return resultError, err
	}
	c.finish(key, cm.hash, r)
	log.Info("pods restarted", "hash", cm.hash, "pods", len(r.pods))
	if c.cfg.DryRun {
		c.event(cm, events.Normal, "DryRun", fmt.Sprintf("Would restart %d pod(s) matching %s for data %s (dry run: nothing changed)", len(r.pods), sel, shortHash(cm.hash)))
	} else {
		c.event(cm, events.Normal, "PodsRestarted", fmt.Sprintf("Restarted %d pod(s) matching %s for data %s", len(r.pods), sel, shortHash(cm.hash)))
	}
	return resultRestarted, nil
}

// beginRound takes the pods a new round restarts: from the pod index when
// there is one (the sweep confirms them later), else from a LIST, and
// prepares the round's intent (nil when resuming one).
func (c *Controller) beginRound(ctx context.Context, cm configMap, sel *selector.Selector, log *slog.Logger) (*round, *intentWrite, error) {
	r := &round{hash: cm.hash, selector: sel.String()}
	var intent *intentWrite
	pods, x, ok := []podRef(nil), (*indexed)(nil), false
	if cm.intent.hash != cm.hash {
		pods, x, ok = c.fromIndex(cm.namespace, sel)
	}
	if !ok {
		var err error
		if pods, err = c.listPods(ctx, cm.namespace, sel); err != nil {
			return nil, nil, fmt.Errorf("list pods: %w", err)
		}
	}
	if cm.intent.hash == cm.hash {
		// A round for this data began before (we were killed, or lost
		// the lease): pods not in it were created since, with the new data.
		pods = slices.DeleteFunc(pods, func(p podRef) bool { return !cm.intent.uids[p.uid] })
		log.Info("resuming an interrupted round", "hash", cm.hash, "pods", len(pods))
	} else {
		intent = c.newIntent(ctx, cm, pods)
	}
	r.pods, r.done, r.indexed = pods, make([]bool, len(pods)), x
	log.Info("data changed; restarting pods", "hash", cm.hash, "pods", len(pods), "from_index", x != nil)
	return r, intent, nil
}

// intentWrite is a round's intent record, written once, as soon as the
// round's first restart request has gone out: concurrently with it, so it
// costs the first deletion no time (on two busy cores even a PATCH sent
// just before the DELETE delays it by 1.5 ms), and before any answer, so a
// controller killed mid-round almost surely leaves it behind.
type intentWrite struct {
	once  sync.Once
	start func() chan error
	done  chan error
}

// newIntent prepares the intent record of a round of pods; nothing is
// written until begin or wait.
func (c *Controller) newIntent(ctx context.Context, cm configMap, pods []podRef) *intentWrite {
	return &intentWrite{start: func() chan error { return c.writeIntent(ctx, cm, pods) }}
}

// begin starts the write; later calls do nothing. Safe on nil.
func (w *intentWrite) begin() {
	if w != nil {
		w.once.Do(func() { w.done = w.start() })
	}
}

// wait starts the write if no request went out, and waits for it.
func (w *intentWrite) wait(log *slog.Logger) {
	if w == nil {
		return
	}
	w.begin()
	if w.done == nil {
		return
	}
	if err := <-w.done; err != nil {
		log.Warn("cannot record the round in progress; a crash now would restart replacement pods again", "err", err)
	}
	w.done = nil
}

// finishSweep sweeps a round that began from the index and restarts the
// pods the index had missed, recording them in the intent first.
func (c *Controller) finishSweep(ctx context.Context, cm configMap, sel *selector.Selector, r *round, log *slog.Logger) error {
	missed, err := c.sweep(ctx, cm.namespace, sel, r, log)
	if err != nil {
		return fmt.Errorf("sweep: list pods: %w", err)
	}
	if len(missed) > 0 {
		log.Info("restarting pods the index had not seen yet", "pods", len(missed))
		r.pods = append(r.pods, missed...)
		r.done = append(r.done, make([]bool, len(missed))...)
		// The intent must name them before they go (the first write has
		// landed: reconcile waited for it).
		c.newIntent(ctx, cm, slices.Clone(r.pods)).wait(log)
		if err := c.restartAll(ctx, cm.namespace, r, log, nil); err != nil {
			return err
		}
	}
	r.indexed.swept = true
	return nil
}

// answerVersion reads metadata.resourceVersion from an API answer.
func answerVersion(body []byte) uint64 {
	if !jsonview.Valid(body) {
		return 0
	}
	v, _ := strconv.ParseUint(jsonview.Parse(body).Get("metadata.resourceVersion").String(), 10, 64)
	return v
}

// event records an Event on cm, if events are on.
func (c *Controller) event(cm configMap, typ, reason, message string) {
	if c.cfg.Events == nil {
		return
	}
	c.cfg.Events.Event(events.Object{APIVersion: "v1", Kind: "ConfigMap", Namespace: cm.namespace, Name: cm.name, UID: cm.uid}, typ, reason, message)
}

// roundFailed reports a failed round, except a stop for losing leadership.
func (c *Controller) roundFailed(cm configMap, err error) {
	if errors.Is(err, errNotLeader) || errors.Is(err, context.Canceled) {
		return
	}
	c.event(cm, events.Warning, "RestartFailed", truncate(err.Error(), 512)+" (will retry)")
}

// shortHash abbreviates a digest for messages.
func shortHash(h digest) string { return truncate(h.String(), len(digestPrefix)+12) }

// finish remembers that the pods now run with hash.
func (c *Controller) finish(key string, hash digest, r *round) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil {
		e.done, e.adopted = hash, false
		if e.round == r {
			e.round = nil
		}
	}
}

// listPods returns the pods the selector matches that are not already
// terminating, except the controller's own.
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
		if !jsonview.Valid(body) {
			return nil, fmt.Errorf("pod list is not valid JSON (%d bytes)", len(body))
		}
		page := jsonview.Parse(body)
		jsonview.Array(page.Get("items")).ForEach(func(_, item gjson.Result) bool {
			meta := item.Get("metadata")
			name, uid := meta.Get("name").String(), meta.Get("uid").String()
			switch {
			case name == "" || uid == "":
				c.log.Warn("skipping pod without name or uid", "namespace", namespace)
			case meta.Get("deletionTimestamp").Exists():
				// Already terminating: deleting again changes nothing.
			case name == c.cfg.OwnPod:
				c.log.Info("not deleting own pod", "namespace", namespace, "pod", name)
			default:
				version, _ := strconv.ParseUint(meta.Get("resourceVersion").String(), 10, 64)
				pods = append(pods, podRef{name: strings.Clone(name), uid: strings.Clone(uid), version: version})
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

// writeIntent records the round's pods on the ConfigMap, concurrently with
// the first deletions so that it costs no reaction time; the round waits for
// it before it ends. Without RECORD_HASH, in a dry run or for a huge round
// there is none.
func (c *Controller) writeIntent(ctx context.Context, cm configMap, pods []podRef) chan error {
	if !c.cfg.RecordHash || c.cfg.DryRun || len(pods) == 0 || len(pods) > maxIntentPods {
		return nil
	}
	done := make(chan error, 1)
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"uid":         cm.uid,
			"annotations": map[string]string{RestartingAnnotation: formatIntent(cm.hash, pods)},
		},
	})
	if err != nil {
		done <- err
		return done
	}
	c.intents.Store(cm.key(), true)
	go func() {
		_, err := c.api.MergePatch(ctx, apiclient.CorePath(cm.namespace, "configmaps", cm.name), patch)
		done <- err
	}()
	return done
}

// wroteIntent reports (and forgets) that this process wrote an intent for cm.
func (c *Controller) wroteIntent(cm configMap) bool {
	_, ok := c.intents.LoadAndDelete(cm.key())
	return ok
}

// record writes cm.hash into RestartedForAnnotation. The patch names the
// uid, so it fails instead of marking a re-created ConfigMap of the same name.
func (c *Controller) record(ctx context.Context, cm configMap) error {
	if !c.cfg.RecordHash || c.cfg.DryRun {
		return nil
	}
	if !c.mayAct() {
		return errNotLeader
	}
	annotations := map[string]any{RestartedForAnnotation: cm.hash}
	if !cm.intent.hash.isZero() || c.wroteIntent(cm) {
		annotations[RestartingAnnotation] = nil // the round is over
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"uid":         cm.uid,
			"annotations": annotations,
		},
	})
	if err != nil {
		return fmt.Errorf("build patch: %w", err)
	}
	_, err = c.api.MergePatch(ctx, apiclient.CorePath(cm.namespace, "configmaps", cm.name), patch)
	switch {
	case err == nil:
		return nil
	case apiclient.IsNotFound(err) || apiclient.IsConflict(err) || apiclient.IsInvalid(err):
		// Deleted or replaced meanwhile; the new object gets its own round.
		c.log.Info("configmap gone or replaced before its record was written", "namespace", cm.namespace, "configmap", cm.name, "err", err)
		return nil
	case apiclient.IsForbidden(err):
		return fmt.Errorf("RBAC: the controller may not patch configmaps in %s (needs verb patch on configmaps, or RECORD_HASH=false): %w", cm.namespace, err)
	default:
		return fmt.Errorf("record hash on configmap %s/%s: %w", cm.namespace, cm.name, err)
	}
}

// truncate bounds user-provided text in logs.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
