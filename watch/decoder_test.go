package watch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

// Lines in the shapes the API server sends (see KUBE-API-NOTES.md).
const (
	modifiedLine = `{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"webapp-config","namespace":"default",` +
		`"uid":"0d3c5e8e-2b4f-4c1a-a7de-6a9d3e1f2b77","resourceVersion":"123","creationTimestamp":"2025-06-01T10:00:00Z",` +
		`"annotations":{"k8spatterns.io/podDeleteSelector":"app=webapp"}},"data":{"message":"Hello, World"}}}`
	bookmarkLine = `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"12345",` +
		`"creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}}}}`
	expiredLine = `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",` +
		`"message":"too old resource version: 1 (2)","reason":"Expired","code":410}}`
	tooLargeLine = tooLarge
)

// outcomes reads dec to its end and renders each result: "TYPE rv",
// "malformed", "EOF", "unexpected EOF" or "error: …".
func outcomes(dec *Decoder) []string {
	var out []string
	for range 1000 { // each call consumes at least one line; far more than any case has
		ev, err := dec.Next()
		var malformed *MalformedError
		switch {
		case errors.Is(err, io.EOF):
			return append(out, "EOF")
		case errors.Is(err, io.ErrUnexpectedEOF):
			return append(out, "unexpected EOF")
		case errors.As(err, &malformed):
			out = append(out, "malformed")
		case err != nil:
			return append(out, "error: "+err.Error())
		default:
			out = append(out, string(ev.Type)+" "+ev.ResourceVersion)
		}
	}
	return append(out, "no end")
}

