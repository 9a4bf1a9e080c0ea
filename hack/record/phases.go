package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// recordCached records, with the watch cache on (the API server's default): the LIST
// and pod list, a watch carrying every event type, MODIFIED events of large objects, the
// metadata-only pod LIST and WATCH the pod index read before it watched whole pods, and a
// Running pod.
func (r *recorder) recordCached(ctx context.Context) error {
	if err := r.setUpWebapp(ctx); err != nil {
		return err
	}

	q := url.Values{"labelSelector": {"app=webapp"}}
	resp, err := r.ok(ctx, http.MethodGet, "/api/v1/namespaces/"+r.ns+"/pods", q, "", nil)
	if err != nil {
		return err
	}
	if err := r.saveResponse("pods-list.json", "/api/v1/namespaces/"+r.ns+"/pods", q, resp,
		"the webapp Deployment's 2 pods (Pending: no scheduler, no kubelet)"); err != nil {
		return err
	}

	resp, err = r.ok(ctx, http.MethodGet, r.configMaps(), nil, "", nil)
	if err != nil {
		return err
	}
	if err := r.saveResponse("list.json", r.configMaps(), nil, resp,
		"ConfigMap LIST: `webapp-config` (annotated `app=webapp`) and `other-config` (not annotated)"); err != nil {
		return err
	}
	list, err := decodeMeta(resp.body)
	if err != nil {
		return fmt.Errorf("decode list: %w", err)
	}

	// Paging, as a client with limit=500 sees it on a namespace with more ConfigMaps.
	if err := r.recordPages(ctx, r.configMaps(), 1, "list-page-1.json", "list-page-2.json",
		"first page of the same LIST: one item and `metadata.continue`", "last page: no `continue`"); err != nil {
		return err
	}

	// A watch without resourceVersion: synthetic ADDED for every existing object.
	q = url.Values{"watch": {"true"}, "timeoutSeconds": {"2"}}
	s, bad, err := r.watch(ctx, r.configMaps(), q, "watch-no-rv.ndjson")
	if err != nil {
		return err
	}
	if s == nil {
		return fmt.Errorf("watch without resourceVersion: HTTP %d: %s", bad.status, truncate(bad.body))
	}
	types, err := s.finish(30 * time.Second)
	if err != nil {
		return err
	}
	if !slices.Equal(types, []string{"ADDED", "ADDED"}) {
		return fmt.Errorf("watch without resourceVersion gave %v, want 2 synthetic ADDED", types)
	}
	if err := r.note("watch-no-rv.ndjson", pathOf(r.configMaps(), q), s.status, s.contentType,
		"watch with **no** resourceVersion: one synthetic ADDED per existing ConfigMap, then the server's timeout ends the stream"); err != nil {
		return err
	}

	if err := r.recordWatchEvents(ctx, list.ResourceVersion); err != nil {
		return err
	}
	for _, p := range []struct {
		file string
		size int
		what string
	}{
		{"modified-1kib.ndjson", 1 << 10, "~1 KiB"},
		{"modified-100kib.ndjson", 100 << 10, "~100 KiB"},
		{"modified-1mib.ndjson", 1<<20 - 1<<10, "~1 MiB (1 KiB under the API server's 1 MiB limit on ConfigMap data)"},
	} {
		if err := r.recordModified(ctx, p.file, p.size, p.what); err != nil {
			return err
		}
	}
	if err := r.recordPodsMetadata(ctx); err != nil {
		return err
	}
	return r.recordRunningPod(ctx)
}

// describe renders a pod event for the README: type, name, revision, and for a
// MODIFIED what it showed.
func describe(ev streamEvent) string {
	m := ev.Object.Metadata
	s := ev.Type + " " + m.Name + "@" + m.ResourceVersion
	if ev.Type != "MODIFIED" {
		return s
	}
	if m.DeletionTimestamp != nil {
		return s + " (deletionTimestamp set)"
	}
	labels := make([]string, 0, len(m.Labels))
	for k, v := range m.Labels {
		labels = append(labels, k+"="+v)
	}
	slices.Sort(labels)
	return s + " (labels " + strings.Join(labels, ",") + ")"
}

