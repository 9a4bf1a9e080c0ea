package audit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	deleteDone    = `{"auditID":"a1","stage":"ResponseComplete","verb":"delete","requestURI":"/api/v1/namespaces/ns/pods/p1","user":{"username":"cw"},"objectRef":{"resource":"pods","namespace":"ns","name":"p1"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-01-02T03:04:05.000001Z","stageTimestamp":"2026-01-02T03:04:05.000009Z"}` + "\n"
	deleteStarted = `{"auditID":"a1","stage":"RequestReceived","verb":"delete","objectRef":{"resource":"pods","namespace":"ns","name":"p1"}}` + "\n"
	evictDone     = `{"auditID":"a2","stage":"ResponseComplete","verb":"create","objectRef":{"resource":"pods","subresource":"eviction","namespace":"ns","name":"p2"},"responseStatus":{"code":429}}` + "\n"
)

func write(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

func all(Event) bool { return true }

// TestReadKeepsCompletedRequests ensures only ResponseComplete events that
// keep accepts come back, with their fields and times.
func TestReadKeepsCompletedRequests(t *testing.T) {
	events, err := Read(write(t, deleteStarted+deleteDone+evictDone), func(e Event) bool { return e.On("ns", "pods") })
	require.NoError(t, err)
	require.Len(t, events, 1, "the eviction is a subresource, the first line not complete")
	e := events[0]
	assert.True(t, e.OK())
	assert.Equal(t, "p1", e.ObjectRef.Name)
	assert.Equal(t, "cw", e.User.Username)
	assert.Equal(t, 8000, int(e.Done.Sub(e.Received).Nanoseconds()))
	assert.Equal(t, "2026-01-02T03:04:05.000009Z delete /api/v1/namespaces/ns/pods/p1 by cw -> 200", e.String())
}

// TestReadSkipsALineBeingWritten ensures a last line without its newline (the
// server is still writing it) is left out rather than failing the read.
func TestReadSkipsALineBeingWritten(t *testing.T) {
	events, err := Read(write(t, deleteDone+deleteDone[:40]), all)
	require.NoError(t, err)
	assert.Len(t, events, 1)
}

// TestReadRefusesACorruptLine ensures a complete line that is not an Event is
// an error naming it, not a silently shorter result.
func TestReadRefusesACorruptLine(t *testing.T) {
	_, err := Read(write(t, "not json\n"+deleteDone), all)
	assert.ErrorContains(t, err, "not json")
}

// TestReadMissingLog ensures a missing file reads as os.ErrNotExist, which a
// caller may take as "no requests yet".
func TestReadMissingLog(t *testing.T) {
	_, err := Read(filepath.Join(t.TempDir(), "none.log"), all)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// TestCodeWithoutStatus ensures an event the server logged without an answer
// reads as code 0, not OK.
func TestCodeWithoutStatus(t *testing.T) {
	events, err := Read(write(t, evictDone+`{"stage":"ResponseComplete","verb":"get"}`+"\n"), all)
	require.NoError(t, err)
	require.Len(t, events, 2)
	assert.Equal(t, 429, events[0].Code())
	assert.False(t, events[0].OK())
	assert.Equal(t, 0, events[1].Code())
	assert.False(t, events[1].OK())
}
