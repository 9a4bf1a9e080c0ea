package podindex_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/watch"
)

// runningPod returns the recorded Running pod (a Deployment's, Ready, its
// container restarted once) as the LIST item the server sent.
func runningPod(t testing.TB) []byte {
	t.Helper()
	var list wireList
	require.NoError(t, json.Unmarshal([]byte(readFile(t, "pods-running-list.json")), &list))
	require.Len(t, list.Items, 1)
	return list.Items[0]
}

// TestParseRecordedRunningPod ensures the parser reads of a real Running
// pod what rounds decide on: identity, labels, its controller, Ready and
// since when (what encoding/json reads of the recording), the ConfigMaps it
// reads; the index, fed
// the same pod as an ADDED event, shows the same Record.
func TestParseRecordedRunningPod(t *testing.T) {
	raw := runningPod(t)
	var wire struct {
		Metadata struct {
			Name, UID, ResourceVersion string
			Labels                     map[string]string
			OwnerReferences            []struct {
				APIVersion, Kind, Name, UID string
				Controller                  bool
			}
		}
		Spec   struct{ NodeName string }
		Status struct {
			Phase      string
			Conditions []struct{ Type, Status, LastTransitionTime string }
		}
	}
	require.NoError(t, json.Unmarshal(raw, &wire))
	m := wire.Metadata
	require.Equal(t, "Running", wire.Status.Phase)
	require.Len(t, m.OwnerReferences, 1)
	require.True(t, m.OwnerReferences[0].Controller)
	o := m.OwnerReferences[0]
	want := podindex.Record{Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion, Labels: m.Labels,
		Owner: podindex.Owner{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, UID: o.UID}, Node: wire.Spec.NodeName}
	for _, c := range wire.Status.Conditions {
		if c.Type == "Ready" {
			since, err := time.Parse(time.RFC3339, c.LastTransitionTime)
			require.NoError(t, err)
			want.Ready, want.Since = c.Status == "True", since
		}
	}
	require.True(t, want.Ready, "the recording is of a Ready pod")
	// Its projected service account volume reads one key of the root CA's ConfigMap.
	want.Refs = podindex.MakeRefs([]podindex.Ref{{Kind: podindex.RefConfigMap, Name: "kube-root-ca.crt", Keys: []string{"ca.crt"}}})
	assert.Equal(t, "ReplicaSet", want.Owner.Kind)

	got, ok := podindex.Parse(raw)
	require.True(t, ok)
	assert.Equal(t, want, got)

	x := podindex.New(discard)
	relist(x)
	ev := watch.Event{Type: watch.Added, Object: raw, ResourceVersion: "246"}
	x.Handle(ev)
	clear(raw) // the index keeps nothing of the event's buffer
	view, ok := x.View("default")
	require.True(t, ok)
	require.Len(t, view, 1)
	assert.Equal(t, want, view[0])
}

// TestNodeIsTheOneThePodIsBoundTo ensures the parser and the index read a
// pod's node from spec.nodeName: none before the pod is bound, that node
// after, kept through status updates (the budget tells a DaemonSet's
// replacement by it).
func TestNodeIsTheOneThePodIsBoundTo(t *testing.T) {
	pod := func(rv, spec string) []byte {
		return []byte(`{"metadata":{"name":"a","namespace":"ns","uid":"u","resourceVersion":"` + rv + `"},"spec":` + spec + `}`)
	}
	x := podindex.New(discard)
	relist(x)
	x.Handle(watch.Event{Type: watch.Added, Object: pod("5", `{}`), ResourceVersion: "5"})
	view, ok := x.View("ns")
	require.True(t, ok)
	require.Len(t, view, 1)
	assert.Empty(t, view[0].Node, "not bound yet")

	x.Handle(watch.Event{Type: watch.Modified, Object: pod("6", `{"nodeName":"n1"}`), ResourceVersion: "6"})
	x.Handle(watch.Event{Type: watch.Modified, Object: pod("7", `{"nodeName":"n1"}`), ResourceVersion: "7"})
	view, _ = x.View("ns")
	assert.Equal(t, "n1", view[0].Node)
	got, ok := podindex.Parse(pod("7", `{"nodeName":"n1"}`))
	require.True(t, ok)
	assert.Equal(t, "n1", got.Node)
}

// TestParseNotReadyReasons ensures a pod that is not Ready says why, and is
// broken only for the states it does not leave by itself.
func TestParseNotReadyReasons(t *testing.T) {
	for _, tc := range []struct {
		name, status, why string
		broken            bool
	}{
		{"CrashLoop", `{"phase":"Running","conditions":[{"type":"Ready","status":"False"}],"containerStatuses":[{"name":"app","ready":false,"state":{"waiting":{"reason":"CrashLoopBackOff"}}}]}`, "CrashLoopBackOff in container app", true},
		{"Terminated", `{"phase":"Running","containerStatuses":[{"name":"app","ready":false,"state":{"terminated":{"reason":"OOMKilled"}}}]}`, "OOMKilled in container app", false},
		{"Unschedulable", `{"phase":"Pending","conditions":[{"type":"PodScheduled","status":"False","reason":"Unschedulable"}]}`, "not scheduled: Unschedulable", true},
		{"Pending", `{"phase":"Pending"}`, "phase Pending", false},
		{"NoStatus", `{}`, "no Ready condition", false},
		{"LongReasonBounded", `{"containerStatuses":[{"name":"app","state":{"waiting":{"reason":"` + strings.Repeat("x", 300) + `"}}}]}`, strings.Repeat("x", 128) + "… in container app", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := podindex.Parse([]byte(`{"metadata":{"name":"a","uid":"u","resourceVersion":"5"},"status":` + tc.status + `}`))
			require.True(t, ok)
			assert.False(t, r.Ready)
			assert.Equal(t, tc.why, r.Reason)
			assert.Equal(t, tc.broken, r.Broken)
		})
	}
}

