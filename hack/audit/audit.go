// Package audit reads a kube-apiserver audit log: the e2e tests and the
// benchmarks judge the controller by what the API server saw it do, not by
// what it says it did.
package audit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Event is the part of an audit.k8s.io/v1 Event the tests and benchmarks read.
type Event struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Received time.Time `json:"requestReceivedTimestamp"`
	Done     time.Time `json:"stageTimestamp"`
}

// OK reports a 2xx answer: the request changed what it asked to change.
func (e Event) OK() bool { return e.Code()/100 == 2 }

// Code is the answer's HTTP status, 0 if the log has none.
func (e Event) Code() int {
	if e.ResponseStatus == nil {
		return 0
	}
	return e.ResponseStatus.Code
}

// On reports a request on resource itself (not a subresource) in namespace ns.
func (e Event) On(ns, resource string) bool {
	return e.ObjectRef != nil && e.ObjectRef.Namespace == ns &&
		e.ObjectRef.Resource == resource && e.ObjectRef.Subresource == ""
}

func (e Event) String() string {
	return fmt.Sprintf("%s %s %s by %s -> %d", e.Done.Format(time.RFC3339Nano), e.Verb, e.RequestURI, e.User.Username, e.Code())
}

// Read returns the completed requests (stage ResponseComplete) in the log at
// path for which keep is true, in log order. A last line the server is still
// writing is left out; any other line that is not an Event is an error.
func Read(path string, keep func(Event) bool) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var events []Event
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			var e Event
			if jerr := json.Unmarshal(line, &e); jerr != nil {
				return nil, fmt.Errorf("%s: audit line %q: %w", path, line, jerr)
			}
			if e.Stage == "ResponseComplete" && keep(e) {
				events = append(events, e)
			}
		}
		if errors.Is(err, io.EOF) {
			return events, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
	}
}
