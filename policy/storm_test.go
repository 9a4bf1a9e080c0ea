package policy

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/watch"
)

// stormTest is a controller with the storm guard over two bare pods that
// their "ReplicaSet" replaces when deleted, and a ConfigMap whose data
// change n sets.
type stormTest struct {
	api *fakeAPI
	c   *Controller
	m   *Metrics
	rec *fakeRecorder
}

func newStormTest(t *testing.T, changes int, window time.Duration) *stormTest {
	web := map[string]string{"app": "webapp"}
	api := newFakeAPI(t, &fakePod{name: "webapp-1", uid: "uid-1", labels: web}, &fakePod{name: "webapp-2", uid: "uid-2", labels: web})
	api.afterDelete = func(p fakePod) { api.replacement(p) }
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}, Events: rec, StormChanges: changes, StormWindow: window})
	start(t, c)
	handle(t, c, watch.Added, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: v1})
	settle(t, c)
	return &stormTest{api: api, c: c, m: m, rec: rec}
}

func stormData(n int) map[string]string {
	return map[string]string{"message": "change " + strconv.Itoa(n)}
}

func (s *stormTest) change(t *testing.T, n int) {
	handle(t, s.c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: stormData(n)})
}

func (s *stormTest) count(reason string) int { return countEvents(s.rec, reason) }

// TestStormRestartsAtMostOncePerWindow ensures an object whose data changes
// more than STORM_CHANGES times within STORM_WINDOW says so once (a
// ChangeStorm Event, the gauge), has its pods restarted at most once per
// window while the storm lasts, and, once its data has been quiet for the
// window, says so (ChangeStormEnded, the gauge back to 0) and brings every
// pod to the last data.
func TestStormRestartsAtMostOncePerWindow(t *testing.T) {
	const window = 300 * time.Millisecond
	s := newStormTest(t, 3, window)

	const changes = 40
	began := time.Now()
	tick := time.NewTicker(window / 10) // the storm: a change every 30 ms
	defer tick.Stop()
	for n := 1; n <= changes; n++ {
		s.change(t, n)
		if n == 5 {
			require.Eventually(t, func() bool { return s.m.ObjectsInStorm.Value() == 1 }, waitFor, time.Millisecond, "in a storm")
		}
		<-tick.C
	}
	stormFor := time.Since(began)

	last := hashOf(t, stormData(changes))
	require.Eventually(t, func() bool { return s.count("ChangeStormEnded") == 1 }, waitFor, time.Millisecond)
	require.Eventually(t, func() bool {
		rs := s.api.recordedHashes()
		return len(rs) > 0 && rs[len(rs)-1] == last
	}, waitFor, time.Millisecond, "every pod brought to the last data")
	settle(t, s.c)

	assert.Equal(t, 1, s.count("ChangeStorm"), "one storm, said once")
	assert.Zero(t, s.m.ObjectsInStorm.Value())
	// Rounds: the first STORM_CHANGES changes' (before the storm), one per
	// window begun while it lasted, and the last one after it.
	windows := int(stormFor/window) + 1
	most := 2 * (3 + windows + 1)
	deleted := len(s.api.removedPods())
	assert.LessOrEqual(t, deleted, most, "pod deletions for %d changes over %s", changes, stormFor)
	assert.Less(t, deleted, 2*changes/2, "far fewer than a round per change")
}

// TestStormThatNeverEndsBringsPodsToEachWindowsData ensures a round begun
// in a storm is not superseded by the storm's next change: while the data
// never stops changing, rounds still finish and record, each for the data
// of the moment it began, so the pods reach it.
func TestStormThatNeverEndsBringsPodsToEachWindowsData(t *testing.T) {
	const window = 200 * time.Millisecond
	s := newStormTest(t, 3, window)
	s.c.cfg.MaxConcurrentRestarts = 1
	s.api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete {
			time.Sleep(30 * time.Millisecond) // a slow server: a round outlasts several changes
		}
		return 0, "", false
	}
	hashes := map[string]int{}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	recordedInStorm := func() int {
		n := 0
		for _, h := range s.api.recordedHashes() {
			if i, ok := hashes[h]; ok && i > 3 {
				n++
			}
		}
		return n
	}
	for n := 1; recordedInStorm() < 3; n++ {
		require.Less(t, n, 3000, "no round finished in the storm") // 30 s
		hashes[hashOf(t, stormData(n))] = n
		s.change(t, n)
		<-tick.C
	}
	assert.Equal(t, 1, s.count("ChangeStorm"))
	assert.Zero(t, s.count("ChangeStormEnded"), "the storm goes on")
	assert.Equal(t, float64(1), s.m.ObjectsInStorm.Value())
}

