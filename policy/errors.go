package policy

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/internal/truncate"
)

// answer is what the API server's answer to one of our writes (a patch of
// R or I, a DELETE, an eviction) means, whatever the object's kind. classify
// is the one table; each write site maps the class to its action in one
// switch.
type answer int

const (
	answerOK answer = iota
	// answerRetry: 5xx, a timeout, a cut connection. Retried with backoff.
	answerRetry
	// answerBusy: 429 from API priority and fairness (the server is
	// busy). Retried after the server's hint (Retry-After).
	answerBusy
	// answerBlocked: 429 on an eviction that a PodDisruptionBudget does not
	// allow now (its cause reason is DisruptionBudget). Tried again in the
	// next wave.
	answerBlocked
	// answerNotFound: 404. The object is gone; its DELETED event comes.
	answerNotFound
	// answerConflict: a precondition failed, the object changed or was
	// replaced under the same name (409, or 422 on metadata.uid).
	answerConflict
	// answerTooLong: 422 for the 256 KiB limit on all annotations
	// together. Never passes as it is.
	answerTooLong
	// answerRefused: RBAC or an admission policy (403, 422, 400, 401), or
	// a ConfigMap of a Secret's state name that is not ours.
	// Failed-visible: a Warning Event, a count, a log line that says what
	// to fix, and a retry with backoff.
	answerRefused
)

func classify(err error) answer {
	if err == nil {
		return answerOK
	}
	if errors.Is(err, errForeignState) {
		return answerRefused
	}
	se, ok := errors.AsType[*apiclient.StatusError](err)
	if !ok {
		return answerRetry
	}
	switch se.Code {
	case http.StatusNotFound:
		return answerNotFound
	case http.StatusConflict:
		return answerConflict
	case http.StatusTooManyRequests:
		if se.HasCause("", "DisruptionBudget") {
			return answerBlocked
		}
		return answerBusy
	case http.StatusUnprocessableEntity:
		switch {
		case se.HasCause("metadata.uid", ""):
			return answerConflict // the patch's uid is not the object's: replaced
		case se.HasCause("metadata.annotations", "FieldValueTooLong"):
			return answerTooLong
		}
		return answerRefused
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden:
		return answerRefused
	}
	return answerRetry
}

// refusal is a write refused for a reason a person must fix; it has been
// made visible already.
type refusal struct{ err error }

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// refused makes a refused write visible and returns the error that retries
// it with backoff. resource names the write's object ("configmaps",
// "pods/eviction") and need the RBAC rule it takes.
func (c *Controller) refused(obj object, verb, resource, need string, err error) error {
	noun, _, _ := strings.Cut(resource, "/")
	fix := fmt.Sprintf("RBAC: the controller may not %s %s in %s (needs %s)", verb, noun, obj.namespace, need)
	if msg := err.Error(); strings.Contains(msg, "admission") || strings.Contains(msg, "AdmissionPolicy") || strings.Contains(msg, "denied request") {
		fix = fmt.Sprintf("an admission policy refuses to let the controller %s %s in %s: exempt its service account, or change the policy", verb, noun, obj.namespace)
	} else if errors.Is(err, errForeignState) {
		fix = "a ConfigMap named " + stateName(obj.name) + " in " + obj.namespace + " holds the name of this Secret's state and was not written by config-watcher: rename or delete it"
	} else if !apiclient.IsForbidden(err) {
		fix = fmt.Sprintf("the server refuses to let the controller %s %s in %s as invalid: see the error", verb, noun, obj.namespace)
	}
	c.metrics.WritesRefused.Inc(resource)
	c.log.Error("write refused; will retry", "namespace", obj.namespace, obj.kind.logKey(), obj.name, "write", verb+" "+resource, "fix", fix, "err", err)
	c.event(obj, events.Warning, "WriteRefused", truncate.String(fmt.Sprintf("%s (%v). Retrying.", fix, err), 1024))
	return &refusal{fmt.Errorf("%s: %w", fix, err)}
}
