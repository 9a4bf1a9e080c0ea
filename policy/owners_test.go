package policy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// TestScaleReadPerKind ensures an owner's desired replicas are read from
// the scale subresource its kind has (known for the usual owners, else
// from its group-version's discovery document, read once), and that a
// kind without one, a refusal, an owner gone and an owner replaced under
// its name are errors that say so, after no more requests than needed.
func TestScaleReadPerKind(t *testing.T) {
	scale := func(uid string, replicas string) string {
		return `{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{"name":"x","namespace":"ns","uid":"` + uid + `"},"spec":{"replicas":` + replicas + `},"status":{"replicas":1}}`
	}
	answers := map[string]struct {
		code int
		body string
	}{
		"/apis/apps/v1/namespaces/ns/replicasets/web/scale":         {200, scale("rs-uid", "3")},
		"/apis/apps/v1/namespaces/ns/statefulsets/db/scale":         {200, scale("sts-uid", "5")},
		"/api/v1/namespaces/ns/replicationcontrollers/rc/scale":     {200, scale("rc-uid", "2")},
		"/apis/example.com/v1":                                      {200, `{"kind":"APIResourceList","groupVersion":"example.com/v1","resources":[{"name":"widgets","kind":"Widget","namespaced":true},{"name":"widgets/scale","kind":"Scale","namespaced":true},{"name":"gadgets","kind":"Gadget","namespaced":true},{"name":"widgets/status","kind":"Widget"}]}`},
		"/apis/example.com/v1/namespaces/ns/widgets/w/scale":        {200, scale("w-uid", "7")},
		"/apis/apps/v1/namespaces/ns/replicasets/secret-rs/scale":   {403, `{"kind":"Status","code":403,"reason":"Forbidden","message":"replicasets.apps \"secret-rs\" is forbidden"}`},
		"/apis/apps/v1/namespaces/ns/replicasets/replaced/scale":    {200, scale("another-uid", "3")},
		"/apis/apps/v1/namespaces/ns/replicasets/no-replicas/scale": {200, `{"kind":"Scale","metadata":{"uid":"nr-uid"},"spec":{}}`},
		"/apis/apps/v1/namespaces/ns/replicasets/gone-rs/scale":     {404, `{"kind":"Status","code":404,"reason":"NotFound"}`},
	}
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		a, ok := answers[r.URL.Path]
		if !ok {
			a.code, a.body = 404, `{"kind":"Status","code":404,"reason":"NotFound"}`
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.code)
		w.Write([]byte(a.body))
	}))
	t.Cleanup(srv.Close)
	client, err := apiclient.New(srv.URL, "test")
	require.NoError(t, err)
	o := newOwners(client)

	for _, tt := range []struct {
		name    string
		owner   ownerRef
		want    int
		wantErr string // part of the error, "" for none
	}{
		{"ReplicaSet", ownerRef{"apps/v1", "ReplicaSet", "web", "rs-uid"}, 3, ""},
		{"StatefulSet", ownerRef{"apps/v1", "StatefulSet", "db", "sts-uid"}, 5, ""},
		{"ReplicationController", ownerRef{"v1", "ReplicationController", "rc", "rc-uid"}, 2, ""},
		{"CustomKindFromDiscovery", ownerRef{"example.com/v1", "Widget", "w", "w-uid"}, 7, ""},
		{"CustomKindWithoutScale", ownerRef{"example.com/v1", "Gadget", "g", "g-uid"}, 0, "no scale subresource"},
		{"UnknownGroupVersion", ownerRef{"unknown.example.com/v1", "Thing", "t", "t-uid"}, 0, "API discovery of unknown.example.com/v1"},
		{"DaemonSet", ownerRef{"apps/v1", "DaemonSet", "agent", "ds-uid"}, 0, "no scale subresource"},
		{"Forbidden", ownerRef{"apps/v1", "ReplicaSet", "secret-rs", "s-uid"}, 0, `needs verb get on replicasets/scale in API group "apps"`},
		{"OwnerGone", ownerRef{"apps/v1", "ReplicaSet", "gone-rs", "f-uid"}, 0, "is gone"},
		{"UIDIsNotTheOwnerReferences", ownerRef{"apps/v1", "ReplicaSet", "replaced", "rs-old-uid"}, 0, "another object now"},
		{"NoReplicas", ownerRef{"apps/v1", "ReplicaSet", "no-replicas", "nr-uid"}, 0, "no spec.replicas"},
		{"GroupNotADNSName", ownerRef{"Example.com:8080/v1", "Thing", "t", "t-uid"}, 0, "not an API group and version"},
		{"VersionNotADNSLabel", ownerRef{"example.com/v1/x", "Thing", "t", "t-uid"}, 0, "not an API group and version"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := o.read(context.Background(), "ns", tt.owner)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Equal(t, strings.Contains(tt.wantErr, "no scale"), errors.Is(err, errNoScale), "told apart as a kind without scale")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	mu.Lock()
	defer mu.Unlock()
	discoveries := 0
	for _, p := range paths {
		if p == "/apis/example.com/v1" {
			discoveries++
		}
		assert.False(t, strings.Contains(p, "daemonsets"), "a DaemonSet has no scale to read: %s", p)
		assert.False(t, strings.Contains(p, "8080") || strings.Contains(p, "v1/x"), "an apiVersion that is no group and version is not read: %s", p)
	}
	assert.Equal(t, 1, discoveries, "one group-version's discovery is read once")
	assert.True(t, errors.Is(func() error {
		_, err := o.read(context.Background(), "ns", ownerRef{"apps/v1", "DaemonSet", "a", "b"})
		return err
	}(), errNoScale))
}

// TestScaleReadAtMostOncePerSecond ensures rounds that look at the same
// owners within scaleReadEvery share one read of each.
func TestScaleReadAtMostOncePerSecond(t *testing.T) {
	api := newFakeAPI(t, podsOf("RRRR")...)
	o := newOwners(api.client())
	owner := ownerRef{"apps/v1", "ReplicaSet", "web-rs", "uid-web-rs"}
	r := &round{}
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() { o.refresh(context.Background(), r, "ns", []ownerRef{owner}, time.Time{}) })
	}
	wg.Wait()
	o.refresh(context.Background(), r, "ns", []ownerRef{owner}, time.Time{})
	n, err := o.desired(owner.uid)
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.Len(t, api.seen(http.MethodGet, "replicasets"), 1)
}

