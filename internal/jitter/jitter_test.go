package jitter

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestOffTurnsEverySpreadOff ensures spreads are random within their bounds,
// and none once Off is called.
func TestOffTurnsEverySpreadOff(t *testing.T) {
	t.Cleanup(func() { off.Store(false) }) // Off is for the process: give the next run (-count) its spreads back
	assert.Equal(t, 0.5, Factor(0.5))
	for range 100 {
		d := N(time.Second)
		assert.True(t, d >= 0 && d < time.Second, d)
	}
	Off()
	assert.Zero(t, Factor(0.5))
	assert.Zero(t, N(time.Second))
	assert.Zero(t, N(int64(7)))
}
