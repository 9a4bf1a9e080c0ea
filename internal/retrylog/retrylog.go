// Package retrylog logs the failures of retry loops without repeating
// itself. A loop that retries every few seconds against a cause that lasts
// (a missing RBAC rule, an ambassador that is not running) would write the
// same line hundreds of times and bury everything else; this logs the
// first failure of each cause at once, counts the identical ones after it,
// and writes the count when the cause changes, when the loop recovers, and
// every Every while it lasts. A failure a person can fix (apiclient.Hint)
// is an error with the fix; any other a warning, since retrying cures it.
package retrylog

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// Log follows the failures of one or more subjects (a loop, a ConfigMap's
// rounds), each on its own. It is safe for concurrent use.
type Log struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu   sync.Mutex
	runs map[string]*run // by subject, while it fails
}

// run is a subject's failures since its last success.
type run struct {
	since    time.Time // first failure of the run
	failures int       // of the run
	// The failure last logged, for its summary.
	level    slog.Level
	msg, err string
	attrs    []any
	unlogged int       // identical failures since it was logged
	logged   time.Time // when it was logged
}

// DefaultEvery is how often a lasting failure is logged again, with its count.
const DefaultEvery = 5 * time.Minute

// New returns a Log writing to log; every (DefaultEvery if 0) is how often
// a cause that lasts is logged again; now is the clock (time.Now if nil).
func New(log *slog.Logger, every time.Duration, now func() time.Time) *Log {
	if every <= 0 {
		every = DefaultEvery
	}
	if now == nil {
		now = time.Now
	}
	return &Log{log: log, every: every, now: now, runs: map[string]*run{}}
}

// Failed reports a failure of subject: msg and err, with attrs (which
// name the subject in the log). The first failure of a cause (msg and err's
// text) is logged at once, with its fix ("fix") if it has one; identical
// ones after it only every Every, with how many there were ("repeated") and
// since when the subject fails ("failing_for"). A new cause first logs how
// many of the previous one went unlogged. It returns the fix, or "".
func (l *Log) Failed(subject, msg string, err error, attrs ...any) (fix string) {
	level := slog.LevelWarn
	if fix = apiclient.Hint(err); fix != "" {
		level, attrs = slog.LevelError, append(attrs, "fix", fix)
	}
	now := l.now()
	l.mu.Lock()
	r := l.runs[subject]
	if r == nil {
		r = &run{since: now}
		l.runs[subject] = r
	}
	r.failures++
	same := r.msg == msg && r.err == err.Error()
	if same && now.Sub(r.logged) < l.every {
		r.unlogged++
		l.mu.Unlock()
		return fix
	}
	var summary []any
	if !same && r.unlogged > 0 {
		summary = r.summary(now)
	}
	if same {
		attrs = append(attrs, "repeated", r.unlogged+1, "failing_for", now.Sub(r.since).Round(time.Second))
	}
	prev := *r
	r.level, r.msg, r.err, r.attrs, r.unlogged, r.logged = level, msg, err.Error(), attrs, 0, now
	l.mu.Unlock()
	if summary != nil {
		l.log.Log(context.Background(), prev.level, prev.msg, summary...)
	}
	l.log.Log(context.Background(), level, msg, append(attrs, "err", err)...)
	return fix
}

// summary is the line that counts the failures of r not logged.
func (r *run) summary(now time.Time) []any {
	return append(append([]any{}, r.attrs...), "repeated", r.unlogged, "failing_for", now.Sub(r.since).Round(time.Second), "err", r.err)
}

// Recovered ends subject's failures: if it had any, msg is logged at Info
// with attrs, how many failures there were and for how long.
func (l *Log) Recovered(subject, msg string, attrs ...any) {
	l.mu.Lock()
	r := l.runs[subject]
	delete(l.runs, subject)
	l.mu.Unlock()
	if r == nil {
		return
	}
	l.log.Info(msg, append(attrs, "failures", r.failures, "failing_for", l.now().Sub(r.since).Round(time.Second))...)
}

// Forget drops subject's failures without a word (a subject deleted while
// it failed).
func (l *Log) Forget(subject string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.runs, subject)
}
