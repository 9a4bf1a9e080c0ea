package apiclient

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUnaryAnswerOverTheCapIsAnError ensures an answer longer than
// maxResponseBytes is refused with an error naming the cap, not cut short
// nor read whole (a 1 GiB answer ends the request, no OOM), and that one at
// the cap is read whole.
func TestUnaryAnswerOverTheCapIsAnError(t *testing.T) {
	for _, tt := range []struct {
		name    string
		size    int64
		wantErr bool
	}{
		{"AtTheCap", maxResponseBytes, false},
		{"OneByteOver", maxResponseBytes + 1, true},
		{"FarOver", 1 << 30, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.Copy(w, io.LimitReader(zeros{}, tt.size)) // ends when the client hangs up
			}))
			t.Cleanup(srv.Close)
			c, err := New(srv.URL, "test")
			require.NoError(t, err)
			data, err := c.Get(context.Background(), "/api/v1/namespaces/ns/configmaps/big", nil, "")
			if !tt.wantErr {
				require.NoError(t, err)
				assert.Len(t, data, maxResponseBytes)
				return
			}
			require.Error(t, err)
			assert.True(t, strings.Contains(err.Error(), "answer larger than 16777216 bytes"), err.Error())
			assert.Nil(t, data)
		})
	}
}

// zeros is an endless stream of '0', generated as it is read.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = '0'
	}
	return len(p), nil
}
