package apiclient

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
)

// ListPageSize is the limit of each page of a paged list. It bounds
// requests, not memory: List hands items over one at a time.
const ListPageSize = 500

// BodyGetter is what List needs of a client: *Client, or a test's fake.
type BodyGetter interface {
	GetBody(ctx context.Context, path string, query url.Values, accept string) (io.ReadCloser, error)
}

var _ BodyGetter = (*Client)(nil)

// List reads the collection at path page by page, pageSize objects a page
// (ListPageSize if zero), with query (not changed) and the continue token of
// each page, and calls item for each object as it is decoded: the one paged
// list of the controller. As with ReadPage, item's argument is reused (copy
// what you keep), so memory follows the largest object, not the page. It
// returns the last page's metadata, whose resourceVersion is the list's.
//
// A failed page fails the list, and the items handed over by then belong to
// an incomplete list: the caller starts again from the first page. A 410 on a
// continue token (it expired: the server compacted past the list's revision)
// is said so; an error getting a page is returned as the server said it, for
// the caller's predicates (IsForbidden, IsGone).
func List(ctx context.Context, api BodyGetter, path string, query url.Values, accept string, pageSize int, item func(raw []byte)) (ListMeta, error) {
	if pageSize <= 0 {
		pageSize = ListPageSize
	}
	q := url.Values{}
	for k, v := range query {
		q[k] = v
	}
	q.Set("limit", strconv.Itoa(pageSize))
	for {
		meta, err := listPage(ctx, api, path, q, accept, item)
		switch {
		case err != nil && IsGone(err) && q.Has("continue"):
			return meta, fmt.Errorf("continue token expired: %w", err)
		case err != nil:
			return meta, err
		case meta.Continue == "":
			return meta, nil
		}
		q.Set("continue", meta.Continue)
	}
}

// listPage reads one page and hands over its items as it decodes them.
func listPage(ctx context.Context, api BodyGetter, path string, q url.Values, accept string, item func(raw []byte)) (ListMeta, error) {
	body, err := api.GetBody(ctx, path, q, accept)
	if err != nil {
		return ListMeta{}, err
	}
	defer body.Close()
	return ReadPage(body, item)
}
