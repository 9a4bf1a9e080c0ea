package apiclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/internal/fixture"
)

// pageItems reads a page with ReadPage and returns a copy of each item.
func pageItems(r io.Reader) ([]string, ListMeta, error) {
	var items []string
	meta, err := ReadPage(r, func(raw []byte) { items = append(items, string(raw)) })
	return items, meta, err
}

// TestReadPageRecorded ensures every recorded list page (ConfigMaps, pages of
// a continued list, metadata-only pods) decodes, read whole or a byte at a
// time, to exactly the items and metadata encoding/json reads in it.
func TestReadPageRecorded(t *testing.T) {
	for _, src := range fixture.Dirs {
		for _, name := range []string{"list.json", "list-page-1.json", "list-page-2.json", "pods-list.json", "pods-metadata-list.json"} {
			t.Run(src.Name+"/"+name, func(t *testing.T) {
				if !src.Recorded && strings.HasPrefix(name, "pods-") {
					t.Skip("recorded only")
				}
				body := fixture.Read(t, src.Path(t, name))
				var want struct {
					Metadata ListMeta          `json:"metadata"`
					Items    []json.RawMessage `json:"items"`
				}
				require.NoError(t, json.Unmarshal([]byte(body), &want))
				require.NotEmpty(t, want.Items)
				var wantItems []string
				for _, it := range want.Items {
					wantItems = append(wantItems, string(it))
				}
				for _, rd := range []struct {
					name string
					wrap func(io.Reader) io.Reader
				}{{"Whole", func(r io.Reader) io.Reader { return r }}, {"OneByteReads", iotest.OneByteReader}} {
					items, meta, err := pageItems(rd.wrap(strings.NewReader(body)))
					require.NoError(t, err, rd.name)
					assert.Equal(t, wantItems, items, rd.name)
					assert.Equal(t, want.Metadata, meta, rd.name)
				}
			})
		}
	}
}

// TestReadPageCutAnywhereFails ensures a recorded page cut at any byte (in
// the middle of an item, between items, before the closing brace) is an
// error, io.ErrUnexpectedEOF or invalid JSON, and never a complete page:
// the list it belongs to must not be ended.
func TestReadPageCutAnywhereFails(t *testing.T) {
	body := fixture.Read(t, fixture.Recorded.Path(t, "list.json"))
	body = strings.TrimRight(body, "\n")
	for cut := 0; cut < len(body); cut++ {
		_, _, err := pageItems(strings.NewReader(body[:cut]))
		if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, errInvalidJSON) {
			t.Fatalf("page cut after %d of %d bytes: got %v, want an unexpected EOF", cut, len(body), err)
		}
	}
	// The cut in the middle of the second item hands over the first only.
	second := strings.Index(body, `{"metadata":{"name":"webapp-config"`)
	require.Positive(t, second)
	items, _, err := pageItems(strings.NewReader(body[:second+40]))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Len(t, items, 1)
}