// TestDecoderNext ensures every line form decodes to its event or to a
// MalformedError the stream survives, blank lines are skipped, a clean end is
// io.EOF and a cut line io.ErrUnexpectedEOF, however the reader splits its data.
func TestDecoderNext(t *testing.T) {
	noRV := strings.Replace(modifiedLine, `"resourceVersion":"123",`, "", 1)
	tests := []struct {
		name  string
		input string
		want  []string
	}{
		{name: "ModifiedEvent", input: modifiedLine + "\n", want: []string{"MODIFIED 123", "EOF"}},
		{name: "AddedAndDeletedEvents", input: strings.Replace(modifiedLine, "MODIFIED", "ADDED", 1) + "\n" + strings.Replace(modifiedLine, "MODIFIED", "DELETED", 1) + "\n", want: []string{"ADDED 123", "DELETED 123", "EOF"}},
		{name: "BookmarkCarriesRV", input: bookmarkLine + "\n", want: []string{"BOOKMARK 12345", "EOF"}},
		{name: "ExpiredErrorEventHasNoRV", input: expiredLine + "\n", want: []string{"ERROR ", "EOF"}},
		{name: "TooLargeErrorEvent", input: tooLargeLine + "\n", want: []string{"ERROR ", "EOF"}},
		{name: "EventsInOrder", input: modifiedLine + "\n" + bookmarkLine + "\n" + expiredLine + "\n", want: []string{"MODIFIED 123", "BOOKMARK 12345", "ERROR ", "EOF"}},
		{name: "BlankLinesSkipped", input: "\n\n   \n" + modifiedLine + "\n\t\n\r\n" + bookmarkLine + "\n\n", want: []string{"MODIFIED 123", "BOOKMARK 12345", "EOF"}},
		{name: "CRLFLineEnd", input: modifiedLine + "\r\n", want: []string{"MODIFIED 123", "EOF"}},
		{name: "LeadingSpacesKeepObjectInPlace", input: " \t" + bookmarkLine + "\n", want: []string{"BOOKMARK 12345", "EOF"}},
		{name: "PrettyPrintedSpacesInLine", input: `{ "type" : "BOOKMARK" , "object" : { "metadata" : { "resourceVersion" : "7" } } }` + "\n", want: []string{"BOOKMARK 7", "EOF"}},
		{name: "EmptyStreamIsEOF", input: "", want: []string{"EOF"}},
		{name: "OnlyBlanksIsEOF", input: "\n \n\t", want: []string{"EOF"}},
		{name: "CutLineIsUnexpectedEOF", input: modifiedLine + "\n" + modifiedLine[:70], want: []string{"MODIFIED 123", "unexpected EOF"}},
		{name: "CompleteEventWithoutNewlineIsUnexpectedEOF", input: modifiedLine, want: []string{"unexpected EOF"}},
		{name: "GarbageLineMalformedThenNextRead", input: "garbage\n" + modifiedLine + "\n", want: []string{"malformed", "MODIFIED 123", "EOF"}},
		{name: "CutJSONWithNewlineMalformed", input: modifiedLine[:70] + "\n" + bookmarkLine + "\n", want: []string{"malformed", "BOOKMARK 12345", "EOF"}},
		{name: "TwoObjectsOnOneLineMalformed", input: modifiedLine + modifiedLine + "\n", want: []string{"malformed", "EOF"}},
		{name: "UnknownEventTypeMalformed", input: strings.Replace(modifiedLine, "MODIFIED", "UPSERTED", 1) + "\n" + bookmarkLine + "\n", want: []string{"malformed", "BOOKMARK 12345", "EOF"}},
		{name: "SyncedIsNotAStreamType", input: strings.Replace(modifiedLine, "MODIFIED", "SYNCED", 1) + "\n", want: []string{"malformed", "EOF"}},
		{name: "LowercaseTypeMalformed", input: strings.Replace(modifiedLine, "MODIFIED", "modified", 1) + "\n", want: []string{"malformed", "EOF"}},
		{name: "TypeNotAStringMalformed", input: `{"type":1,"object":{"metadata":{"resourceVersion":"1"}}}` + "\n", want: []string{"malformed", "EOF"}},
		{name: "MissingTypeMalformed", input: `{"object":{"metadata":{"resourceVersion":"1"}}}` + "\n", want: []string{"malformed", "EOF"}},
		{name: "ArrayNotAnObjectMalformed", input: `[{"type":"MODIFIED"}]` + "\n", want: []string{"malformed", "EOF"}},
		{name: "StringNotAnObjectMalformed", input: `"MODIFIED"` + "\n", want: []string{"malformed", "EOF"}},
		{name: "NumberAndNullNotObjectsMalformed", input: "42\nnull\n", want: []string{"malformed", "malformed", "EOF"}},
		{name: "EventWithoutObjectMalformed", input: `{"type":"MODIFIED"}` + "\n", want: []string{"malformed", "EOF"}},
		{name: "ObjectNullMalformed", input: `{"type":"ADDED","object":null}` + "\n", want: []string{"malformed", "EOF"}},
		{name: "ObjectStringMalformed", input: `{"type":"ERROR","object":"too old resource version"}` + "\n", want: []string{"malformed", "EOF"}},
		{name: "EventWithoutRVMalformed", input: noRV + "\n", want: []string{"malformed", "EOF"}},
		{name: "BookmarkWithoutRVMalformed", input: `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"creationTimestamp":null}}}` + "\n", want: []string{"malformed", "EOF"}},
		{name: "EmptyRVMalformed", input: strings.Replace(modifiedLine, `"resourceVersion":"123"`, `"resourceVersion":""`, 1) + "\n", want: []string{"malformed", "EOF"}},
		{name: "ErrorEventWithoutStatusStillAnEvent", input: `{"type":"ERROR","object":{}}` + "\n", want: []string{"ERROR ", "EOF"}},
	}
	readers := []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{
		{"WholeReads", func(r io.Reader) io.Reader { return r }},
		{"OneByteReads", iotest.OneByteReader},
		{"HalfReads", iotest.HalfReader},
		{"DataWithEOF", iotest.DataErrReader},
	}
	for _, tt := range tests {
		for _, rd := range readers {
			t.Run(tt.name+"/"+rd.name, func(t *testing.T) {
				dec := NewDecoder(rd.wrap(strings.NewReader(tt.input)))
				assert.Equal(t, tt.want, outcomes(dec))
			})
		}
	}
}

// TestDecoderReadsEveryStream ensures every recorded and hand-made stream
// decodes line by line to what encoding/json reads in it (type,
// resourceVersion, the object's exact bytes), with nothing malformed, up to a
// clean io.EOF.
func TestDecoderReadsEveryStream(t *testing.T) {
	handMade, err := filepath.Glob("testdata/*.ndjson")
	require.NoError(t, err)
	recordings, err := filepath.Glob("../testdata/recorded/*.ndjson")
	require.NoError(t, err)
	if len(recordings) == 0 {
		t.Log("no recordings in ../testdata/recorded (make record): hand-made streams only")
	}
	require.NotEmpty(t, handMade)
	names := map[string]string{}
	for _, f := range handMade {
		names[f] = "HandMade/" + filepath.Base(f)
	}
	for _, f := range recordings {
		names[f] = "Recorded/" + filepath.Base(f)
	}
	for _, file := range append(handMade, recordings...) {
		t.Run(names[file], func(t *testing.T) {
			b, err := os.ReadFile(file)
			require.NoError(t, err)
			dec := NewDecoder(bytes.NewReader(b))
			for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
				var want struct {
					Type   string          `json:"type"`
					Object json.RawMessage `json:"object"`
				}
				require.NoError(t, json.Unmarshal([]byte(line), &want), "line %d", i+1)
				var meta struct {
					Metadata struct {
						ResourceVersion string `json:"resourceVersion"`
					} `json:"metadata"`
				}
				require.NoError(t, json.Unmarshal(want.Object, &meta), "line %d", i+1)
				if want.Type == string(Error) {
					meta.Metadata.ResourceVersion = ""
				}

				ev, err := dec.Next()
				require.NoError(t, err, "line %d", i+1)
				assert.Equal(t, want.Type, string(ev.Type), "line %d", i+1)
				assert.Equal(t, meta.Metadata.ResourceVersion, ev.ResourceVersion, "line %d", i+1)
				assert.True(t, bytes.Equal(want.Object, ev.Object), "line %d: object bytes differ", i+1)
			}
			_, err = dec.Next()
			assert.ErrorIs(t, err, io.EOF)
		})
	}
}

