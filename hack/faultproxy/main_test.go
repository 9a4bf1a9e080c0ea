package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// upstream answers every request with three lines, flushed one by one.
func upstream(t *testing.T) *url.URL {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for _, l := range []string{`{"n":1}`, `{"n":2}`, `{"n":3}`} {
			io.WriteString(w, l+"\n")
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u
}

func proxyWith(t *testing.T, rules string) (*httptest.Server, *proxy) {
	p := newProxy(upstream(t))
	var err error
	if p.rules, err = parseRules([]byte(rules)); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv, p
}

func get(t *testing.T, u string) (*http.Response, string, error) {
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// TestRules ensures each kind of fault does what it says, and only as often
// as Times allows.
func TestRules(t *testing.T) {
	t.Run("StatusWithRetryAfterThenPassThrough", func(t *testing.T) {
		srv, _ := proxyWith(t, `[{"method":"GET","status":429,"retryAfter":3,"times":1}]`)
		resp, body, _ := get(t, srv.URL+"/api/v1/pods")
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" || !strings.Contains(body, `"code":429`) {
			t.Fatalf("got %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		resp, body, err := get(t, srv.URL+"/api/v1/pods")
		if resp.StatusCode != 200 || err != nil || body != "{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n" {
			t.Fatalf("second request not passed through: %d %q %v", resp.StatusCode, body, err)
		}
	})
	t.Run("CutAfterLinesWithHalfLine", func(t *testing.T) {
		srv, _ := proxyWith(t, `[{"watch":"true","cutAfterLines":1,"halfLine":true}]`)
		_, body, err := get(t, srv.URL+"/x?watch=true")
		if err == nil || body != "{\"n\":1}\n{\"n\"" {
			t.Fatalf("want one line, half of the next and an error; got %q, %v", body, err)
		}
		_, body, err = get(t, srv.URL+"/x") // not a watch: untouched
		if err != nil || strings.Count(body, "\n") != 3 {
			t.Fatalf("non-watch request cut: %q %v", body, err)
		}
	})
	t.Run("ResetAfterLines", func(t *testing.T) {
		srv, _ := proxyWith(t, `[{"cutAfterLines":2}]`)
		_, body, err := get(t, srv.URL+"/x")
		if err == nil || body != "{\"n\":1}\n{\"n\":2}\n" {
			t.Fatalf("want two lines then a reset; got %q, %v", body, err)
		}
	})
	t.Run("Delay", func(t *testing.T) {
		srv, _ := proxyWith(t, `[{"method":"DELETE","delay":"200ms"}]`)
		req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/x", nil)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if d := time.Since(start); d < 200*time.Millisecond {
			t.Fatalf("DELETE took %s, want >= 200ms", d)
		}
	})
	t.Run("AfterLetsSomePass", func(t *testing.T) {
		srv, _ := proxyWith(t, `[{"after":2,"status":503,"times":1}]`)
		var codes []int
		for range 4 {
			resp, _, _ := get(t, srv.URL+"/x")
			codes = append(codes, resp.StatusCode)
		}
		if fmt.Sprint(codes) != "[200 200 503 200]" {
			t.Fatalf("got %v, want [200 200 503 200]", codes)
		}
	})
	t.Run("BadRulesRefused", func(t *testing.T) {
		for _, r := range []string{`{`, `[{"delay":"soon"}]`, `[{"watch":"yes"}]`} {
			if _, err := parseRules([]byte(r)); err == nil {
				t.Errorf("rules %s accepted", r)
			}
		}
	})
}
