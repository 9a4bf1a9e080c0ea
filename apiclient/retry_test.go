package apiclient_test

import (
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// TestDefaultBackOff ensures the default policy starts near client-go's
// 0.8 s, grows, stays under its 30 s cap (plus jitter) and never gives up.
func TestDefaultBackOff(t *testing.T) {
	bo := apiclient.DefaultBackOff()
	first := bo.NextBackOff()
	assert.GreaterOrEqual(t, first, 400*time.Millisecond)
	assert.LessOrEqual(t, first, 1200*time.Millisecond)
	last := first
	for range 200 {
		last = bo.NextBackOff()
		require.NotEqual(t, backoff.Stop, last, "the default backoff gave up")
		assert.LessOrEqual(t, last, 45*time.Second)
	}
	assert.GreaterOrEqual(t, last, 15*time.Second, "grown to its cap")
	bo.Reset()
	assert.LessOrEqual(t, bo.NextBackOff(), 1200*time.Millisecond, "Reset starts over")
}
