package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Secret types the recordings cover. helmRelease is the one a cluster-wide watch
// excludes server-side: Helm keeps up to 1 MiB per release in it and it can never
// carry our annotation.
const (
	typeOpaque      = "Opaque"
	typeTLS         = "kubernetes.io/tls"
	typeDockerCfg   = "kubernetes.io/dockerconfigjson"
	typeHelmRelease = "helm.sh/release.v1"
)

// notHelm is the field selector that leaves Helm's release Secrets out.
const notHelm = "type!=" + typeHelmRelease

// secretsWatchTimeout is the timeoutSeconds of the secrets watch: room for its steps
// (a second or two), after which the server ends the stream itself.
const secretsWatchTimeout = 20

func (r *recorder) secrets() string { return "/api/v1/namespaces/" + r.ns + "/secrets" }

// secret is a Secret to create: data values are bytes, which encoding/json writes as
// base64, as the API expects.
type secret struct {
	name, typ   string
	annotations map[string]string
	labels      map[string]string
	data        map[string][]byte
}

func (s secret) json() []byte {
	b, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": s.name, "annotations": s.annotations, "labels": s.labels},
		"type":     s.typ,
		"data":     s.data,
	})
	return b
}

func (r *recorder) createSecret(ctx context.Context, s secret) error {
	if _, err := r.ok(ctx, http.MethodPost, r.secrets(), nil, "application/json", s.json()); err != nil {
		return fmt.Errorf("create secret %s: %w", s.name, err)
	}
	return nil
}

// patchSecret applies a JSON merge patch; []byte values in it go out as base64.
func (r *recorder) patchSecret(ctx context.Context, name string, patch any) error {
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if _, err := r.ok(ctx, http.MethodPatch, r.secrets()+"/"+name, nil, "application/merge-patch+json", b); err != nil {
		return fmt.Errorf("patch secret %s: %w", name, err)
	}
	return nil
}

// binary returns n bytes, the same for the same seed, that are not valid UTF-8 (they
// start with 0xff 0xfe, which no UTF-8 text can), so that a digest over a value's
// decoded bytes is pinned on bytes a string conversion would mangle.
func binary(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 0xb1a7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	copy(b, []byte{0xff, 0xfe, 0x00})
	return b
}

// pemLike returns a PEM-shaped block of harmless text: the API server checks only that
// a kubernetes.io/tls Secret has both keys, never what they hold, and a real key in
// testdata would be flagged by every secret scanner.
func pemLike(kind string, seed uint64) []byte {
	body := base64.StdEncoding.EncodeToString([]byte(text(seed, 300)))
	var b strings.Builder
	b.WriteString("-----BEGIN " + kind + "-----\n")
	for len(body) > 64 {
		b.WriteString(body[:64] + "\n")
		body = body[64:]
	}
	b.WriteString(body + "\n-----END " + kind + "-----\n")
	return []byte(b.String())
}

// dockerConfig returns a .dockerconfigjson for a made-up registry and user.
func dockerConfig(password string) []byte {
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{"registry.example": map[string]any{
		"username": "recorder", "password": password,
		"auth": base64.StdEncoding.EncodeToString([]byte("recorder:" + password)),
	}}})
	return b
}

// helmRelease is what `helm install` leaves behind (the release itself made-up text,
// where Helm keeps a gzipped, base64 manifest).
func helmRelease(version int) secret {
	v := itoa(version)
	return secret{
		name: "sh.helm.release.v1.webapp.v" + v, typ: typeHelmRelease,
		labels: map[string]string{"owner": "helm", "name": "webapp", "version": v, "status": "deployed"},
		data:   map[string][]byte{"release": []byte(text(uint64(100+version), 512))},
	}
}