// TestStormGuardOffRestartsForEveryChange ensures STORM_CHANGES=0 keeps the
// behaviour without a guard: no Event, no gauge.
func TestStormGuardOffRestartsForEveryChange(t *testing.T) {
	s := newStormTest(t, 0, time.Minute)
	for n := 1; n <= 6; n++ {
		s.change(t, n)
		require.Eventually(t, func() bool {
			rs := s.api.recordedHashes()
			return len(rs) > 0 && rs[len(rs)-1] == hashOf(t, stormData(n))
		}, waitFor, time.Millisecond)
	}
	assert.Zero(t, s.count("ChangeStorm"))
	assert.Len(t, s.api.removedPods(), 12, "each change restarts both pods")
}

// TestRestartTokensBurstThenWait ensures MAX_RESTARTS_PER_SECOND's bucket
// gives its burst at once, then makes the next restart wait for a token (here
// cut short by its context, as a shutdown does), and that a token comes
// back at the rate.
func TestRestartTokensBurstThenWait(t *testing.T) {
	b := newTokenBucket(1, 3)
	for range 3 {
		require.NoError(t, b.waitFor(context.Background(), b.reserve()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, b.waitFor(ctx, b.reserve()), context.DeadlineExceeded, "the fourth within a second waits")

	fast := newTokenBucket(1000, 1)
	require.NoError(t, fast.waitFor(context.Background(), fast.reserve()))
	require.NoError(t, fast.waitFor(context.Background(), fast.reserve()), "a token comes back at the rate")
}

// TestRestartTokensGoInTheOrderReserved ensures restarts waiting on an
// empty bucket get its tokens one interval apart, in the order they asked,
// so that no two of them wake together to race for one.
func TestRestartTokensGoInTheOrderReserved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTokenBucket(2, 1)
		start := time.Now()
		var due []time.Duration
		for range 4 {
			due = append(due, b.reserve().Sub(start))
		}
		assert.Equal(t, []time.Duration{0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond}, due)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.ErrorIs(t, b.waitFor(ctx, b.reserve()), context.Canceled, "a fifth, at 2 s, given up")
		assert.Equal(t, 2*time.Second, b.reserve().Sub(start), "a token given back is reserved again")
	})
}

// TestPacedRoundGivesItsWorkerBack ensures a round whose restarts wait for
// tokens of MAX_RESTARTS_PER_SECOND holds its worker for one token's wait
// at most: with one worker, another object's change is acted on while the
// first round still has pods to restart, not once its last token came.
func TestPacedRoundGivesItsWorkerBack(t *testing.T) {
	api := newFakeAPI(t, append(owned("a", 15), owned("b", 1)...)...) // its server, a socket, outside the bubble
	var order []string
	api.afterDelete = func(p fakePod) { order = append(order, p.name) }
	synctest.Test(t, func(t *testing.T) {
		c, _ := newTestController(t, memAPI{api}, Config{RecordHash: true, Workers: 1, MaxUnavailable: Budget{Percent: 100}, MaxRestartsPerSecond: 1})
		start(t, c)
		handle(t, c, watch.Modified, cmSpec{name: "cm-a", uid: "uid-cm-a", selector: ptr("app=a"), recorded: hashOf(t, v1), data: v2})
		synctest.Wait() // the burst of 10 is sent; the other 5 wait a second each
		handle(t, c, watch.Modified, cmSpec{name: "cm-b", uid: "uid-cm-b", selector: ptr("app=b"), recorded: hashOf(t, v1), data: v2})
		time.Sleep(time.Minute)
		synctest.Wait()
		api.mu.Lock()
		defer api.mu.Unlock()
		require.Len(t, order, 16)
		assert.Less(t, slices.Index(order, "b-1"), 15, "cm-b's pod waited for every token of cm-a's round: %v", order)
	})
}

