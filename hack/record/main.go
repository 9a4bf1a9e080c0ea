// Command record captures real API server responses into testdata/recorded/, byte for
// byte as the server wrote them, for config-watcher's replay tests.
//
// It talks to the API server through a `kubectl proxy` ambassador, exactly as
// config-watcher does, and to etcd's JSON gateway to compact history. Run it against a
// fresh control plane (hack/record.sh starts two: one with the watch cache on, the
// default and what production runs, and one with it off, which is what makes an old
// resourceVersion answer 410 once etcd is compacted):
//
//	record -phase cached   -proxy $CW_PROXY_URL -out testdata/recorded
//	record -phase uncached -proxy $CW_PROXY_URL -etcd $CW_ETCD_URL -out testdata/recorded
//	record -phase secrets  -proxy $CW_PROXY_URL -out testdata/recorded
//
// The secrets phase (watch cache on) has a control plane of its own so that it can be
// recorded, or re-recorded, without touching the other phases' files.
//
// Each phase prints one Markdown table row per file it wrote (-index appends them to a
// file), which hack/record.sh puts in testdata/recorded/README.md.
//
// Stdlib only.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const selectorAnnotation = "k8spatterns.io/podDeleteSelector"

func main() {
	log.SetFlags(0)
	log.SetPrefix("record: ")
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	var r recorder
	flag.StringVar(&r.phase, "phase", "", "cached (watch cache on), uncached (watch cache off) or secrets (watch cache on)")
	flag.StringVar(&r.proxy, "proxy", os.Getenv("CW_PROXY_URL"), "kubectl proxy URL (env CW_PROXY_URL)")
	flag.StringVar(&r.etcd, "etcd", os.Getenv("CW_ETCD_URL"), "etcd client URL, for compaction (env CW_ETCD_URL)")
	flag.StringVar(&r.out, "out", "testdata/recorded", "output directory")
	flag.StringVar(&r.ns, "namespace", "default", "namespace to work in")
	flag.StringVar(&r.index, "index", "", "append a Markdown table row per file written to this file")
	flag.Parse()
	if r.proxy == "" {
		return errors.New("no proxy URL: set -proxy or CW_PROXY_URL")
	}
	r.proxy = strings.TrimRight(r.proxy, "/")
	if err := os.MkdirAll(r.out, 0o755); err != nil {
		return err
	}
	ctx := context.Background()
	if err := r.readVersion(ctx); err != nil {
		return err
	}
	switch r.phase {
	case "cached":
		return r.recordCached(ctx)
	case "uncached":
		if r.etcd == "" {
			return errors.New("no etcd URL: set -etcd or CW_ETCD_URL")
		}
		return r.recordUncached(ctx)
	case "secrets":
		return r.recordSecrets(ctx)
	default:
		return fmt.Errorf("-phase must be cached, uncached or secrets, not %q", r.phase)
	}
}

type recorder struct {
	phase, proxy, etcd, out, ns, index string
	server                             string // gitVersion of the API server
}

// --- HTTP -------------------------------------------------------------------------------

type response struct {
	status      int
	contentType string
	body        []byte
}

