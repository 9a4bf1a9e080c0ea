package sim

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// stalls is a loaded machine's scheduling noise (app.Options.Stall): on
// such a machine any goroutine may run late, and a round's worker may take
// its pods long after it was handed the round, while other rounds' requests
// are carried out. The simulator has no CPU time of its own: without this,
// a worker runs in the instant it is woken.
//
// One seed in four runs loaded; there a wave is held up, one time in two,
// for up to a second of virtual time. A delay is drawn from the seed, the
// process and the wave's place in its round's sequence, not from the
// world's generator: waves of different rounds ask in an order goroutine
// scheduling picks, and the draws must not depend on it.
type stalls struct {
	key   string    // seed and controller process
	start time.Time // the world's
	mu    sync.Mutex
	n     map[string]int // site -> times asked
	held  []string       // what was held up, for the report
	spans []span         // when, in the world's time
}

// loaded: seed runs on a loaded machine.
func loaded(seed uint64) bool { return seed%4 == 3 }

func newStalls(seed uint64, gen int, start time.Time) *stalls {
	return &stalls{key: fmt.Sprintf("%d/%d", seed, gen), start: start, n: map[string]int{}}
}

// draw is app.Options.Stall.
func (s *stalls) draw(site string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.n[site]
	s.n[site]++
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%s/%d", s.key, site, n)
	rng := rand.New(rand.NewPCG(h.Sum64(), 0x57a11))
	if rng.Float64() >= 0.5 {
		return 0
	}
	d := time.Duration(rng.Int64N(int64(time.Second)))
	now := time.Since(s.start)
	s.held = append(s.held, fmt.Sprintf("%9.3fs %s held %s", now.Seconds(), site, d.Round(time.Millisecond)))
	s.spans = append(s.spans, span{now, now + d})
	return d
}

// String lists what was held up, with the world's times.
func (s *stalls) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.held, "\n")
}

// stalled returns how long the controllers' waves were held up in [from,
// to], the spans of one process that overlap counted once: time a loaded
// machine did not run the worker is no wait of the product's (prompt).
func (w *world) stalled(from, to time.Duration) time.Duration {
	var spans []span
	for _, p := range w.procs {
		if p.stalls == nil {
			continue
		}
		p.stalls.mu.Lock()
		spans = append(spans, p.stalls.spans...)
		p.stalls.mu.Unlock()
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.from, b.from) })
	var total, end time.Duration
	for _, s := range spans {
		lo, hi := max(s.from, from, end), min(s.to, to)
		if hi > lo {
			total += hi - lo
		}
		end = max(end, s.to)
	}
	return total
}