// recordSecrets records, with the watch cache on, what a controller watching Secrets
// is fed: the LIST (whole, paged, and without Helm releases), a watch carrying every
// event type and change it must tell apart, and the TLS and registry-credential types.
func (r *recorder) recordSecrets(ctx context.Context) error {
	if resp, err := r.do(ctx, http.MethodGet, r.secrets()+"/webapp-secret", nil, "", nil); err != nil {
		return err
	} else if resp.status != http.StatusNotFound {
		return fmt.Errorf("secret %s/webapp-secret exists already (HTTP %d): record into a fresh cluster", r.ns, resp.status)
	}
	for _, s := range []secret{
		{name: "webapp-secret", typ: typeOpaque, annotations: map[string]string{selectorAnnotation: "app=webapp"},
			data: map[string][]byte{"password": []byte("not-a-real-password")}},
		{name: "other-secret", typ: typeOpaque, data: map[string][]byte{"token": []byte("not-a-real-token")}},
		helmRelease(1),
	} {
		if err := r.createSecret(ctx, s); err != nil {
			return err
		}
	}

	resp, err := r.ok(ctx, http.MethodGet, r.secrets(), nil, "", nil)
	if err != nil {
		return err
	}
	if got, want := itemNames(resp.body), []string{"other-secret", helmRelease(1).name, "webapp-secret"}; !slices.Equal(got, want) {
		return fmt.Errorf("secrets LIST holds %v, want %v", got, want)
	}
	if err := r.saveResponse("secrets-list.json", r.secrets(), nil, resp,
		"Secret LIST: `webapp-secret` (Opaque, annotated `app=webapp`), `other-secret` (Opaque, not annotated) and "+
			"`"+helmRelease(1).name+"` (type `"+typeHelmRelease+"`, as `helm install` leaves it)"); err != nil {
		return err
	}

	if err := r.recordPages(ctx, r.secrets(), 2, "secrets-list-page-1.json", "secrets-list-page-2.json",
		"first page of the same LIST: two items and `metadata.continue`", "last page: one item, no `continue`"); err != nil {
		return err
	}

	q := url.Values{"fieldSelector": {notHelm}}
	resp, err = r.ok(ctx, http.MethodGet, r.secrets(), q, "", nil)
	if err != nil {
		return err
	}
	if got, want := itemNames(resp.body), []string{"other-secret", "webapp-secret"}; !slices.Equal(got, want) {
		return fmt.Errorf("secrets LIST with %s holds %v, want %v: the server did not filter", notHelm, got, want)
	}
	if err := r.saveResponse("secrets-list-not-helm.json", r.secrets(), q, resp,
		"the same Secrets listed with a field selector on `type`: the Helm release is left out by the server"); err != nil {
		return err
	}
	notHelmList, err := decodeMeta(resp.body)
	if err != nil {
		return err
	}

	if err := r.recordSecretsWatch(ctx, notHelmList.ResourceVersion); err != nil {
		return err
	}
	if err := r.recordSecretTyped(ctx, "secret-tls-rotated.ndjson",
		secret{name: "webapp-tls", typ: typeTLS, annotations: map[string]string{selectorAnnotation: "app=webapp"},
			data: map[string][]byte{"tls.crt": pemLike("CERTIFICATE", 1), "tls.key": pemLike("EXAMPLE KEY", 2)}},
		map[string][]byte{"tls.crt": pemLike("CERTIFICATE", 3), "tls.key": pemLike("EXAMPLE KEY", 4)},
		"rotated: `tls.crt` and `tls.key` both replaced, as cert-manager renews (PEM-shaped text, not a real "+
			"certificate or key: the server checks only that both keys exist)"); err != nil {
		return err
	}
	return r.recordSecretTyped(ctx, "secret-dockerconfigjson.ndjson",
		secret{name: "registry-credentials", typ: typeDockerCfg, annotations: map[string]string{selectorAnnotation: "app=webapp"},
			data: map[string][]byte{".dockerconfigjson": dockerConfig("first-made-up-password")}},
		map[string][]byte{".dockerconfigjson": dockerConfig("second-made-up-password")},
		"`.dockerconfigjson` replaced (a made-up registry and password; the server checks it is JSON)")
}

// itemNames returns the names of a LIST's items, sorted.
func itemNames(body []byte) []string {
	var l struct {
		Items []struct {
			Metadata meta `json:"metadata"`
		} `json:"items"`
	}
	if json.Unmarshal(body, &l) != nil {
		return nil
	}
	var names []string
	for _, it := range l.Items {
		names = append(names, it.Metadata.Name)
	}
	slices.Sort(names)
	return names
}

