package app

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSettingsDoc ensures docs/settings.md lists every setting of config.go,
// in the same order, with the same flag and default, and nothing else.
func TestSettingsDoc(t *testing.T) {
	doc, err := os.ReadFile("../../docs/settings.md")
	require.NoError(t, err)
	type row struct{ env, flag, def string }
	var got []row
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue // not a row of the table
		}
		cell := func(i string) string { return strings.Trim(strings.TrimSpace(i), "`") }
		got = append(got, row{cell(cells[1]), cell(cells[2]), cell(cells[3])})
	}
	var want []row
	for _, s := range settings {
		def := s.def
		if def == "" {
			def = `""`
		}
		want = append(want, row{s.env, "--" + s.flag, def})
	}
	assert.Equal(t, want, got)
}