// TestOwnersKeepWhatRoundsInProgressAskedFor ensures the scale reads and
// discovery documents a round asked for are dropped once no round in
// progress asked for them, and that discovery is capped: past
// maxDiscovered apiVersions, an owner of one more is not read.
func TestOwnersKeepWhatRoundsInProgressAskedFor(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/example.com/v1":
			w.Write([]byte(`{"kind":"APIResourceList","resources":[{"name":"widgets","kind":"Widget"},{"name":"widgets/scale","kind":"Scale"}]}`))
		case "/apis/example.com/v1/namespaces/ns/widgets/w/scale":
			w.Write([]byte(`{"kind":"Scale","metadata":{"uid":"w-uid"},"spec":{"replicas":2}}`))
		default:
			w.WriteHeader(404)
			w.Write([]byte(`{"kind":"Status","code":404,"reason":"NotFound"}`))
		}
	}))
	t.Cleanup(srv.Close)
	client, err := apiclient.New(srv.URL, "test")
	require.NoError(t, err)
	o := newOwners(client)
	widget := ownerRef{"example.com/v1", "Widget", "w", "w-uid"}
	a, b := &round{}, &round{}
	o.refresh(context.Background(), a, "ns", []ownerRef{widget}, time.Time{})
	o.refresh(context.Background(), b, "ns", []ownerRef{widget}, time.Time{})
	n, err := o.desired(widget.uid)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	o.forget(func(r *round) bool { return r == b })
	assert.Len(t, o.scales, 1, "b, in progress, asked for it")
	assert.Len(t, o.discovery, 1, "b, in progress, asked for it")
	o.forget(func(*round) bool { return false })
	assert.Empty(t, o.scales)
	assert.Empty(t, o.discovery)
	assert.Empty(t, o.asked)

	for i := range maxDiscovered {
		o.discovery[fmt.Sprintf("g%d.example.com/v1", i)] = &discovered{}
	}
	mu.Lock()
	before := len(paths)
	mu.Unlock()
	_, err = o.read(context.Background(), "ns", widget)
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("more than %d apiVersions", maxDiscovered))
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, paths, before, "no request for an apiVersion past the cap")
}

// TestScaleReadBeforeTheViewIsReadAgain ensures a wave that counted a scale
// read sent no later than its view is told when the owner may be read
// again, and that one read since, or of a kind without scale, asks for no
// look.
func TestScaleReadBeforeTheViewIsReadAgain(t *testing.T) {
	view := time.Now()
	answered := view.Add(-300 * time.Millisecond)
	done := make(chan struct{})
	close(done)
	o := newOwners(nil)
	o.scales["before"] = &scaleRead{done: done, sent: view.Add(-400 * time.Millisecond), at: answered}
	o.scales["since"] = &scaleRead{done: done, sent: view.Add(time.Millisecond), at: view.Add(2 * time.Millisecond)}
	o.scales["ds"] = &scaleRead{done: done, sent: view.Add(-time.Second), at: view.Add(-time.Second), err: errNoScale}
	ref := func(uid string) ownerRef { return ownerRef{"apps/v1", "ReplicaSet", uid, uid} }

	assert.Equal(t, answered.Add(scaleReadEvery), o.readAgainAt([]ownerRef{ref("before"), ref("since"), ref("ds")}, view))
	assert.Zero(t, o.readAgainAt([]ownerRef{ref("since"), ref("ds"), ref("never-read")}, view))
}

// TestScaleReadCutByItsCallerIsNoFailure ensures a scale read cut by the
// cancellation of the context it was sent under (the controller stopping,
// its lead lost) leaves the owner not read, not failed: no round says an
// estimate (ExpectedPodsEstimated, owner_reads_failed_total) for it.
func TestScaleReadCutByItsCallerIsNoFailure(t *testing.T) {
	arrived := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done() // never answered: the client gives up
	}))
	t.Cleanup(srv.Close)
	client, err := apiclient.New(srv.URL, "test")
	require.NoError(t, err)
	o := newOwners(client)
	web := ownerRef{"apps/v1", "ReplicaSet", "web", "rs-uid"}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel()
	}()
	o.refresh(ctx, &round{}, "ns", []ownerRef{web}, time.Time{})
	require.Eventually(t, func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return isDone(o.scales[web.uid].done)
	}, 5*time.Second, time.Millisecond)
	_, err = o.desired(web.uid)
	assert.ErrorIs(t, err, errNotRead)
}
