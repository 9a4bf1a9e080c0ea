package policy

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/k8spatterns/config-watcher/watch"
)

// The annotations the previous version (e43de1c, before issue 47's fourth
// pass) wrote on a ConfigMap whose key a went from 1 to 2, b staying 1,
// copied as that code wrote them rather than made by today's writers, so
// that a change of what this version reads shows here. The intent names
// the one pod left when the round was cut short.
const (
	previousRecord     = "sha256:910634866aac71f900bf94a1fca6f505d1cb1215c9c56a290c8ee00895fb24ca" // {a:1, b:1}
	previousRecordKeys = "sha256:a=5e982e508c12e363,b=87b8849f5ab1a5c7"
	previousIntent     = "sha256:4d98eabadecc997018fcbc6b9337fdba622e73e9aa47c14f5048b0266eb4b8b9/uid-reads-a" // {a:2, b:1}
)

// TestPreviousVersionsStateIsResumedAsItWroteIt ensures the record, key
// digests and intent the previous version wrote are read by this one with no
// restart and no loss: its record of the current data restarts nothing; its
// intent for the current data restarts only the pod it names (the reader of
// the whole object was replaced before the upgrade), and the round is then
// recorded.
func TestPreviousVersionsStateIsResumedAsItWroteIt(t *testing.T) {
	for _, tt := range []struct {
		name    string
		data    map[string]string
		intent  string
		want    []string
		records []string
	}{
		{"Recorded", map[string]string{"a": "1", "b": "1"}, "", nil, nil},
		{"RoundCutShort", map[string]string{"a": "2", "b": "1"}, previousIntent, []string{"reads-a"},
			[]string{"sha256:4d98eabadecc997018fcbc6b9337fdba622e73e9aa47c14f5048b0266eb4b8b9"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api, c := keyController(t)
			handle(t, c, watch.Modified, cmSpec{
				annotations: map[string]string{RestartReferencingAnnotation: "true", RestartedForKeysAnnotation: previousRecordKeys},
				data:        tt.data,
				recorded:    previousRecord,
				intent:      tt.intent,
			})
			settle(t, c)
			assert.ElementsMatch(t, tt.want, api.deletedPods())
			assert.Equal(t, tt.records, api.recordedHashes())
		})
	}
}