// TestDecoderObjectIsTheRawObject ensures Event.Object is exactly the bytes
// of the line's object, untouched, for a watched object and a Status alike.
func TestDecoderObjectIsTheRawObject(t *testing.T) {
	tests := []struct {
		name string
		line string
	}{
		{name: "Modified", line: modifiedLine},
		{name: "Bookmark", line: bookmarkLine},
		{name: "LeadingSpaces", line: " \t " + bookmarkLine},
		{name: "ErrorStatus", line: tooLargeLine},
		{name: "SpacesAndEscapesKept", line: `{"type":"ADDED", "object": {"metadata":{"resourceVersion":"5"},"data":{"a":"\"\u00fc\n\\"}} }`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want struct {
				Object json.RawMessage `json:"object"`
			}
			require.NoError(t, json.Unmarshal([]byte(tt.line), &want))
			ev, err := NewDecoder(strings.NewReader(tt.line + "\n")).Next()
			require.NoError(t, err)
			assert.Equal(t, string(want.Object), string(ev.Object))
		})
	}
}

// TestDecoderEventFieldsOutliveNext ensures an event's Type and
// ResourceVersion, which are strings, keep their value once the next line
// has been read (only Object is documented as valid until then).
func TestDecoderEventFieldsOutliveNext(t *testing.T) {
	added := strings.Replace(modifiedLine, `"MODIFIED"`, `"ADDED"`, 1)
	input := added + "\n" + bookmarkLine + "\n" + tooLargeLine + "\n" + strings.Repeat("x", 200) + "\n"
	dec := NewDecoder(strings.NewReader(input))
	first, err := dec.Next()
	require.NoError(t, err)
	second, err := dec.Next()
	require.NoError(t, err)
	_, err = dec.Next()
	require.NoError(t, err)
	_, err = dec.Next() // overwrites the line buffer with x's
	var malformed *MalformedError
	require.ErrorAs(t, err, &malformed)

	assert.Equal(t, Added, first.Type)
	assert.Equal(t, "123", first.ResourceVersion)
	assert.Equal(t, Bookmark, second.Type)
	assert.Equal(t, "12345", second.ResourceVersion)
}

// TestDecoderMalformedErrorHidesContent ensures a MalformedError tells the
// reason and length but never the line, which may hold ConfigMap data.
func TestDecoderMalformedErrorHidesContent(t *testing.T) {
	secret := "password=hunter2"
	for _, line := range []string{
		`{"type":"MODIFIED","object":{"data":{"p":"` + secret + `"}}}`, // no RV
		`{"type":"MODIFIED","object":{"data":{"p":"` + secret + `"}}`,  // cut
		`{"type":"UPSERTED","object":{"data":{"p":"` + secret + `"}}}`, // unknown type
	} {
		_, err := NewDecoder(strings.NewReader(line + "\n")).Next()
		var malformed *MalformedError
		require.ErrorAs(t, err, &malformed, line)
		assert.NotContains(t, err.Error(), "hunter2")
		assert.Equal(t, len(line)+1, malformed.Length)
	}
}

// TestDecoderReadErrorReturned ensures an error of the underlying reader (a
// reset connection) is returned as is, not taken for the end of the stream.
func TestDecoderReadErrorReturned(t *testing.T) {
	reset := errors.New("connection reset by peer")
	dec := NewDecoder(io.MultiReader(strings.NewReader(modifiedLine+"\n"+modifiedLine[:40]), iotest.ErrReader(reset)))
	ev, err := dec.Next()
	require.NoError(t, err)
	assert.Equal(t, Modified, ev.Type)
	_, err = dec.Next()
	assert.ErrorIs(t, err, reset)
}