// TestStormChangesKeptAreBounded ensures an entry keeps at most
// STORM_CHANGES+1 change times, however many changes it sees.
func TestStormChangesKeptAreBounded(t *testing.T) {
	c, _ := newTestController(t, newFakeAPI(t).client(), Config{StormChanges: 5, StormWindow: time.Minute})
	e := &entry{}
	now := time.Now()
	for i := range 1000 {
		c.noteChange(e, now.Add(time.Duration(i)))
	}
	assert.Len(t, e.changes, 6)
	assert.True(t, slices.IsSortedFunc(e.changes, func(a, b time.Time) int { return a.Compare(b) }))
}

// TestStormGaugeIsZeroOnAStandby ensures a replica that stops leading
// reports no object in a storm, and a standby that sees the changes judges
// none: only the leader's worker does.
func TestStormGaugeIsZeroOnAStandby(t *testing.T) {
	web := map[string]string{"app": "webapp"}
	api := newFakeAPI(t, &fakePod{name: "webapp-1", uid: "uid-1", labels: web})
	rec := &fakeRecorder{}
	c, m := newTestController(t, api.client(), Config{RecordHash: true, Events: rec, StormChanges: 2, StormWindow: time.Minute})
	change := func(n int) {
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: stormData(n)})
	}
	for n := 1; n <= 4; n++ { // standing by: no worker runs
		change(n)
	}
	assert.Zero(t, m.ObjectsInStorm.Value(), "a standby judges no storm")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		c.Lead(ctx, func() time.Duration { return 0 })
		close(done)
	}()
	require.Eventually(t, func() bool { return m.ObjectsInStorm.Value() == 1 }, waitFor, time.Millisecond, "the leader judges the changes it was shown")
	cancel()
	<-done
	assert.Zero(t, m.ObjectsInStorm.Value(), "0 once it stands by again")
	assert.Equal(t, 1, func() int {
		n := 0
		for _, e := range rec.all() {
			if e.reason == "ChangeStorm" {
				n++
			}
		}
		return n
	}())
}

// TestRoundAfterAFlapRestartsEachPodOnce ensures a round whose intent reads
// as one seen outdated before (the same data over the same pods: a round
// for it superseded before its first restart, the data changed and set
// back) is not taken for one that saw the data change while it ran: it
// records, leaving no intent, and no pod is restarted twice.
func TestRoundAfterAFlapRestartsEachPodOnce(t *testing.T) {
	api := newFakeAPI(t, webPods()...)
	api.afterDelete = func(p fakePod) { api.replacement(p) }
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}})
	start(t, c)
	change := func(data map[string]string) {
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: data})
	}
	var patches atomic.Int32
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodPatch {
			switch patches.Add(1) {
			case 1:
				change(v3) // while the intent for v2 is written: the round is superseded, and undoes it
			case 2:
				change(v2) // while the undo is written: back to the intent's data, before any round for v3
			}
		}
		return 0, "", false
	}
	change(v2)
	settle(t, c)

	assert.Equal(t, []string{hashOf(t, v2)}, api.recordedHashes(), "one round, recorded once")
	intents := api.intents()
	require.NotEmpty(t, intents)
	assert.Empty(t, intents[len(intents)-1], "the record leaves no intent: intents %v", intents)
	assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.removedPods(), "each pod restarted once")
}

