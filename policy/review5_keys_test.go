package policy

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/watch"
)

// TestReviewTurn5MixedPodsNarrowedByTheRecord ensures a new round over pods
// that an interrupted, superseded or halted round left mixed restarts every
// reader of a key whose value on any of its pods differs from the data now.
// The round for {a:2} (R {a:1,b:1}) restarted the readers of a: their
// replacements run a=2 (crash-looping on it, say, so the round halted).
// Then comes the fix: a set back to 1 (alone, or with b changed). Against
// R only b changed, or nothing: the replacement reading a is left on a=2.
func TestReviewTurn5MixedPodsNarrowedByTheRecord(t *testing.T) {
	recorded := map[string]string{"a": "1", "b": "1"}
	interrupted := map[string]string{"a": "2", "b": "1"}
	for _, tt := range []struct {
		name string
		fix  map[string]string
		want []string
	}{
		{"FixRevertsTheKey", map[string]string{"a": "1", "b": "1"}, []string{"reads-a-r", "whole-r"}},
		{"FixChangesAnotherKeyToo", map[string]string{"a": "1", "b": "2"}, []string{"reads-a-r", "reads-b", "whole-r"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := func(name, spec string) *fakePod {
				return &fakePod{name: name, uid: "uid-" + name, labels: map[string]string{"app": name}, spec: spec}
			}
			readsA := pod("reads-a-r", keyRef("configMap", "env", "a")) // created by the round for {a:2}: runs a=2
			readsA.waiting = "CrashLoopBackOff"
			api := newFakeAPI(t, readsA,
				pod("reads-b", keyRef("configMap", "env", "b")), // not restarted by it: runs b=1
				pod("whole-r", specEnvFrom),                     // created by the round for {a:2}
			)
			c, _ := newTestController(t, api.client(), Config{RecordHash: true})
			start(t, c)

			s := referencing(t, "true", recorded, tt.fix)
			s.annotations[RestartedForKeysAnnotation] = keysOf(t, recorded)
			s.intent = hashOf(t, interrupted) + "/uid-reads-a,uid-whole" // the round for {a:2}, not recorded
			handle(t, c, watch.Modified, s)
			settle(t, c)

			assert.Subset(t, api.deletedPods(), tt.want,
				"reads-a-r runs a=2 (the interrupted round's data); the data's a is 1: it must be restarted")
		})
	}
}

// TestReviewTurn5StormRoundRecordsDataItsReplacementsDoNotRun ensures a
// round begun in a storm, which data changes do not supersede, leaves no
// pod on other data than the last: two operators flap the data A → B → A
// while its restarts go out one at a time, so the replacement of its
// second pod is created while the data is B. The round records A, the data
// ends on A, and R = D: that replacement must still be restarted.
func TestReviewTurn5StormRoundRecordsDataItsReplacementsDoNotRun(t *testing.T) {
	web := map[string]string{"app": "webapp"}
	api := newFakeAPI(t, &fakePod{name: "webapp-1", uid: "uid-1", labels: web},
		&fakePod{name: "webapp-2", uid: "uid-2", labels: web}, &fakePod{name: "webapp-3", uid: "uid-3", labels: web})
	api.afterDelete = func(p fakePod) { api.replacement(p) }
	rec := &fakeRecorder{}
	const window = 500 * time.Millisecond
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}, MaxConcurrentRestarts: 1,
		Events: rec, StormChanges: 2, StormWindow: window})
	dataA, dataB := stormData(100), stormData(200)
	change := func(data map[string]string) {
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: data})
	}
	// Standing by, it sees the storm: three changes within the window.
	for _, d := range []map[string]string{stormData(1), stormData(2), stormData(3), dataA} {
		change(d)
	}
	var mu sync.Mutex
	deletes, onB := 0, ""
	api.fault = func(r request) (int, string, bool) {
		mu.Lock()
		defer mu.Unlock()
		if r.method == http.MethodDelete {
			deletes++
			switch deletes {
			case 1:
				change(dataB) // after the first restart: the next replacement runs B
			case 2:
				onB = r.path[strings.LastIndexByte(r.path, '/')+1:] + "r" // created after B was seen, before A was seen again
			case 3:
				change(dataA) // and back, before the third
			}
		}
		return 0, "", false
	}
	start(t, c)

	require.Eventually(t, func() bool { return len(api.recordedHashes()) > 0 }, waitFor, time.Millisecond)
	assert.Equal(t, hashOf(t, dataA), api.recordedHashes()[0], "the storm's round records its data")
	assert.Contains(t, eventText(rec, "ChangeStorm"), "more than 2 times", "the round began in a storm")
	require.Eventually(t, func() bool { return m.ObjectsInStorm.Value() == 0 }, waitFor, time.Millisecond, "the storm ends")
	time.Sleep(window) // any round after the storm
	settle(t, c)

	removed := api.removedPods()
	require.GreaterOrEqual(t, len(removed), 3)
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, removed, onB, "%s was created while the data was B; the data is A: removed %v", onB, removed)
}

// TestReviewTurn5ReplayedStateRestartsOnDemand ensures whoever may write
// ConfigMaps cannot restart a Secret's pods at will: the state ConfigMap's
// MAC authenticates R, but an earlier state of its own (R before the last
// change, with the MAC it carried then, readable by anyone who may read