// podsWatchTimeout is the timeoutSeconds of the metadata-only pod watch: room for its
// four steps (a second or two), after which the server ends the stream itself.
const podsWatchTimeout = 20

// recordPodsMetadata records what the pod index (podindex) is fed: a metadata-only LIST
// of the namespace's pods, and a metadata-only WATCH from its resourceVersion while it
// creates a bare pod `indexed-pod`, adds a label to it, deletes it, then deletes one of
// the webapp Deployment's pods, which its ReplicaSet replaces. Each step waits for the
// event that shows it, and records whatever else the server sends on the way; the
// stream is then read until the server's timeoutSeconds ends it, so the file ends as a
// real watch does.
func (r *recorder) recordPodsMetadata(ctx context.Context) error {
	pods := "/api/v1/namespaces/" + r.ns + "/pods"
	resp, err := r.okAs(ctx, acceptMetadataList, http.MethodGet, pods, nil, "", nil)
	if err != nil {
		return err
	}
	var list struct {
		Kind     string `json:"kind"`
		Metadata meta   `json:"metadata"`
		Items    []struct {
			Metadata struct {
				Name   string            `json:"name"`
				UID    string            `json:"uid"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal(resp.body, &list); err != nil {
		return fmt.Errorf("decode metadata pod list: %w", err)
	}
	if list.Kind != "PartialObjectMetadataList" {
		return fmt.Errorf("metadata pod list: kind %q, want PartialObjectMetadataList (the Accept header was not honoured)", list.Kind)
	}
	known := map[string]bool{} // uids seen so far
	var victim, victimUID string
	for _, it := range list.Items {
		known[it.Metadata.UID] = true
		if it.Metadata.Labels["app"] == "webapp" && victim == "" {
			victim, victimUID = it.Metadata.Name, it.Metadata.UID
		}
	}
	if len(list.Items) != 2 || victim == "" {
		return fmt.Errorf("metadata pod list: %d pods, want the 2 webapp pods", len(list.Items))
	}
	if err := r.saveResponse("pods-metadata-list.json", pods, nil, resp,
		"metadata-only pod LIST (`Accept: "+acceptMetadataList+"`): the webapp Deployment's 2 pods as `PartialObjectMetadata`"); err != nil {
		return err
	}

	q := url.Values{"watch": {"true"}, "resourceVersion": {list.Metadata.ResourceVersion}, "allowWatchBookmarks": {"true"},
		"timeoutSeconds": {itoa(podsWatchTimeout)}}
	s, bad, err := r.watchAs(ctx, acceptMetadata, pods, q, "pods-metadata-watch.ndjson")
	if err != nil {
		return err
	}
	if s == nil {
		return fmt.Errorf("metadata pod watch from %s: HTTP %d: %s", list.Metadata.ResourceVersion, bad.status, truncate(bad.body))
	}
	var seen []string // "TYPE name", in order
	// until reads events until done has been true for one of them.
	until := func(what string, done func(streamEvent) bool) error {
		for {
			ev, err := s.next(15 * time.Second)
			if err != nil {
				return fmt.Errorf("pods-metadata-watch: waiting for %s: %w (seen %v)", what, err, seen)
			}
			seen = append(seen, describe(ev))
			if done(ev) {
				return nil
			}
		}
	}
	const name = "indexed-pod"
	is := func(typ, podName string) func(streamEvent) bool {
		return func(ev streamEvent) bool { return ev.Type == typ && ev.Object.Metadata.Name == podName }
	}
	podJSON, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "labels": map[string]string{"app": "indexed"}},
		"spec": map[string]any{"containers": []any{map[string]any{
			"name": "main", "image": "k8spatterns/mini-http-server"}}},
	})
	var replacement string
	steps := []struct {
		what string
		do   func() error
		done func(streamEvent) bool
	}{
		{"ADDED " + name, func() error {
			_, err := r.ok(ctx, http.MethodPost, pods, nil, "application/json", podJSON)
			return err
		}, is("ADDED", name)},
		{"MODIFIED " + name + " with tier=x", func() error {
			_, err := r.ok(ctx, http.MethodPatch, pods+"/"+name, nil, "application/merge-patch+json",
				[]byte(`{"metadata":{"labels":{"tier":"x"}}}`))
			return err
		}, func(ev streamEvent) bool {
			return is("MODIFIED", name)(ev) && ev.Object.Metadata.Labels["tier"] == "x"
		}},
		{"DELETED " + name, func() error {
			_, err := r.ok(ctx, http.MethodDelete, pods+"/"+name, nil, "", nil)
			return err
		}, is("DELETED", name)},
		{"DELETED " + victim + " and an ADDED replacement", func() error {
			_, err := r.ok(ctx, http.MethodDelete, pods+"/"+victim, nil, "application/json",
				[]byte(`{"kind":"DeleteOptions","apiVersion":"v1","preconditions":{"uid":"`+victimUID+`"}}`))
			return err
		}, func() func(streamEvent) bool {
			deleted := false
			return func(ev streamEvent) bool {
				if is("DELETED", victim)(ev) {
					deleted = true
				}
				if ev.Type == "ADDED" && ev.Object.Metadata.Labels["app"] == "webapp" && !known[ev.Object.Metadata.UID] {
					replacement = ev.Object.Metadata.Name
				}
				return deleted && replacement != ""
			}
		}()},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			s.stop()
			return fmt.Errorf("pods-metadata-watch: %s: %w", st.what, err)
		}
		if err := until(st.what, st.done); err != nil {
			s.stop()
			return err
		}
	}
	rest, err := s.finish((podsWatchTimeout + 20) * time.Second)
	if err != nil {
		return fmt.Errorf("pods-metadata-watch: %w (seen %v)", err, seen)
	}
	if slices.ContainsFunc(rest, func(t string) bool { return t != "BOOKMARK" }) {
		return fmt.Errorf("pods-metadata-watch: after the last step got %v, want BOOKMARKs only (seen %v)", rest, seen)
	}
	return r.note("pods-metadata-watch.ndjson", pathOf(pods, q), s.status, s.contentType,
		"metadata-only pod watch (`Accept: "+acceptMetadata+"`) from the LIST's resourceVersion, while the recorder "+
			"created `"+name+"` (`app=indexed`), added the label `tier=x`, deleted it, then deleted the webapp pod `"+victim+
			"`, which its ReplicaSet replaced with `"+replacement+"`. Events, in order: "+strings.Join(seen, ", ")+
			"; then "+fmt.Sprint(len(rest))+" BOOKMARK(s) before the server's timeout ended the stream cleanly")
}

// recordWatchEvents watches from the LIST's resourceVersion while it creates, changes
// (data, then labels only) and deletes a ConfigMap, and keeps the stream open until the
// server sends the BOOKMARK it sends 2 s before the watch's timeout.
func (r *recorder) recordWatchEvents(ctx context.Context, rv string) error {
	const timeout = 20
	q := url.Values{"watch": {"true"}, "resourceVersion": {rv}, "allowWatchBookmarks": {"true"}, "timeoutSeconds": {itoa(timeout)}}
	s, bad, err := r.watch(ctx, r.configMaps(), q, "watch-events.ndjson")
	if err != nil {
		return err
	}
	if s == nil {
		return fmt.Errorf("watch from %s: HTTP %d: %s", rv, bad.status, truncate(bad.body))
	}
	name := "watched-config"
	steps := []struct {
		event string
		do    func() error
	}{
		{"ADDED", func() error {
			_, err := r.createConfigMap(ctx, name, map[string]string{selectorAnnotation: "app=webapp"}, map[string]string{"message": "Hello"})
			return err
		}},
		{"MODIFIED", func() error {
			_, err := r.patchConfigMap(ctx, name, map[string]any{"data": map[string]string{"message": "Hello, World"}})
			return err
		}},
		{"MODIFIED", func() error {
			_, err := r.patchConfigMap(ctx, name, map[string]any{"metadata": map[string]any{"labels": map[string]string{"tier": "frontend"}}})
			return err
		}},
		{"DELETED", func() error {
			_, err := r.ok(ctx, http.MethodDelete, r.configMaps()+"/"+name, nil, "", nil)
			return err
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			s.stop()
			return err
		}
		if err := s.expect(st.event, 10*time.Second); err != nil {
			s.stop()
			return fmt.Errorf("watch-events: %w", err)
		}
	}
	rest, err := s.finish(time.Duration(timeout+20) * time.Second)
	if err != nil {
		return fmt.Errorf("watch-events: %w", err)
	}
	if len(rest) == 0 || slices.ContainsFunc(rest, func(t string) bool { return t != "BOOKMARK" }) {
		return fmt.Errorf("watch-events: after DELETED got %v, want BOOKMARKs only", rest)
	}
	return r.note("watch-events.ndjson", pathOf(r.configMaps(), q), s.status, s.contentType,
		"watch from the LIST's resourceVersion: ADDED (create `watched-config`), MODIFIED (data change), "+
			"MODIFIED (label-only change), DELETED, then "+fmt.Sprint(len(rest))+" BOOKMARK(s) before the server's timeout "+
			"ends the stream cleanly")
}

// recordModified creates a ConfigMap holding about size bytes of data, then watches
// from its resourceVersion while replacing the data with as much different text.
func (r *recorder) recordModified(ctx context.Context, file string, size int, what string) error {
	name := fmt.Sprintf("payload-%d", size)
	rv, err := r.createConfigMap(ctx, name, map[string]string{selectorAnnotation: "app=webapp"}, payload(uint64(size), size))
	if err != nil {
		return err
	}
	q := url.Values{"watch": {"true"}, "resourceVersion": {rv}, "allowWatchBookmarks": {"true"}, "timeoutSeconds": {"30"}}
	s, bad, err := r.watch(ctx, r.configMaps(), q, file)
	if err != nil {
		return err
	}
	if s == nil {
		return fmt.Errorf("watch from %s: HTTP %d: %s", rv, bad.status, truncate(bad.body))
	}
	if _, err := r.patchConfigMap(ctx, name, map[string]any{"data": payload(uint64(size)+1000, size)}); err != nil {
		s.stop()
		return err
	}
	if err := s.expect("MODIFIED", 20*time.Second); err != nil {
		s.stop()
		return fmt.Errorf("%s: %w", file, err)
	}
	if err := s.stop(); err != nil {
		return err
	}
	if _, err := r.ok(ctx, http.MethodDelete, r.configMaps()+"/"+name, nil, "", nil); err != nil {
		return err
	}
	return r.note(file, pathOf(r.configMaps(), q), s.status, s.contentType,
		"one MODIFIED event: ConfigMap `"+name+"` whose "+what+" of text data was replaced "+
			"(keys `part-NNN.txt` of at most 64 KiB; the stream was closed by the client after the event)")
}

// recordUncached records, with the watch cache off, what an expired resourceVersion
// looks like once etcd's history has been compacted.
func (r *recorder) recordUncached(ctx context.Context) error {
	for _, name := range []string{"expiring-config", "expiring-config-2"} {
		if _, err := r.createConfigMap(ctx, name, map[string]string{selectorAnnotation: "app=webapp"}, map[string]string{"message": "v0"}); err != nil {
			return err
		}
	}
	resp, err := r.ok(ctx, http.MethodGet, r.configMaps(), nil, "", nil)
	if err != nil {
		return err
	}
	old, err := decodeMeta(resp.body)
	if err != nil {
		return err
	}
	resp, err = r.ok(ctx, http.MethodGet, r.configMaps(), url.Values{"limit": {"1"}}, "", nil)
	if err != nil {
		return err
	}
	page, err := decodeMeta(resp.body)
	if err != nil || page.Continue == "" {
		return fmt.Errorf("page 1 has no continue token (err %v)", err)
	}
	for i := 1; i <= 3; i++ {
		if _, err := r.patchConfigMap(ctx, "expiring-config", map[string]any{"data": map[string]string{"message": fmt.Sprintf("v%d", i)}}); err != nil {
			return err
		}
	}
	rev, err := r.compactEtcd(ctx)
	if err != nil {
		return err
	}
	ctxNote := fmt.Sprintf("resourceVersion %s noted, 3 changes made, etcd compacted at revision %d (physical)", old.ResourceVersion, rev)

	// The watch from the compacted resourceVersion: the API server may refuse the request
	// itself (HTTP 410) or accept it and send an ERROR event; keep whichever comes.
	q := url.Values{"watch": {"true"}, "resourceVersion": {old.ResourceVersion}, "allowWatchBookmarks": {"true"}, "timeoutSeconds": {"10"}}
	s, bad, err := r.watch(ctx, r.configMaps(), q, "watch-410.ndjson")
	if err != nil {
		return err
	}
	if s == nil {
		if err := r.save("gone-410-status.json", bad.body); err != nil {
			return err
		}
		if err := r.note("gone-410-status.json", pathOf(r.configMaps(), q), bad.status, bad.contentType,
			"the watch request itself refused: "+ctxNote); err != nil {
			return err
		}
	} else {
		types, err := s.finish(30 * time.Second)
		if err != nil {
			return err
		}
		if !slices.Equal(types, []string{"ERROR"}) {
			return fmt.Errorf("watch from a compacted resourceVersion gave %v, want one ERROR", types)
		}
		if err := r.note("watch-410.ndjson", pathOf(r.configMaps(), q), s.status, s.contentType,
			"HTTP 200, then one ERROR event carrying a 410 Status, then the server ends the stream: "+ctxNote); err != nil {
			return err
		}
	}

	// The same expiry seen by LIST: an old continue token, and an exact old resourceVersion.
	q = url.Values{"limit": {"1"}, "continue": {page.Continue}}
	resp, err = r.do(ctx, http.MethodGet, r.configMaps(), q, "", nil)
	if err != nil {
		return err
	}
	if resp.status != http.StatusGone {
		return fmt.Errorf("LIST with an expired continue token: HTTP %d, want 410: %s", resp.status, truncate(resp.body))
	}
	if err := r.saveResponse("list-continue-410-status.json", r.configMaps(), url.Values{"limit": {"1"}, "continue": {"<token from before the compaction>"}}, resp,
		"LIST page 2 with a continue token issued before the compaction: "+ctxNote); err != nil {
		return err
	}
	q = url.Values{"resourceVersion": {old.ResourceVersion}, "resourceVersionMatch": {"Exact"}}
	resp, err = r.do(ctx, http.MethodGet, r.configMaps(), q, "", nil)
	if err != nil {
		return err
	}
	if resp.status != http.StatusGone {
		return fmt.Errorf("LIST at a compacted resourceVersion: HTTP %d, want 410: %s", resp.status, truncate(resp.body))
	}
	if err := r.saveResponse("list-exact-410-status.json", r.configMaps(), q, resp,
		"LIST at exactly the compacted resourceVersion: "+ctxNote); err != nil {
		return err
	}

	return nil
}

// setUpWebapp creates the book's objects: webapp-config, other-config and the webapp
// Deployment, and waits for its 2 pods.
func (r *recorder) setUpWebapp(ctx context.Context) error {
	if resp, err := r.do(ctx, http.MethodGet, r.configMaps()+"/webapp-config", nil, "", nil); err != nil {
		return err
	} else if resp.status != http.StatusNotFound {
		return fmt.Errorf("configmap %s/webapp-config exists already (HTTP %d): record into a fresh cluster", r.ns, resp.status)
	}
	// Pods are refused until the namespace has its default ServiceAccount.
	if err := eventuallyDo(60*time.Second, "the default ServiceAccount", func() (bool, error) {
		resp, err := r.do(ctx, http.MethodGet, "/api/v1/namespaces/"+r.ns+"/serviceaccounts/default", nil, "", nil)
		return err == nil && resp.status == http.StatusOK, err
	}); err != nil {
		return err
	}
	if _, err := r.createConfigMap(ctx, "webapp-config", map[string]string{selectorAnnotation: "app=webapp"}, map[string]string{"message": "Hello"}); err != nil {
		return err
	}
	if _, err := r.createConfigMap(ctx, "other-config", nil, map[string]string{"color": "blue"}); err != nil {
		return err
	}
	deploy := map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "webapp", "labels": map[string]string{"app": "webapp"}},
		"spec": map[string]any{
			"replicas": 2,
			"selector": map[string]any{"matchLabels": map[string]string{"app": "webapp"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]string{"app": "webapp"}},
				"spec": map[string]any{"containers": []any{map[string]any{
					"name": "webapp", "image": "k8spatterns/mini-http-server",
					"env": []any{map[string]any{"name": "MESSAGE", "valueFrom": map[string]any{
						"configMapKeyRef": map[string]string{"name": "webapp-config", "key": "message"}}}},
				}}},
			},
		},
	}
	b, _ := json.Marshal(deploy)
	if _, err := r.ok(ctx, http.MethodPost, "/apis/apps/v1/namespaces/"+r.ns+"/deployments", nil, "application/json", b); err != nil {
		return fmt.Errorf("create deployment: %w", err)
	}
	return eventuallyDo(60*time.Second, "2 webapp pods", func() (bool, error) {
		resp, err := r.ok(ctx, http.MethodGet, "/api/v1/namespaces/"+r.ns+"/pods", url.Values{"labelSelector": {"app=webapp"}}, "", nil)
		if err != nil {
			return false, err
		}
		var l struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(resp.body, &l); err != nil {
			return false, err
		}
		return len(l.Items) == 2, nil
	})
}

