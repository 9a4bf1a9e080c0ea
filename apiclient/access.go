package apiclient

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"syscall"
)

// Access is what a request asks of the API server in RBAC's terms: a verb on
// a resource (with its subresource, "pods/eviction") of an API group, in a
// namespace, or in every namespace when Namespace is "".
type Access struct {
	Verb, Group, Resource, Namespace string
}

func (a Access) String() string {
	where := "in namespace " + a.Namespace
	if a.Namespace == "" {
		where = "in every namespace"
	}
	return fmt.Sprintf("%s %s %s", a.Verb, a.Resource, where)
}

// Rule is the RBAC rule that grants a, and where it goes: a Role in a's
// namespace, a ClusterRole for every namespace.
func (a Access) Rule() string {
	holder := "a Role in namespace " + a.Namespace + " bound to the controller's ServiceAccount"
	if a.Namespace == "" {
		holder = "a ClusterRole bound to the controller's ServiceAccount by a ClusterRoleBinding"
	}
	return fmt.Sprintf(`{apiGroups: [%q], resources: [%q], verbs: [%q]} in %s`, a.Group, a.Resource, a.Verb, holder)
}

// accessOf reads the access a request asks for from its method, its path
// (relative to the base URL, escaped, as CorePath and GroupPath build it)
// and its query. A path of another shape gives the zero Access.
func accessOf(method, path string, query url.Values) Access {
	var seg []string
	for _, s := range strings.Split(strings.Trim(path, "/"), "/") {
		u, err := url.PathUnescape(s)
		if err != nil {
			return Access{}
		}
		seg = append(seg, u)
	}
	var a Access
	switch {
	case len(seg) >= 3 && seg[0] == "api": // /api/v1/…
		seg = seg[2:]
	case len(seg) >= 4 && seg[0] == "apis": // /apis/GROUP/VERSION/…
		a.Group, seg = seg[1], seg[3:]
	default:
		return Access{}
	}
	if len(seg) >= 3 && seg[0] == "namespaces" {
		a.Namespace, seg = seg[1], seg[2:]
	}
	a.Resource = seg[0]
	named := len(seg) > 1
	if len(seg) > 2 {
		a.Resource += "/" + seg[2]
	}
	a.Verb = verbs[method]
	switch {
	case method == http.MethodGet && !named && (query.Get("watch") == "true" || query.Get("watch") == "1"):
		a.Verb = "watch"
	case method == http.MethodGet && !named:
		a.Verb = "list"
	case method == http.MethodDelete && !named:
		a.Verb = "deletecollection"
	}
	return a
}

// verbs are RBAC's verbs of the HTTP methods on one object.
var verbs = map[string]string{
	http.MethodGet: "get", http.MethodPost: "create", http.MethodPut: "update",
	http.MethodPatch: "patch", http.MethodDelete: "delete",
}

// Hint says what a person can do about err, or "" when it is nothing a
// person fixes (a timeout, a 5xx: retrying is the cure). It is the one
// place that turns an error into its fix, for the logs and the probes.
func Hint(err error) string {
	if se, ok := errors.AsType[*StatusError](err); ok && se.Code == http.StatusForbidden && se.Access.Verb != "" {
		return fmt.Sprintf("RBAC: the controller may not %s; grant it with the rule %s", se.Access, se.Access.Rule())
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "nothing answers at API_URL: start the ambassador (kubectl proxy) there, or point API_URL at it"
	}
	return ""
}
