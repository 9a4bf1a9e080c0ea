// Package jitter is the one source of the controller's random spreads: the
// retry backoff's, the lease retries', the watches' timeouts. A process
// spreads its retries so that replicas do not arrive together; the
// simulator turns the spreads off, so that a seed replays the same run.
package jitter

import (
	"math/rand/v2"
	"sync/atomic"
)

var off atomic.Bool

// Off turns every spread off for the rest of the process (the simulator).
func Off() { off.Store(true) }

// Factor is the randomization factor f of a backoff, or 0 when off.
func Factor(f float64) float64 {
	if off.Load() {
		return 0
	}
	return f
}

// N returns a random value in [0, n), or 0 when off; n must be > 0.
func N[T ~int64](n T) T {
	if off.Load() {
		return 0
	}
	return rand.N(n)
}