func (r *recorder) url(path string, q url.Values) string {
	u := r.proxy + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// Accept headers. Every recording asks for acceptJSON, as config-watcher's requests do,
// except the metadata-only ones, which ask for what a watch.ListWatcher with
// MetadataOnly sends (apiclient.MetadataListAccept and apiclient.MetadataAccept, copied here
// because the recorder is stdlib only; a test keeps the copies equal).
const (
	acceptJSON         = "application/json"
	acceptMetadataList = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
	acceptMetadata     = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

// do sends one request through the proxy and returns the whole answer, whatever its status.
func (r *recorder) do(ctx context.Context, method, path string, q url.Values, contentType string, body []byte) (response, error) {
	return r.doAs(ctx, acceptJSON, method, path, q, contentType, body)
}

// doAs is do with the given Accept header.
func (r *recorder) doAs(ctx context.Context, accept, method, path string, q url.Values, contentType string, body []byte) (response, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, r.url(path, q), bytes.NewReader(body))
	if err != nil {
		return response{}, fmt.Errorf("create request: %w", err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: read body: %w", method, path, err)
	}
	return response{resp.StatusCode, resp.Header.Get("Content-Type"), b}, nil
}

// ok is do, requiring a 2xx answer.
func (r *recorder) ok(ctx context.Context, method, path string, q url.Values, contentType string, body []byte) (response, error) {
	return r.okAs(ctx, acceptJSON, method, path, q, contentType, body)
}

// okAs is ok with the given Accept header.
func (r *recorder) okAs(ctx context.Context, accept, method, path string, q url.Values, contentType string, body []byte) (response, error) {
	resp, err := r.doAs(ctx, accept, method, path, q, contentType, body)
	if err != nil {
		return resp, err
	}
	if resp.status/100 != 2 {
		return resp, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.status, truncate(resp.body))
	}
	return resp, nil
}

func (r *recorder) readVersion(ctx context.Context) error {
	resp, err := r.ok(ctx, http.MethodGet, "/version", nil, "", nil)
	if err != nil {
		return err
	}
	var v struct {
		GitVersion string `json:"gitVersion"`
	}
	if err := json.Unmarshal(resp.body, &v); err != nil {
		return fmt.Errorf("decode /version: %w", err)
	}
	r.server = v.GitVersion
	return nil
}

func truncate(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// --- watch ------------------------------------------------------------------------------

// stream is an open watch: every complete line the server sends is written to the file
// as is, and what the recorder needs of its event is delivered on events.
type stream struct {
	status      int
	contentType string
	events      chan streamEvent // closed at the end of the stream
	done        chan error       // the read error that ended the stream (nil on clean EOF)
	cancel      context.CancelFunc
	lines       int
}

// streamEvent is what the recorder reads of one event: its type and its object's
// name, uid, resourceVersion, labels and annotations, and for a Secret its type and
// data.
type streamEvent struct {
	Type   string `json:"type"`
	Object struct {
		Metadata struct {
			Name            string            `json:"name"`
			UID             string            `json:"uid"`
			ResourceVersion string            `json:"resourceVersion"`
			Labels          map[string]string `json:"labels"`
			Annotations     map[string]string `json:"annotations"`
			// DeletionTimestamp is set once the object is terminating.
			DeletionTimestamp *string `json:"deletionTimestamp"`
		} `json:"metadata"`
		// Type, Data (base64 values) and StringData are a Secret's: strings, not
		// []byte, because a ConfigMap's data is plain text that would not decode.
		Type       string            `json:"type"`
		Data       map[string]string `json:"data"`
		StringData json.RawMessage   `json:"stringData"`
	} `json:"object"`
}

// watch opens a watch request. On a non-200 answer it returns the response body and
// no stream. Lines are written to file only once they are complete.
func (r *recorder) watch(ctx context.Context, path string, q url.Values, file string) (*stream, response, error) {
	return r.watchAs(ctx, acceptJSON, path, q, file)
}

// watchAs is watch with the given Accept header.
func (r *recorder) watchAs(ctx context.Context, accept, path string, q url.Values, file string) (*stream, response, error) {
	ctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url(path, q), nil)
	if err != nil {
		cancel()
		return nil, response{}, fmt.Errorf("create request: %w", err)
	}
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		return nil, response{}, fmt.Errorf("watch %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return nil, response{resp.StatusCode, resp.Header.Get("Content-Type"), b}, err
	}
	f, err := os.Create(filepath.Join(r.out, file))
	if err != nil {
		cancel()
		resp.Body.Close()
		return nil, response{}, err
	}
	s := &stream{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"),
		events: make(chan streamEvent, 64), done: make(chan error, 1), cancel: cancel}
	go func() {
		defer resp.Body.Close()
		defer f.Close()
		defer close(s.events)
		br := bufio.NewReaderSize(resp.Body, 1<<20)
		for {
			line, err := br.ReadBytes('\n')
			if len(line) > 0 && line[len(line)-1] == '\n' {
				if _, werr := f.Write(line); werr != nil {
					s.done <- werr
					return
				}
				var ev streamEvent
				if jerr := json.Unmarshal(line, &ev); jerr != nil {
					s.done <- fmt.Errorf("decode event line: %w", jerr)
					return
				}
				s.lines++
				s.events <- ev
			}
			if err != nil {
				if errors.Is(err, io.EOF) || ctx.Err() != nil {
					err = nil
				}
				s.done <- err
				return
			}
		}
	}()
	return s, response{}, nil
}

// expect waits for the next event on s and checks its type.
func (s *stream) expect(want string, timeout time.Duration) error {
	select {
	case got, ok := <-s.events:
		if !ok {
			return fmt.Errorf("stream ended while waiting for %s", want)
		}
		if got.Type != want {
			return fmt.Errorf("got a %s event, want %s", got.Type, want)
		}
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("no %s event within %s", want, timeout)
	}
}

// next waits for the next event on s, whatever it is.
func (s *stream) next(timeout time.Duration) (streamEvent, error) {
	select {
	case ev, ok := <-s.events:
		if !ok {
			return streamEvent{}, errors.New("stream ended")
		}
		return ev, nil
	case <-time.After(timeout):
		return streamEvent{}, fmt.Errorf("no event within %s", timeout)
	}
}

// finish waits for the server to end the stream and returns the remaining event types.
func (s *stream) finish(timeout time.Duration) ([]string, error) {
	var rest []string
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				return rest, <-s.done
			}
			rest = append(rest, ev.Type)
		case <-deadline:
			s.cancel()
			return rest, fmt.Errorf("stream still open after %s", timeout)
		}
	}
}