// compactEtcd compacts etcd's whole history up to its current revision through the
// JSON gateway, the way the API server's own compactor does every 5 minutes.
func (r *recorder) compactEtcd(ctx context.Context) (int64, error) {
	post := func(path string, body any) ([]byte, error) {
		b, _ := json.Marshal(body)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.etcd+path, bytesReader(b))
		if err != nil {
			return nil, fmt.Errorf("create request: %w", err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, fmt.Errorf("etcd %s: %w", path, err)
		}
		defer resp.Body.Close()
		out, err := readAll(resp)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("etcd %s: HTTP %d: %s", path, resp.StatusCode, truncate(out))
		}
		return out, nil
	}
	b, err := post("/v3/maintenance/status", map[string]any{})
	if err != nil {
		return 0, err
	}
	var status struct {
		Header struct {
			Revision json.Number `json:"revision"`
		} `json:"header"`
	}
	if err := json.Unmarshal(b, &status); err != nil {
		return 0, fmt.Errorf("decode etcd status: %w", err)
	}
	rev, err := status.Header.Revision.Int64()
	if err != nil || rev == 0 {
		return 0, errors.Join(fmt.Errorf("etcd status has no revision: %s", truncate(b)), err)
	}
	if _, err := post("/v3/kv/compaction", map[string]any{"revision": rev, "physical": true}); err != nil {
		return 0, err
	}
	return rev, nil
}