// TestMixedIntentRestartsEveryPodOnce ensures the intent a round leaves
// when the data changed while it ran restarts every selected pod once,
// though R = D, for a controller that takes over as for this one (on a
// ConfigMap, and in a Secret's state under its MAC); and the round that
// does records and removes it.
func TestMixedIntentRestartsEveryPodOnce(t *testing.T) {
	for _, kind := range []string{"ConfigMap", "Secret"} {
		t.Run(kind, func(t *testing.T) {
			api := newFakeAPI(t, webPods()...)
			api.afterDelete = func(p fakePod) { api.replacement(p) }
			cfg := Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}}
			want := hashOf(t, v2)
			if kind == "ConfigMap" {
				c, _ := newTestController(t, api.client(), cfg)
				start(t, c)
				handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: want, intent: mixedIntent.text, data: v2})
				settle(t, c)
			} else {
				c := secretController(t, api, cfg, []cmSpec{stateSpec("webapp-secret", keyID(testKey), secretHashOf(t, s1), mixedIntent.text)},
					[]secretSpec{{selector: ptr("app=webapp"), data: s1}})
				settle(t, c)
			}

			assert.ElementsMatch(t, []string{"webapp-1", "webapp-2", "webapp-3"}, api.removedPods())
			if kind == "ConfigMap" { // a Secret's state shows what a write changed: R did not
				assert.Equal(t, []string{want}, api.recordedHashes())
			}
			intents := api.intents()
			require.NotEmpty(t, intents)
			assert.Empty(t, intents[len(intents)-1])
		})
	}
}

// TestTokenWaitNeverRoundsToNothing ensures a bucket a hair short of a
// token waits at least a nanosecond: a wait rounded down to zero spins
// without letting time pass, for ever on a clock that moves only while
// everything waits (the simulator found it).
func TestTokenWaitNeverRoundsToNothing(t *testing.T) {
	assert.Equal(t, time.Nanosecond, untilToken(1-1e-15, 5))
	assert.Equal(t, 200*time.Millisecond, untilToken(0, 5))
}

// TestStormRoundGivesWayToTheLastData ensures a round begun in a storm for
// data its pods crash on (their replacements crash-loop) does not hold on
// to that data for good once a fix came: once the storm ends, or once the
// round halts while the storm lasts, the last data supersedes it, and every
// pod ends on the last data, recorded (the simulator's seeds 16 and 57).
func TestStormRoundGivesWayToTheLastData(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration // PROGRESS_DEADLINE
		stormFor time.Duration // good changes every 5 s after the fix, up to this
		inStorm  time.Duration // when, the storm still on, no pod may run the bad data
	}{
		{name: "the storm ends", deadline: time.Hour},
		{name: "halted while the storm lasts", deadline: 30 * time.Second, stormFor: time.Minute, inStorm: 50 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI(t, owned("web", 2)...) // its server, a socket, outside the bubble
			synctest.Test(t, func(t *testing.T) {
				// The data each live pod started on; a replacement started
				// on the bad data crash-loops. Both under api.mu.
				data := "v1"
				started := map[string]string{"web-1": data, "web-2": data}
				api.afterDelete = func(p fakePod) {
					delete(started, p.name)
					n := api.pods[api.addPodLocked(p.name+"r", p.labels).name]
					n.owner, n.readySince = p.owner, time.Now()
					if data == "bad" {
						n.waiting = "CrashLoopBackOff"
					} else {
						n.ready = true
					}
					started[n.name] = data
				}
				rec := &fakeRecorder{}
				c, _ := newTestController(t, memAPI{api}, Config{RecordHash: true, MaxUnavailable: Budget{Pods: 1}, Events: rec,
					StormChanges: 2, StormWindow: 10 * time.Second, ProgressDeadline: tc.deadline})
				c.wavePoll = time.Second
				start(t, c)
				change := func(d string) {
					api.mu.Lock()
					data = d
					api.mu.Unlock()
					// The object as the server shows it: the controller's
					// writes of R, I and the halt, and the data.
					ann := map[string]string{}
					for _, w := range api.patchedAnnotations() {
						for k, v := range w {
							if v == nil {
								delete(ann, k)
							} else {
								ann[k] = *v
							}
						}
					}
					handle(t, c, watch.Modified, cmSpec{selector: ptr("app=web"), annotations: ann, data: map[string]string{"k": d}})
					synctest.Wait()
				}
				onBad := func() []string {
					api.mu.Lock()
					defer api.mu.Unlock()
					var pods []string
					for name, d := range started {
						if d == "bad" {
							pods = append(pods, name)
						}
					}
					return pods
				}
				began := time.Now()
				handle(t, c, watch.Added, cmSpec{selector: ptr("app=web"), recorded: hashOf(t, map[string]string{"k": "v1"}), data: map[string]string{"k": "v1"}})
				time.Sleep(time.Second)
				for _, d := range []string{"v2", "v3", "bad"} { // the third change in 2 s: a storm
					change(d)
					time.Sleep(time.Second)
				}
				require.Equal(t, 1, countEvents(rec, "ChangeStorm"))
				require.Len(t, onBad(), 1, "the storm's round restarted one pod on the bad data, and its replacement crash-loops")
				last := "fix"
				change(last)
				for n, checked := 1, false; time.Since(began) < tc.stormFor; n++ {
					time.Sleep(5 * time.Second)
					last = "fix" + strconv.Itoa(n)
					change(last)
					if tc.inStorm > 0 && !checked && time.Since(began) >= tc.inStorm {
						require.Zero(t, countEvents(rec, "ChangeStormEnded"), "the storm goes on")
						assert.Empty(t, onBad(), "pods crash-looping on the bad data at %s, the fix at 4s", time.Since(began))
						checked = true
					}
				}
				time.Sleep(3 * time.Minute)
				synctest.Wait()

				assert.Equal(t, 1, countEvents(rec, "ChangeStormEnded"))
				api.mu.Lock()
				byPod := map[string]string{} // by the pod its replacements replace
				for name, d := range started {
					byPod[strings.TrimRight(name, "r")] = d
				}
				api.mu.Unlock()
				assert.Equal(t, map[string]string{"web-1": last, "web-2": last}, byPod, "every pod on the last data")
				rs := api.recordedHashes()
				require.NotEmpty(t, rs)
				assert.Equal(t, hashOf(t, map[string]string{"k": last}), rs[len(rs)-1], "the last data recorded")
			})
		})
	}
}

