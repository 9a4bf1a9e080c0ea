package policy

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/watch"
)

// TestRestartWhoseAnswerDidNotTellIsSettledByAView ensures a restart whose
// DELETE was answered in a way that does not tell whether it acted (a 500;
// a 504 after the server deleted) is judged by a view newer than the
// answer, not kept in flight for 2 minutes: at MAX_UNAVAILABLE=1, a pod the
// server did not delete is restarted again at the round's next try; one it
// did delete stays counted unavailable, and no other pod goes while its
// replacement starts.
func TestRestartWhoseAnswerDidNotTellIsSettledByAView(t *testing.T) {
	for _, tt := range []struct {
		name  string
		acted bool // the server deleted webapp-1, and the answer said 504
		want  []string
	}{
		{name: "a 500, nothing deleted: restarted again at once", want: []string{"webapp-1"}},
		{name: "a 504 after the deletion: no second pod goes", acted: true, want: []string{"webapp-1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPI(t, owned("webapp", 4)...) // its server, a socket, outside the bubble
			api.graceful = true
			synctest.Test(t, func(t *testing.T) {
				x := mirror(t, api, api.replacement) // replacements start and never become Ready
				first := firstDeleteOf("webapp-1")
				if tt.acted {
					api.lose = first
				} else {
					api.fault = func(r request) (int, string, bool) {
						if first(r) {
							return http.StatusInternalServerError, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":500,"reason":"InternalError"}`, true
						}
						return 0, "", false
					}
				}
				changeOnIndex(t, api, x, 1, 10*time.Second) // the round's retries; far from 2 minutes
				assert.Equal(t, tt.want, api.removedPods())
			})
		})
	}
}

// TestRestartFoundGoneOnItsRetryStaysUnavailable ensures a restart whose
// first answer did not tell (the server deleted, the answer lost) and whose
// retry is answered 404 keeps counting unavailable while the index, behind,
// still shows the pod Ready: the 404 proves the retry deleted nothing, not
// that the pod is there. 4 pods, 2 may be down: webapp-1 (its deletion not
// shown) and webapp-2 go; webapp-2's replacement becomes Ready, so one more
// may go: webapp-1's retry (404), then webapp-3, and no fourth.
func TestRestartFoundGoneOnItsRetryStaysUnavailable(t *testing.T) {
	api := newFakeAPI(t, owned("webapp", 4)...) // its server, a socket, outside the bubble
	synctest.Test(t, func(t *testing.T) {
		x := mirror(t, api, api.replacement) // replacements start, not Ready
		shown := api.afterDelete
		api.afterDelete = func(p fakePod) {
			if p.name != "webapp-1" {
				shown(p) // webapp-1's deletion never reaches the index
			}
		}
		api.lose = firstDeleteOf("webapp-1")
		changeOnIndex(t, api, x, 2, 5*time.Second) // the round's retries
		assert.Equal(t, []string{"webapp-1", "webapp-2"}, api.removedPods())

		api.mu.Lock()
		r := api.pods["webapp-2r"]
		api.revision++
		r.ready, r.version = true, api.revision
		x.Handle(podEvent(t, watch.Modified, *r))
		api.mu.Unlock()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		assert.Equal(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.removedPods(), "webapp-1 is gone though the index shows it: one more, not two")
	})
}

// firstDeleteOf matches the first DELETE of pod name, and no other request.
func firstDeleteOf(name string) func(request) bool {
	var once sync.Once
	return func(r request) (hit bool) {
		if r.method == http.MethodDelete && strings.HasSuffix(r.path, "/"+name) {
			once.Do(func() { hit = true })
		}
		return hit
	}
}

// changeOnIndex starts, inside a synctest bubble, a controller over the
// index x (MAX_UNAVAILABLE=budget pods, no deadline), shows it a data
// change of the ConfigMap selecting api's pods and lets its round, and
// the round's retries, run for d.
func changeOnIndex(t *testing.T, api *fakeAPI, x *podindex.Index, budget int, d time.Duration) {
	cfg := Config{RecordHash: true, MaxUnavailable: Budget{Pods: budget}, ProgressDeadline: time.Hour}
	cfg.Pods = oneIndex{x: x}
	c, _ := newTestController(t, memAPI{api}, cfg)
	start(t, c)
	handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v2})
	synctest.Wait()
	time.Sleep(d)
	synctest.Wait()
}