// stop closes the stream from our side and waits until the file is complete.
func (s *stream) stop() error {
	s.cancel()
	for range s.events {
	}
	return <-s.done
}

// --- objects ------------------------------------------------------------------------------

type meta struct {
	Name            string `json:"name"`
	ResourceVersion string `json:"resourceVersion"`
	Continue        string `json:"continue"`
}

func decodeMeta(b []byte) (meta, error) {
	var o struct {
		Metadata meta `json:"metadata"`
	}
	err := json.Unmarshal(b, &o)
	return o.Metadata, err
}

func (r *recorder) configMaps() string { return "/api/v1/namespaces/" + r.ns + "/configmaps" }

func configMapJSON(name string, annotations, data map[string]string) []byte {
	cm := map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "annotations": annotations},
		"data":     data,
	}
	b, _ := json.Marshal(cm)
	return b
}

// createConfigMap creates a ConfigMap and returns its resourceVersion.
func (r *recorder) createConfigMap(ctx context.Context, name string, annotations, data map[string]string) (string, error) {
	resp, err := r.ok(ctx, http.MethodPost, r.configMaps(), nil, "application/json", configMapJSON(name, annotations, data))
	if err != nil {
		return "", fmt.Errorf("create configmap %s: %w", name, err)
	}
	m, err := decodeMeta(resp.body)
	return m.ResourceVersion, err
}

// patchConfigMap applies a JSON merge patch and returns the new resourceVersion.
func (r *recorder) patchConfigMap(ctx context.Context, name string, patch any) (string, error) {
	b, err := json.Marshal(patch)
	if err != nil {
		return "", err
	}
	resp, err := r.ok(ctx, http.MethodPatch, r.configMaps()+"/"+name, nil, "application/merge-patch+json", b)
	if err != nil {
		return "", fmt.Errorf("patch configmap %s: %w", name, err)
	}
	m, err := decodeMeta(resp.body)
	return m.ResourceVersion, err
}

// --- output -------------------------------------------------------------------------------

func (r *recorder) save(file string, b []byte) error {
	return os.WriteFile(filepath.Join(r.out, file), b, 0o644)
}

// note prints (and appends to -index) a README table row for a file just written.
func (r *recorder) note(file, request string, status int, contentType, what string) error {
	watchCache := "on"
	if r.phase == "uncached" {
		watchCache = "off"
	}
	st, _ := os.Stat(filepath.Join(r.out, file))
	size := int64(0)
	if st != nil {
		size = st.Size()
	}
	row := fmt.Sprintf("| `%s` | %s | `%s` | %d, `%s` | %s | %s |\n",
		file, watchCache, strings.ReplaceAll(request, "|", `\|`), status, contentType, humanSize(size), what)
	fmt.Print(row)
	if r.index == "" {
		return nil
	}
	f, err := os.OpenFile(r.index, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(row)
	return err
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// pathOf renders a request the way the README shows it: path and decoded query.
func pathOf(path string, q url.Values) string {
	if len(q) == 0 {
		return "GET " + path
	}
	s, _ := url.QueryUnescape(q.Encode())
	return "GET " + path + "?" + s
}

// text returns about n bytes of random-looking but harmless English-ish text, the same
// for the same seed: lines of words with the odd quote, backslash and tab, so that
// JSON escaping is exercised too.
func text(seed uint64, n int) string {
	words := strings.Fields(`lorem ipsum config watcher pod deployment replica label selector annotation
		namespace ambassador proxy stream bookmark event resource version restart rollout sidecar
		kubernetes pattern immutable declarative health probe quota limit node cluster volume mount
		"quoted" back\slash tab	stop über café naïve 東京 data binary hash digest`)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var b strings.Builder
	col := 0
	for b.Len() < n {
		w := words[rng.IntN(len(words))]
		if col+len(w) > 72 {
			b.WriteByte('\n')
			col = 0
		} else if col > 0 {
			b.WriteByte(' ')
			col++
		}
		b.WriteString(w)
		col += len(w)
	}
	return b.String()[:n]
}

// payload splits about size bytes of text into keys of at most 64 KiB, counting keys
// too, as the API server does when it enforces the 1 MiB limit.
func payload(seed uint64, size int) map[string]string {
	const chunk = 64 << 10
	data := map[string]string{}
	for i := 0; size > 0; i++ {
		key := fmt.Sprintf("part-%03d.txt", i)
		n := min(chunk, size-len(key))
		// Cut on a rune boundary: the text has multi-byte runes.
		v := []rune(text(seed+uint64(i), n))
		s := string(v)
		for len(s) > n {
			v = v[:len(v)-1]
			s = string(v)
		}
		data[key] = s
		size -= len(key) + len(s)
		if n < 1 {
			break
		}
	}
	return data
}

func eventuallyDo(timeout time.Duration, what string, f func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := f()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

func readAll(resp *http.Response) ([]byte, error) {
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	return b, nil
}