// TestReadPageShapes ensures hand-written page shapes read as the API server
// means them: null or empty items are no items, metadata may follow the
// items, unknown members are read past, and what is not a list is an error.
func TestReadPageShapes(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantItems []string
		wantMeta  ListMeta
		wantErr   string
	}{
		{name: "ItemsNullIsEmpty", body: `{"kind":"PartialObjectMetadataList","metadata":{"resourceVersion":"7"},"items":null}`, wantMeta: ListMeta{ResourceVersion: "7"}},
		{name: "ItemsEmpty", body: `{"metadata":{"resourceVersion":"7"},"items":[]}`, wantMeta: ListMeta{ResourceVersion: "7"}},
		{name: "ItemsMissing", body: `{"metadata":{"resourceVersion":"7"}}`, wantMeta: ListMeta{ResourceVersion: "7"}},
		{name: "MetadataAfterItems", body: `{"items":[{"a":1},{"b":2}],"metadata":{"resourceVersion":"8","continue":"c"}}`, wantItems: []string{`{"a":1}`, `{"b":2}`}, wantMeta: ListMeta{ResourceVersion: "8", Continue: "c"}},
		{name: "UnknownMembersReadPast", body: `{"x":{"y":[1,2,{"z":null}]},"metadata":{"resourceVersion":"9"},"items":[{"a":"\"]}"}],"w":"v"}`, wantItems: []string{`{"a":"\"]}"}`}, wantMeta: ListMeta{ResourceVersion: "9"}},
		{name: "SpacesBetweenTokens", body: " {\n \"metadata\" : { \"resourceVersion\" : \"3\" } ,\n \"items\" : [ {\"a\":1} ,\n {\"b\":2} ] }\n", wantItems: []string{`{"a":1}`, `{"b":2}`}, wantMeta: ListMeta{ResourceVersion: "3"}},
		{name: "ItemsNotArrayFails", body: `{"items":{"a":1}}`, wantErr: "items is not an array"},
		{name: "ArrayNotAListFails", body: `[{"a":1}]`, wantErr: "not a list"},
		{name: "StatusStringFails", body: `"oops"`, wantErr: "not a list"},
		{name: "EmptyBodyIsUnexpectedEOF", body: ``, wantErr: "unexpected EOF"},
		{name: "GarbageFailsWithoutQuotingIt", body: `{"items":[{"a":1}x]}`, wantErr: "not valid JSON at byte 17"},
		{name: "MetadataNotObjectFails", body: `{"metadata":"x","items":[]}`, wantErr: "metadata"},
		{name: "TrailingNewlineIsTheEnd", body: "{\"metadata\":{\"resourceVersion\":\"7\"},\"items\":[]}\n", wantMeta: ListMeta{ResourceVersion: "7"}},
		{name: "MoreAfterTheListFails", body: `{"metadata":{"resourceVersion":"7"},"items":[]}{"items":[{"a":1}]}`, wantErr: "more after the list"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			items, meta, err := pageItems(strings.NewReader(tt.body))
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantItems, items)
			assert.Equal(t, tt.wantMeta, meta)
		})
	}
}

// TestReadPageHoldsOneItem ensures items are handed over one at a time in a
// buffer that is reused, so that a page costs its largest item: after a large
// item, a smaller one arrives in the same backing array.
func TestReadPageHoldsOneItem(t *testing.T) {
	big := `{"data":"` + strings.Repeat("x", 1<<20) + `"}`
	body := `{"metadata":{"resourceVersion":"1"},"items":[` + big + `,{"a":1}]}`
	var firsts []*byte
	var sizes []int
	_, err := ReadPage(strings.NewReader(body), func(raw []byte) {
		firsts = append(firsts, &raw[:1][0])
		sizes = append(sizes, len(raw))
	})
	require.NoError(t, err)
	require.Equal(t, []int{len(big), len(`{"a":1}`)}, sizes)
	assert.Same(t, firsts[0], firsts[1], "the second item reuses the first one's buffer")
}

// BenchmarkListPage compares ReadPage with what the loop did before: the
// whole page read (io.ReadAll) and then walked with gjson. A page of 40
// ConfigMaps of 900 KB; B/op is what each allocates to read it.
func BenchmarkListPage(b *testing.B) {
	const line = "line of a large generated configuration file\n"
	value := strings.Repeat(line, 900_000/len(line)+1)[:900_000]
	var items []string
	for i := range 40 {
		items = append(items, fmt.Sprintf(`{"metadata":{"name":"big-%03d","namespace":"default","resourceVersion":"%d"},"data":{"config.txt":%q}}`, i, 100+i, value))
	}
	page := []byte(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"200"},"items":[` + strings.Join(items, ",") + `]}`)
	b.Run("stream", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(page)))
		for b.Loop() {
			n := 0
			if _, err := ReadPage(bytes.NewReader(page), func(raw []byte) {
				n += len(gjson.GetBytes(raw, "metadata.resourceVersion").Str)
			}); err != nil || n == 0 {
				b.Fatal(err)
			}
		}
	})
	b.Run("readall", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(page)))
		for b.Loop() {
			body, err := io.ReadAll(bytes.NewReader(page))
			if err != nil || !gjson.ValidBytes(body) {
				b.Fatal(err)
			}
			n := 0
			gjson.GetBytes(body, "items").ForEach(func(_, item gjson.Result) bool {
				n += len(item.Get("metadata.resourceVersion").Str)
				return true
			})
			if n == 0 {
				b.Fatal("no items")
			}
		}
	})
}
