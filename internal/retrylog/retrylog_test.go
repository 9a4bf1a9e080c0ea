package retrylog

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// clock is a test's time, moved by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

// newLog returns a Log on a hand-moved clock and the lines it writes,
// without their time.
func newLog() (*Log, *clock, *bytes.Buffer) {
	var out bytes.Buffer
	h := slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	c := &clock{t: time.Unix(1700000000, 0)}
	return New(slog.New(h), time.Minute, c.now), c, &out
}

func lines(out *bytes.Buffer) []string {
	s := strings.TrimSuffix(out.String(), "\n")
	out.Reset()
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// TestRepeatedFailureLoggedOnceThenCounted ensures a failure that repeats
// every few seconds is logged once, then once per Every with its count, and
// its end with how many there were.
func TestRepeatedFailureLoggedOnceThenCounted(t *testing.T) {
	l, c, out := newLog()
	forbidden := errors.New("403 Forbidden")
	for range 10 { // 10 failures 5 s apart: 45 s, within Every
		l.Failed("", "list failed; retrying", forbidden, "path", "/x")
		c.advance(5 * time.Second)
	}
	assert.Equal(t, []string{`level=WARN msg="list failed; retrying" path=/x err="403 Forbidden"`}, lines(out))

	c.advance(15 * time.Second) // a minute after the first line
	l.Failed("", "list failed; retrying", forbidden, "path", "/x")
	assert.Equal(t, []string{`level=WARN msg="list failed; retrying" path=/x repeated=10 failing_for=1m5s err="403 Forbidden"`}, lines(out))

	l.Failed("", "list failed; retrying", forbidden, "path", "/x")
	c.advance(time.Second)
	l.Recovered("", "list recovered", "path", "/x")
	assert.Equal(t, []string{`level=INFO msg="list recovered" path=/x failures=12 failing_for=1m6s`}, lines(out))

	l.Recovered("", "list recovered", "path", "/x")
	assert.Empty(t, lines(out), "a subject that did not fail recovers silently")
	l.Failed("", "list failed; retrying", forbidden, "path", "/x")
	assert.Len(t, lines(out), 1, "a failure after a recovery is a new cause")
}

// TestNewCauseLoggedAtOnceAfterTheOldOnesCount ensures a failure with
// another cause is logged at once, after a line counting the unlogged
// failures of the previous cause.
func TestNewCauseLoggedAtOnceAfterTheOldOnesCount(t *testing.T) {
	l, c, out := newLog()
	for range 3 {
		l.Failed("", "watch failed; retrying", errors.New("connection refused"))
		c.advance(time.Second)
	}
	l.Failed("", "list failed; retrying", errors.New("403 Forbidden"))
	assert.Equal(t, []string{
		`level=WARN msg="watch failed; retrying" err="connection refused"`,
		`level=WARN msg="watch failed; retrying" repeated=2 failing_for=3s err="connection refused"`,
		`level=WARN msg="list failed; retrying" err="403 Forbidden"`,
	}, lines(out))
}

// TestSubjectsFailOnTheirOwn ensures the failures of one subject neither
// hide nor count those of another, and Forget drops a subject silently.
func TestSubjectsFailOnTheirOwn(t *testing.T) {
	l, _, out := newLog()
	err := errors.New("500 Internal Server Error")
	l.Failed("ns/a", "round failed; will retry", err, "key", "ns/a")
	l.Failed("ns/b", "round failed; will retry", err, "key", "ns/b")
	l.Failed("ns/a", "round failed; will retry", err, "key", "ns/a")
	assert.Equal(t, []string{
		`level=WARN msg="round failed; will retry" key=ns/a err="500 Internal Server Error"`,
		`level=WARN msg="round failed; will retry" key=ns/b err="500 Internal Server Error"`,
	}, lines(out))
	l.Forget("ns/a")
	l.Recovered("ns/a", "round recovered", "key", "ns/a")
	l.Recovered("ns/b", "round recovered", "key", "ns/b")
	assert.Equal(t, []string{`level=INFO msg="round recovered" key=ns/b failures=1 failing_for=0s`}, lines(out))
}

// TestFailureAPersonFixesIsAnErrorWithTheFix ensures a failure that
// apiclient.Hint explains is logged as an error with its fix, and the fix
// is returned for the probes, each time, logged or not.
func TestFailureAPersonFixesIsAnErrorWithTheFix(t *testing.T) {
	l, _, out := newLog()
	refused := fmt.Errorf("GET /api/v1/pods: %w", syscall.ECONNREFUSED)
	for range 2 {
		assert.Equal(t, apiclient.Hint(refused), l.Failed("", "list failed; retrying", refused))
	}
	assert.Equal(t, []string{`level=ERROR msg="list failed; retrying" fix="` + apiclient.Hint(refused) + `" err="GET /api/v1/pods: connection refused"`}, lines(out))
}