// countEvents counts the Events of reason rec holds.
func countEvents(rec *fakeRecorder, reason string) int {
	n := 0
	for _, e := range rec.all() {
		if e.reason == reason {
			n++
		}
	}
	return n
}

// TestObjectCreatedAgainInAStormKeepsItsRecordForASuccessor ensures a
// ConfigMap deleted and created again with other data while a storm holds
// its round back has the record its pods run (the tombstone's) written on
// the new object: a controller killed before the round began leaves it, and
// its successor, which never saw the tombstone, restarts the pods for the
// new data instead of adopting it (the simulator's seed 150).
func TestObjectCreatedAgainInAStormKeepsItsRecordForASuccessor(t *testing.T) {
	api := newFakeAPI(t, owned("web", 2)...) // its server, a socket, outside the bubble
	synctest.Test(t, func(t *testing.T) {
		api.afterDelete = func(p fakePod) { api.replacement(p) }
		cfg := Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}, StormChanges: 2, StormWindow: time.Minute}
		data := func(n int) map[string]string { return map[string]string{"k": "v" + strconv.Itoa(n)} }
		first, _ := newTestController(t, memAPI{api}, cfg)
		ctx, kill := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { first.Run(ctx); close(done) }()
		synctest.Wait()
		handle(t, first, watch.Added, cmSpec{uid: "uid-old", selector: ptr("app=web"), recorded: hashOf(t, data(1)), data: data(1)})
		for n := 2; n <= 4; n++ { // the third change within the window: a storm, and its round
			time.Sleep(time.Second)
			handle(t, first, watch.Modified, cmSpec{uid: "uid-old", selector: ptr("app=web"), recorded: hashOf(t, data(1)), data: data(n)})
			synctest.Wait()
		}
		require.Equal(t, float64(1), first.metrics.ObjectsInStorm.Value())
		deleted := len(api.removedPods())
		require.NotZero(t, deleted)

		// Deleted and created again with other data: the storm holds its
		// round back for the window. Then the controller is killed.
		time.Sleep(time.Second)
		handle(t, first, watch.Deleted, cmSpec{uid: "uid-old", selector: ptr("app=web"), data: data(4)})
		writes := len(api.patchedAnnotations())
		handle(t, first, watch.Added, cmSpec{uid: "uid-new", selector: ptr("app=web"), data: data(5)})
		synctest.Wait()
		require.Len(t, api.removedPods(), deleted, "the storm holds the round back")
		kill()
		<-done

		// Its successor sees the new object as the server has it.
		ann := map[string]string{}
		for _, w := range api.patchedAnnotations()[writes:] {
			for k, v := range w {
				if v == nil {
					delete(ann, k)
				} else {
					ann[k] = *v
				}
			}
		}
		next, _ := newTestController(t, memAPI{api}, cfg)
		start(t, next)
		handle(t, next, watch.Added, cmSpec{uid: "uid-new", selector: ptr("app=web"), annotations: ann, data: data(5)})
		synctest.Wait()
		assert.Len(t, api.removedPods(), deleted+2, "the pods restarted for the new object's data")
		rs := api.recordedHashes()
		assert.Equal(t, hashOf(t, data(5)), rs[len(rs)-1])
	})
}