// recordPages records a LIST of path in two pages of limit items: first (with
// metadata.continue) and last (without).
func (r *recorder) recordPages(ctx context.Context, path string, limit int, first, last, whatFirst, whatLast string) error {
	q := url.Values{"limit": {itoa(limit)}}
	resp, err := r.ok(ctx, http.MethodGet, path, q, "", nil)
	if err != nil {
		return err
	}
	if err := r.saveResponse(first, path, q, resp, whatFirst); err != nil {
		return err
	}
	page, err := decodeMeta(resp.body)
	if err != nil || page.Continue == "" {
		return fmt.Errorf("%s: no continue token (err %v)", first, err)
	}
	q = url.Values{"limit": {itoa(limit)}, "continue": {page.Continue}}
	resp, err = r.ok(ctx, http.MethodGet, path, q, "", nil)
	if err != nil {
		return err
	}
	if end, err := decodeMeta(resp.body); err != nil || end.Continue != "" {
		return fmt.Errorf("%s: want the last page, without a continue token (err %v)", last, err)
	}
	return r.saveResponse(last, path, url.Values{"limit": {itoa(limit)}, "continue": {"<from page 1>"}}, resp, whatLast)
}

// saveResponse writes a whole response body and notes it.
func (r *recorder) saveResponse(file, path string, q url.Values, resp response, what string) error {
	if err := r.save(file, resp.body); err != nil {
		return err
	}
	return r.note(file, pathOf(path, q), resp.status, resp.contentType, what)
}