// describeSecret renders a Secret event for the README: type, name, revision.
func describeSecret(ev streamEvent) string {
	return ev.Type + " " + ev.Object.Metadata.Name + "@" + ev.Object.Metadata.ResourceVersion
}

// recordSecretsWatch watches Secrets without Helm releases (as a cluster-wide
// controller would) from the filtered LIST's resourceVersion while it creates an
// annotated Opaque Secret with a binary value, changes its data, changes an
// annotation only, creates a Helm release (which must not show), writes a value
// through stringData (which must arrive as data) and deletes the Secret; then reads
// the stream until the server's timeout ends it.
func (r *recorder) recordSecretsWatch(ctx context.Context, rv string) error {
	const file, name = "secrets-watch-events.ndjson", "watched-secret"
	q := url.Values{"watch": {"true"}, "resourceVersion": {rv}, "allowWatchBookmarks": {"true"},
		"timeoutSeconds": {itoa(secretsWatchTimeout)}, "fieldSelector": {notHelm}}
	s, bad, err := r.watch(ctx, r.secrets(), q, file)
	if err != nil {
		return err
	}
	if s == nil {
		return fmt.Errorf("secrets watch from %s: HTTP %d: %s", rv, bad.status, truncate(bad.body))
	}
	const stringDataValue = "Hello from stringData"
	var seen []string
	var prev streamEvent
	steps := []struct {
		what  string
		do    func() error
		check func(ev streamEvent) error // nil: the step must show no event of its own
	}{
		{"ADDED with a binary value", func() error {
			return r.createSecret(ctx, secret{name: name, typ: typeOpaque,
				annotations: map[string]string{selectorAnnotation: "app=webapp"},
				data:        map[string][]byte{"blob": binary(1, 32), "message": []byte("Hello")}})
		}, func(ev streamEvent) error {
			return wantEvent(ev, "ADDED", name, func() bool {
				b, err := base64.StdEncoding.DecodeString(ev.Object.Data["blob"])
				return err == nil && !utf8.Valid(b) && ev.Object.Type == typeOpaque
			})
		}},
		{"MODIFIED: the binary value changed", func() error {
			return r.patchSecret(ctx, name, map[string]any{"data": map[string][]byte{"blob": binary(2, 32)}})
		}, func(ev streamEvent) error {
			return wantEvent(ev, "MODIFIED", name, func() bool { return ev.Object.Data["blob"] != prev.Object.Data["blob"] })
		}},
		{"MODIFIED: an annotation only", func() error {
			return r.patchSecret(ctx, name, map[string]any{"metadata": map[string]any{"annotations": map[string]string{"example.com/owner": "team-a"}}})
		}, func(ev streamEvent) error {
			return wantEvent(ev, "MODIFIED", name, func() bool {
				return ev.Object.Metadata.Annotations["example.com/owner"] == "team-a" && maps.Equal(ev.Object.Data, prev.Object.Data)
			})
		}},
		{"a Helm release created (no event: filtered out)", func() error {
			return r.createSecret(ctx, helmRelease(2))
		}, nil},
		{"MODIFIED: a value written through stringData", func() error {
			return r.patchSecret(ctx, name, map[string]any{"stringData": map[string]string{"message": stringDataValue}})
		}, func(ev streamEvent) error {
			return wantEvent(ev, "MODIFIED", name, func() bool {
				return ev.Object.Data["message"] == base64.StdEncoding.EncodeToString([]byte(stringDataValue)) && ev.Object.StringData == nil
			})
		}},
		{"DELETED", func() error {
			_, err := r.ok(ctx, http.MethodDelete, r.secrets()+"/"+name, nil, "", nil)
			return err
		}, func(ev streamEvent) error { return wantEvent(ev, "DELETED", name, func() bool { return true }) }},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			s.stop()
			return fmt.Errorf("%s: %s: %w", file, st.what, err)
		}
		if st.check == nil {
			continue // the next step's event, the next in the stream, shows there was none
		}
		ev, err := s.next(15 * time.Second)
		if err == nil {
			seen = append(seen, describeSecret(ev))
			err = st.check(ev)
		}
		if err != nil {
			s.stop()
			return fmt.Errorf("%s: %s: %w (seen %v)", file, st.what, err, seen)
		}
		prev = ev
	}
	rest, err := s.finish((secretsWatchTimeout + 20) * time.Second)
	if err != nil {
		return fmt.Errorf("%s: %w (seen %v)", file, err, seen)
	}
	if slices.ContainsFunc(rest, func(t string) bool { return t != "BOOKMARK" }) {
		return fmt.Errorf("%s: after DELETED got %v, want BOOKMARKs only (seen %v)", file, rest, seen)
	}
	return r.note(file, pathOf(r.secrets(), q), s.status, s.contentType,
		"watch of the Secrets that are not Helm releases, from that LIST's resourceVersion, while the recorder created `"+name+
			"` (Opaque, annotated `app=webapp`, key `blob` 32 bytes that are not UTF-8), replaced `blob`, added the annotation "+
			"`example.com/owner` (metadata only: data unchanged), created the Helm release `"+helmRelease(2).name+
			"` (no event: the field selector holds on the watch too), wrote `message` through `stringData` (it arrives as `data`; "+
			"no `stringData` in the event), deleted it. Events, in order: "+strings.Join(seen, ", ")+
			"; then "+fmt.Sprint(len(rest))+" BOOKMARK(s) before the server's timeout ended the stream cleanly")
}

