//go:build e2e

package e2e

import (
	"strings"
	"testing"
)

// TestSeveralNamespaces ensures one controller watching a list of
// namespaces, or all of them (one cluster-wide watch), restarts the pods of
// a changed ConfigMap in each, once.
func TestSeveralNamespaces(t *testing.T) {
	for _, tt := range []struct {
		name  string
		watch func(a, b string) string
		env   []string
	}{
		{"List", func(a, b string) string { return a + "," + b }, nil},
		// Secrets watched too: this case is the suite's one controller
		// that lists and watches them across namespaces, a path only the
		// cluster-wide overlay's ambassador passes (paths_test.go).
		{"AllNamespaces", func(string, string) string { return "*" }, []string{"WATCH_SECRETS=true"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newNamespace(t), newNamespace(t)
			var original [][]pod
			for _, ns := range []string{a, b} {
				optIn(t, ns) // acted in under * (NAMESPACE_SELECTOR); changes nothing for a list
				apply(t, ns, webappManifests("app=webapp"))
				original = append(original, waitPods(t, ns, "app=webapp", 2))
			}
			extraEnv := []string{"WATCH_NAMESPACE=" + tt.watch(a, b)}
			if tt.env != nil {
				extraEnv = append(extraEnv, append(tt.env, "DIGEST_KEY_FILE="+writeDigestKey(t))...)
			}
			c := startController(t, controllerOpts{extraEnv: extraEnv})
			c.WaitReady(t)
			var adopted []string
			for _, ns := range []string{a, b} {
				adopted = append(adopted, waitRestartedFor(t, ns, "webapp-config", ""))
			}
			for i, ns := range []string{a, b} {
				mergePatch(t, ns, "webapp-config", `{"data":{"message":"`+strings.ToUpper(ns)+`"}}`)
				waitDeleted(t, ns, adminUser, original[i])
				waitRestartedFor(t, ns, "webapp-config", adopted[i])
			}
			for i, ns := range []string{a, b} {
				c.Settle(t, ns)
				assertDeletedOnce(t, ns, adminUser, original[i])
			}
		})
	}
}
