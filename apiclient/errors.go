package apiclient

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/internal/truncate"
)

// StatusError is a non-2xx answer, filled from its Status body when there is
// one (kubectl proxy and load balancers sometimes answer with plain text: then
// Reason is empty and Message holds the text).
type StatusError struct {
	Code       int
	Reason     string // e.g. "NotFound", "Expired", "Conflict"
	Message    string
	RetryAfter time.Duration // the server's hint (Retry-After, details.retryAfterSeconds); zero if none
	// Causes are details.causes: they tell apart answers that share a code
	// (a 422 for an immutable field, for a size limit, from an admission
	// policy).
	Causes []StatusCause
	// Access is what the refused request asked for (Hint names it).
	Access Access
}

// StatusCause is one of a Status's details.causes.
type StatusCause struct {
	Reason  string // e.g. "FieldValueTooLong", "FieldValueInvalid"
	Field   string // e.g. "metadata.annotations"
	Message string
}

// HasCause reports whether a cause names field and, unless reason is "",
// has that reason.
func (e *StatusError) HasCause(field, reason string) bool {
	for _, c := range e.Causes {
		if c.Field == field && (reason == "" || c.Reason == reason) {
			return true
		}
	}
	return false
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Code, cmp.Or(e.Reason, http.StatusText(e.Code)), e.Message)
}

// maxStatusBody bounds how much of an error body is read: a Status is small,
// and an HTML error page from something in the middle should not be kept.
const maxStatusBody = 64 << 10

func statusFromResponse(resp *http.Response, access Access) *StatusError {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxStatusBody))
	e := StatusFromJSON(body)
	if e == nil || e.Code == 0 {
		e = &StatusError{Message: quoted(strings.TrimSpace(string(body)), 256)}
	}
	e.Code = resp.StatusCode
	if e.RetryAfter == 0 {
		e.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"))
	}
	e.Access = access
	return e
}

// StatusFromJSON reads a metav1.Status object (an error body, or the object of
// a watch ERROR event). It returns nil when raw is not a Status.
func StatusFromJSON(raw []byte) *StatusError {
	if !gjson.ValidBytes(raw) {
		return nil
	}
	st := gjson.ParseBytes(raw)
	if st.Get("kind").String() != "Status" && !st.Get("code").Exists() {
		return nil
	}
	e := &StatusError{Code: int(st.Get("code").Int()), Reason: st.Get("reason").String(), Message: quoted(st.Get("message").String(), 1024)}
	if s := st.Get("details.retryAfterSeconds").Int(); s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	causes := st.Get("details.causes")
	if causes.IsArray() {
		for _, c := range causes.Array()[:min(len(causes.Array()), maxCauses)] {
			e.Causes = append(e.Causes, StatusCause{Reason: c.Get("reason").String(), Field: c.Get("field").String(), Message: quoted(c.Get("message").String(), 256)})
		}
	}
	return e
}

// parseRetryAfter reads a Retry-After header: seconds or an HTTP date.
func parseRetryAfter(v string) time.Duration {
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// maxCauses bounds the causes kept: a Status lists one per invalid field.
const maxCauses = 16

// KeyedDigestPrefix begins a keyed digest of Secret data (policy writes
// them in the state of Secrets). A server that refuses a write may quote it;
// no part of one may reach a log or an Event.
const KeyedDigestPrefix = "hmac-sha256:"

// keyedDigest is a keyed digest, or what is left of one cut short.
var keyedDigest = regexp.MustCompile(regexp.QuoteMeta(KeyedDigestPrefix) + `[0-9a-fA-F]*`)

// quoted is text a server sent, made fit for logs and Events: keyed
// digests hidden first (a cut could leave part of one that no longer
// matches), then cut at n bytes.
func quoted(s string, n int) string {
	return truncate.String(keyedDigest.ReplaceAllLiteralString(s, KeyedDigestPrefix+"(not shown)"), n)
}

// IsNotFound: the object does not exist (any more).
func IsNotFound(err error) bool { return hasCode(err, http.StatusNotFound) }

// IsForbidden: RBAC refused the request.
func IsForbidden(err error) bool { return hasCode(err, http.StatusForbidden) }

// IsGone: a resourceVersion or continue token is older than the server's
// history; retrying it can never succeed, list again instead.
func IsGone(err error) bool {
	se, ok := errors.AsType[*StatusError](err)
	return ok && (se.Code == http.StatusGone || se.Reason == "Expired" || se.Reason == "Gone")
}

func hasCode(err error, code int) bool {
	se, ok := errors.AsType[*StatusError](err)
	return ok && se.Code == code
}

// RetryAfter returns the server's requested delay carried by err, or zero.
func RetryAfter(err error) time.Duration {
	if se, ok := errors.AsType[*StatusError](err); ok {
		return se.RetryAfter
	}
	return 0
}
