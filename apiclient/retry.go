package apiclient

import (
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/k8spatterns/config-watcher/internal/jitter"
)

const (
	maxBackOff    = 30 * time.Second
	maxRetryAfter = 5 * time.Minute // bounds a server's Retry-After
)

// DefaultBackOff is client-go's retry policy (0.8 s, doubling, 30 s cap) with
// jitter, so that controllers retrying a server that just came back do not
// arrive together.
func DefaultBackOff() backoff.BackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(800*time.Millisecond),
		backoff.WithRandomizationFactor(jitter.Factor(0.5)),
		backoff.WithMultiplier(2),
		backoff.WithMaxInterval(maxBackOff),
		backoff.WithMaxElapsedTime(0), // a controller never gives up on its API server
	)
}

// RetryDelay is how long to wait before retrying after err: bo's next
// interval, or longer if the server asked for it with Retry-After (up to
// five minutes). It is the one retry delay of the controller, for watches
// and rounds alike.
func RetryDelay(bo backoff.BackOff, err error) time.Duration {
	d := bo.NextBackOff()
	if d == backoff.Stop {
		d = maxBackOff // a policy that gives up is a mistake: a controller never does
	}
	return max(d, min(RetryAfter(err), maxRetryAfter))
}
