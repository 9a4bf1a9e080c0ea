package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"

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