// TestCaughtUp ensures the index is caught up to a revision once a watch
// event, a bookmark or a list has shown it, and never during a relist.
func TestCaughtUp(t *testing.T) {
	ctx := context.Background()
	x := podindex.New(discard)
	assert.False(t, x.CaughtUp(ctx, 1, 0), "before the first list")
	relist(x, webapp("a", "5"))
	x.Progress("10") // the list's revision
	assert.True(t, x.CaughtUp(ctx, 10, 0))
	assert.False(t, x.CaughtUp(ctx, 11, 0))

	x.Handle(event(watch.Modified, webapp("a", "12")))
	assert.True(t, x.CaughtUp(ctx, 12, 0), "a watch event")
	x.Progress("20") // a bookmark
	assert.True(t, x.CaughtUp(ctx, 20, 0), "a bookmark")
	x.Progress("opaque")
	assert.True(t, x.CaughtUp(ctx, 20, 0), "a revision that is not a number changes nothing")

	x.Handle(event(watch.Synced, webapp("b", "90")))
	assert.False(t, x.CaughtUp(ctx, 90, 0), "a list item tells nothing of the stream")

	done := make(chan bool)
	go func() { done <- x.CaughtUp(ctx, 30, waitLimit) }()
	x.Handle(event(watch.Added, webapp("c", "30")))
	assert.True(t, <-done, "waits for the watch to get there")

	x.BeginList()
	assert.False(t, x.CaughtUp(ctx, 20, 0), "during a relist")
}

// TestOnChangeTellsReadinessChanges ensures the index tells of the changes
// a waiting round decides on (readiness, termination, labels, deletion),
// and not of status updates that change none of them.
func TestOnChangeTellsReadinessChanges(t *testing.T) {
	var mu sync.Mutex
	var heard []string
	x := podindex.New(discard)
	x.OnChange(func(namespace string, labels map[string]string) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, namespace+":"+labels["app"])
	})
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := heard
		heard = nil
		return out
	}
	ready := func(p pod, rv string, r bool) watch.Event {
		obj := map[string]any{}
		require.NoError(t, json.Unmarshal(p.json(), &obj))
		obj["metadata"].(map[string]any)["resourceVersion"] = rv
		status := "False"
		if r {
			status = "True"
		}
		obj["status"] = map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": status}}}
		raw, err := json.Marshal(obj)
		require.NoError(t, err)
		return watch.Event{Type: watch.Modified, Object: raw, ResourceVersion: rv}
	}
	a := webapp("a", "5")
	relist(x, a)
	assert.Equal(t, []string{"default:"}, take(), "a relist: any pod of the namespace")

	x.Handle(ready(a, "6", false))
	assert.Empty(t, take(), "a status update that leaves readiness alone")
	x.Handle(ready(a, "7", true))
	assert.Equal(t, []string{"default:webapp"}, take(), "Ready")
	x.Handle(ready(a, "8", true))
	assert.Empty(t, take())

	relabelled := a
	relabelled.labels = map[string]string{"app": "other"}
	x.Handle(ready(relabelled, "9", true))
	assert.Equal(t, []string{"default:webapp", "default:other"}, take(), "the rounds of the old labels and of the new")

	x.Handle(event(watch.Deleted, relabelled))
	assert.Equal(t, []string{"default:other"}, take(), "deleted")
	x.Handle(event(watch.Added, webapp("b", "11")))
	assert.Empty(t, take(), "a new pod that is not Ready changes no budget")
}

// TestGetWaitsForAnotherRevision ensures Get answers a pod once the index
// shows it at a revision other than the one a restart was refused for, or
// gone, and says so when it does not in time.
func TestGetWaitsForAnotherRevision(t *testing.T) {
	ctx := context.Background()
	x := podindex.New(discard)
	relist(x, webapp("a", "5"))

	_, _, known := x.Get(ctx, ns, "uid-a", "5", 0)
	assert.False(t, known, "still at the refused revision")

	done := make(chan podindex.Record)
	go func() {
		r, exists, known := x.Get(ctx, ns, "uid-a", "5", waitLimit)
		assert.True(t, exists && known)
		done <- r
	}()
	x.Handle(event(watch.Modified, webapp("a", "6")))
	assert.Equal(t, "6", (<-done).ResourceVersion)

	x.Handle(event(watch.Deleted, webapp("a", "7")))
	_, exists, known := x.Get(ctx, ns, "uid-a", "6", 0)
	assert.True(t, known)
	assert.False(t, exists, "gone")

	x.BeginList()
	_, _, known = x.Get(ctx, ns, "uid-a", "6", 0)
	assert.False(t, known, "nothing is known during a relist")
}