// recordSecretTyped watches from the current resourceVersion while it creates s and
// then replaces its data with data: one ADDED, one MODIFIED, of s's type.
func (r *recorder) recordSecretTyped(ctx context.Context, file string, s secret, data map[string][]byte, what string) error {
	resp, err := r.ok(ctx, http.MethodGet, r.secrets(), url.Values{"limit": {"1"}}, "", nil)
	if err != nil {
		return err
	}
	list, err := decodeMeta(resp.body)
	if err != nil {
		return err
	}
	q := url.Values{"watch": {"true"}, "resourceVersion": {list.ResourceVersion}, "allowWatchBookmarks": {"true"}, "timeoutSeconds": {"30"}}
	st, bad, err := r.watch(ctx, r.secrets(), q, file)
	if err != nil {
		return err
	}
	if st == nil {
		return fmt.Errorf("%s: watch from %s: HTTP %d: %s", file, list.ResourceVersion, bad.status, truncate(bad.body))
	}
	var seen []string
	var prev streamEvent
	for _, step := range []struct {
		event string
		do    func() error
	}{
		{"ADDED", func() error { return r.createSecret(ctx, s) }},
		{"MODIFIED", func() error { return r.patchSecret(ctx, s.name, map[string]any{"data": data}) }},
	} {
		if err := step.do(); err != nil {
			st.stop()
			return fmt.Errorf("%s: %w", file, err)
		}
		ev, err := st.next(15 * time.Second)
		if err == nil {
			seen = append(seen, describeSecret(ev))
			err = wantEvent(ev, step.event, s.name, func() bool {
				return ev.Object.Type == s.typ && (step.event == "ADDED" || !maps.Equal(ev.Object.Data, prev.Object.Data))
			})
		}
		if err != nil {
			st.stop()
			return fmt.Errorf("%s: %w (seen %v)", file, err, seen)
		}
		prev = ev
	}
	if err := st.stop(); err != nil {
		return err
	}
	if _, err := r.ok(ctx, http.MethodDelete, r.secrets()+"/"+s.name, nil, "", nil); err != nil {
		return err
	}
	return r.note(file, pathOf(r.secrets(), q), st.status, st.contentType,
		"Secret `"+s.name+"` of type `"+s.typ+"` (annotated `app=webapp`): "+strings.Join(seen, ", ")+", "+what+
			"; the stream was closed by the client after the event")
}

// wantEvent checks an event's type and object name, then ok for what the step did.
func wantEvent(ev streamEvent, typ, name string, ok func() bool) error {
	if ev.Type != typ || ev.Object.Metadata.Name != name {
		return fmt.Errorf("got %s %s, want %s %s", ev.Type, ev.Object.Metadata.Name, typ, name)
	}
	if !ok() {
		return fmt.Errorf("%s %s does not show the change made", typ, name)
	}
	return nil
}