// TestDecoderLongLines ensures lines far above bufio.Scanner's 64 KiB limit,
// including one above the buffer size the decoder keeps, decode intact, and
// the lines after them too.
func TestDecoderLongLines(t *testing.T) {
	for _, size := range []int{64 << 10, 100 << 10, 1 << 20, 3 << 20, keepLine + 1<<20} {
		t.Run(fmt.Sprintf("%dKiB", size>>10), func(t *testing.T) {
			// The value `"\ü` as JSON escapes it, repeated: built directly, as
			// json.Marshal of megabytes is slow under the race detector.
			obj := strings.Replace(configMap("big", "101", map[string]string{"big": "@"}), "@", strings.Repeat(`\"\\\u00fc`, size/10), 1)
			line := event(Modified, obj)
			require.Greater(t, len(line), size)
			dec := NewDecoder(strings.NewReader(line + "\n" + modifiedLine + "\n"))
			ev, err := dec.Next()
			require.NoError(t, err)
			assert.Equal(t, "101", ev.ResourceVersion)
			assert.True(t, bytes.Equal([]byte(obj), ev.Object), "object changed (len %d, want %d)", len(ev.Object), len(obj))
			ev, err = dec.Next()
			require.NoError(t, err)
			assert.Equal(t, "123", ev.ResourceVersion)
			assert.LessOrEqual(t, cap(dec.line), keepLine, "a line buffer above keepLine is not kept")
			_, err = dec.Next()
			assert.ErrorIs(t, err, io.EOF)
		})
	}
}

// repeatReader yields the same byte forever (by copy: a loop over bytes is
// slow under the race detector).
type repeatReader struct{ chunk []byte }

func newRepeatReader(c byte) *repeatReader {
	return &repeatReader{chunk: bytes.Repeat([]byte{c}, 256<<10)}
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		n += copy(p[n:], r.chunk)
	}
	return n, nil
}

// TestDecoderLineAboveMaxIsMalformed ensures a line longer than maxLine (16
// MiB) is skipped as malformed without being kept whole, and the next line is
// still read. The long line is generated as it is read.
func TestDecoderLineAboveMaxIsMalformed(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 16 MiB")
	}
	prefix := `{"type":"MODIFIED","object":{"metadata":{"resourceVersion":"1"},"data":{"a":"`
	input := io.MultiReader(
		strings.NewReader(prefix),
		io.LimitReader(newRepeatReader('a'), maxLine),
		strings.NewReader("\"}}}\n"+bookmarkLine+"\n"),
	)
	dec := NewDecoder(input)
	_, err := dec.Next()
	var malformed *MalformedError
	require.ErrorAs(t, err, &malformed)
	assert.Contains(t, malformed.Reason, "longer than")
	ev, err := dec.Next()
	require.NoError(t, err)
	assert.Equal(t, Bookmark, ev.Type)
	assert.Equal(t, "12345", ev.ResourceVersion)
	assert.LessOrEqual(t, cap(dec.line), keepLine, "the huge buffer is released")
	_, err = dec.Next()
	assert.ErrorIs(t, err, io.EOF)
}

// FuzzDecoder ensures no input makes the decoder panic or loop, and that
// every event it returns is well formed: a known type, a JSON object, and a
// resourceVersion unless it is an ERROR.
func FuzzDecoder(f *testing.F) {
	for _, l := range []string{modifiedLine, bookmarkLine, expiredLine, tooLargeLine, "", "\n", "garbage\n",
		`{"type":"MODIFIED"}`, `{"type":"ADDED","object":null}`, `[1]`, modifiedLine[:50]} {
		f.Add([]byte(l + "\n"))
		f.Add([]byte(l))
	}
	f.Add([]byte(modifiedLine + "\n" + bookmarkLine + "\n" + expiredLine))
	handMade, _ := filepath.Glob("testdata/*.ndjson")
	recordings, _ := filepath.Glob("../testdata/recorded/*.ndjson")
	for _, name := range append(handMade, recordings...) {
		if b, err := os.ReadFile(name); err == nil && len(b) <= 64<<10 {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dec := NewDecoder(bytes.NewReader(data))
		for i := 0; ; i++ {
			if i > len(data)+1 {
				t.Fatalf("more results than lines: %d from %d bytes", i, len(data))
			}
			ev, err := dec.Next()
			var malformed *MalformedError
			switch {
			case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
				return
			case errors.As(err, &malformed):
				continue
			case err != nil:
				t.Fatalf("unexpected error from a bytes.Reader: %v", err)
			}
			if _, ok := streamTypes[string(ev.Type)]; !ok {
				t.Fatalf("event with type %q", ev.Type)
			}
			if !gjson.ValidBytes(ev.Object) || !gjson.ParseBytes(ev.Object).IsObject() {
				t.Fatalf("%s event whose object is not a JSON object: %q", ev.Type, ev.Object)
			}
			if ev.Type != Error && ev.ResourceVersion == "" {
				t.Fatalf("%s event without resourceVersion", ev.Type)
			}
		}
	})
}