// TestStormEndsAfterAQuietWindowNoWorkerSaw ensures a storm is over once
// its data was quiet for the window, though the key's worker did not look
// then (the object deleted, its tombstone not reconciled) and a change came
// after: the storm does not go on from that change (the simulator's seed
// 158, a ConfigMap created again 20.7 s after its storm's last change).
func TestStormEndsAfterAQuietWindowNoWorkerSaw(t *testing.T) {
	c, _ := newTestController(t, newFakeAPI(t).client(), Config{StormChanges: 2, StormWindow: 10 * time.Second})
	e := &entry{}
	start := time.Now()
	for i := range 3 {
		c.noteChange(e, start.Add(time.Duration(i)*time.Second))
	}
	news, _ := c.judgeStorm("ns/cm", e, start.Add(3*time.Second))
	require.Equal(t, stormBegan, news)

	later := start.Add(2*time.Second + 11*time.Second) // 11 s after the last change
	c.noteChange(e, later)
	news, left := c.judgeStorm("ns/cm", e, later)
	assert.Equal(t, stormEnded, news)
	assert.Zero(t, left)
	assert.False(t, e.storm)
}

// TestStormRoundThatSawOtherDataReadsAsMixedBeforeItsNextRestart ensures a
// round begun in a storm, going on for its data after a view showed other
// data, has its intent read as pods mixed on the object before its next
// restart: that restart's replacement may run the other data, and a kill
// before the round's record would leave, were the data set back to the
// round's own, an intent a successor resumes as if every replacement ran
// it (simulator seed 8575).
func TestStormRoundThatSawOtherDataReadsAsMixedBeforeItsNextRestart(t *testing.T) {
	api := newFakeAPI(t, owned("webapp", 3)...)
	api.afterDelete = func(p fakePod) { api.replacement(p) }
	c, _ := newTestController(t, api.client(), Config{RecordHash: true, MaxUnavailable: Budget{Percent: 100}, MaxConcurrentRestarts: 1,
		StormChanges: 2, StormWindow: 500 * time.Millisecond})
	change := func(data map[string]string) {
		handle(t, c, watch.Modified, cmSpec{selector: ptr("app=webapp"), recorded: hashOf(t, v1), data: data})
	}
	for n := range 4 { // standing by, it sees the storm
		change(stormData(n))
	}
	var mu sync.Mutex
	var intents []string // the intent on the object when each DELETE came
	api.fault = func(r request) (int, string, bool) {
		if r.method == http.MethodDelete {
			written := api.intents()
			mu.Lock()
			defer mu.Unlock()
			intents = append(intents, written[len(written)-1])
			if len(intents) == 1 {
				change(stormData(100)) // the next replacements may run it
			}
		}
		return 0, "", false
	}
	start(t, c)
	require.Eventually(t, func() bool { return len(api.recordedHashes()) > 0 }, waitFor, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, intents, 3)
	assert.NotEqual(t, mixedIntent.text, intents[0], "before other data was seen")
	assert.Equal(t, []string{mixedIntent.text, mixedIntent.text}, intents[1:])
}