// --- benchmark ----------------------------------------------------------------------

// loopReader yields data over and over, so one decoder can read b.N events.
type loopReader struct {
	data []byte
	off  int
}

func (r *loopReader) Read(p []byte) (int, error) {
	n := copy(p, r.data[r.off:])
	r.off = (r.off + n) % len(r.data)
	return n, nil
}

// benchEvent returns a MODIFIED line of about size bytes of data, with its
// newline: the recording of that size when there is one, else a generated one.
func benchEvent(file string, size int) []byte {
	if b, err := os.ReadFile("../testdata/recorded/" + file); err == nil {
		if i := bytes.IndexByte(b, '\n'); i > 0 {
			return b[:i+1]
		}
	}
	return []byte(generatedModified(size) + "\n")
}

// generatedModified is a MODIFIED event carrying about size bytes of data
// made like the recorder's: text with quotes, backslashes, tabs, newlines and
// non-ASCII, in keys of at most 64 KiB.
func generatedModified(size int) string {
	words := strings.Fields(`lorem ipsum config watcher pod deployment "quoted" back\slash tab	stop über café 東京 data`)
	rng := rand.New(rand.NewPCG(uint64(size), 1))
	data := map[string]string{}
	for i, left := 0, size; left > 0; i++ {
		var b strings.Builder
		for b.Len() < min(left, 64<<10) {
			b.WriteString(words[rng.IntN(len(words))])
			if rng.IntN(12) == 0 {
				b.WriteByte('\n')
			} else {
				b.WriteByte(' ')
			}
		}
		data[fmt.Sprintf("part-%03d.txt", i)] = b.String()
		left -= b.Len()
	}
	return event(Modified, configMap("payload", "4242", data))
}

// BenchmarkDecode compares Decoder.Next plus reading name, namespace and data
// with decoding the same events into a struct with encoding/json.
func BenchmarkDecode(b *testing.B) {
	sizes := []struct {
		name, file string
		size       int
	}{
		{"1KiB", "modified-1kib.ndjson", 1 << 10},
		{"100KiB", "modified-100kib.ndjson", 100 << 10},
		{"1MiB", "modified-1mib.ndjson", 1<<20 - 1<<10},
	}
	b.Run("decoder", func(b *testing.B) {
		for _, s := range sizes {
			line := benchEvent(s.file, s.size)
			b.Run(s.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(line)))
				dec := NewDecoder(&loopReader{data: line})
				total := 0
				for b.Loop() {
					ev, err := dec.Next()
					if err != nil {
						b.Fatal(err)
					}
					obj := gjson.Parse(unsafe.String(unsafe.SliceData(ev.Object), len(ev.Object))) // in place, as the policy reads it
					total += len(obj.Get("metadata.name").String()) + len(obj.Get("metadata.namespace").String())
					obj.Get("data").ForEach(func(k, v gjson.Result) bool {
						total += len(k.String()) + len(v.String())
						return true
					})
				}
				if total == 0 {
					b.Fatal("read nothing")
				}
			})
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		for _, s := range sizes {
			line := benchEvent(s.file, s.size)
			b.Run(s.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(line)))
				dec := json.NewDecoder(&loopReader{data: line})
				total := 0
				for b.Loop() {
					var ev struct {
						Type   string `json:"type"`
						Object struct {
							Metadata struct {
								Name            string `json:"name"`
								Namespace       string `json:"namespace"`
								ResourceVersion string `json:"resourceVersion"`
							} `json:"metadata"`
							Data map[string]string `json:"data"`
						} `json:"object"`
					}
					if err := dec.Decode(&ev); err != nil {
						b.Fatal(err)
					}
					total += len(ev.Object.Metadata.Name) + len(ev.Object.Metadata.Namespace)
					for k, v := range ev.Object.Data {
						total += len(k) + len(v)
					}
				}
				if total == 0 {
					b.Fatal("read nothing")
				}
			})
		}
	})
}
