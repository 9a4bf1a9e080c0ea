package manifests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hack/uninstall.sh runs against a fake kubectl: this test binary, run again
// with fakeKubectlState set, keeps a cluster as a JSON file of objects and
// answers the get, delete, annotate, scale and wait the script sends (go
// templates as kubectl renders them, text/template over the objects' JSON),
// logging every change. What the script selects and removes is then judged
// from the objects left, offline.

const fakeKubectlState = "CW_FAKE_KUBECTL_STATE"

func TestMain(m *testing.M) {
	if state := os.Getenv(fakeKubectlState); state != "" {
		os.Exit(fakeKubectl(state, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// kinds maps the names the script gives kubectl to a kind, and whether it is
// cluster-scoped.
var kinds = map[string]struct {
	kind    string
	cluster bool
}{
	"deployment": {"Deployment", false}, "poddisruptionbudget": {"PodDisruptionBudget", false},
	"service": {"Service", false}, "networkpolicy": {"NetworkPolicy", false},
	"configmap": {"ConfigMap", false}, "serviceaccount": {"ServiceAccount", false},
	"role": {"Role", false}, "rolebinding": {"RoleBinding", false}, "lease": {"Lease", false},
	"secret": {"Secret", false}, "event": {"Event", false}, "pod": {"Pod", false},
	"namespace": {"Namespace", true}, "clusterrole": {"ClusterRole", true}, "clusterrolebinding": {"ClusterRoleBinding", true},
}

func kindOf(name string) (string, bool, error) {
	name = strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(name), "s"), "ie") // networkpolicies
	if k, ok := kinds[name]; ok {
		return k.kind, k.cluster, nil
	}
	if k, ok := kinds[name+"y"]; ok {
		return k.kind, k.cluster, nil
	}
	return "", false, fmt.Errorf("the server doesn't have a resource type %q", name)
}

// fakeKubectl is kubectl against the cluster in the file state.
func fakeKubectl(state string, args []string) int {
	raw, err := os.ReadFile(state)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var objs []obj
	if err := json.Unmarshal(raw, &objs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	flags := map[string]string{}
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-A" || a == "--ignore-not-found":
			flags[a] = "true"
		case a == "-n" || a == "-l" || a == "-o" || a == "--field-selector":
			i++
			flags[a] = args[i]
		case strings.HasPrefix(a, "--"):
			k, v, _ := strings.Cut(a, "=")
			flags[k] = v
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) == 0 {
		fmt.Fprintln(os.Stderr, "no verb")
		return 1
	}
	verb, pos := pos[0], pos[1:]
	logChange := func(format string, a ...any) {
		f, err := os.OpenFile(state+".log", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintf(f, format+"\n", a...)
			f.Close()
		}
	}
	save := func() int {
		b, _ := json.Marshal(objs)
		if err := os.WriteFile(state, b, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}
	// selected returns the indexes of the objects of kinds (comma-separated)
	// and name that the flags select.
	selected := func(kindList, name string) ([]int, error) {
		var out []int
		for _, kn := range strings.Split(kindList, ",") {
			kind, cluster, err := kindOf(kn)
			if err != nil {
				return nil, err
			}
			for i, o := range objs {
				if o["kind"] != kind || (name != "" && nameOf(o) != name) {
					continue
				}
				if !cluster && flags["-A"] == "" && str(o, "metadata", "namespace") != orDefault(flags["-n"], "default") {
					continue
				}
				if !matches(o, flags["-l"], "metadata", "labels") || !matches(o, flags["--field-selector"]) {
					continue
				}
				out = append(out, i)
			}
			if name != "" && len(out) == 0 && flags["--ignore-not-found"] == "" {
				return nil, fmt.Errorf("Error from server (NotFound): %s %q not found", kn, name)
			}
		}
		slices.Sort(out)
		return out, nil
	}
	name := func() string {
		if len(pos) > 1 {
			return pos[1]
		}
		return ""
	}
	switch verb {
	case "api-resources":
		return 0 // no Prometheus Operator
	case "get":
		idx, err := selected(pos[0], name())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		out, _ := strings.CutPrefix(flags["-o"], "go-template=")
		switch {
		case flags["-o"] == "name" || flags["-o"] == "": // a table of names, as far as the script reads it
			for _, i := range idx {
				fmt.Printf("%s/%s\n", strings.ToLower(objs[i]["kind"].(string)), nameOf(objs[i]))
			}
		case out != flags["-o"]:
			tmpl, err := template.New("output").Parse(out)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			var data any = map[string]any{"kind": "List", "items": pick(objs, idx)}
			if name() != "" {
				if len(idx) == 0 {
					return 0
				}
				data = objs[idx[0]]
			}
			if err := tmpl.Execute(os.Stdout, data); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		default:
			fmt.Fprintf(os.Stderr, "fake kubectl: -o %q\n", flags["-o"])
			return 1
		}
		return 0
	case "delete":
		idx, err := selected(pos[0], name())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for _, i := range slices.Backward(idx) {
			logChange("delete %s %s/%s", objs[i]["kind"], str(objs[i], "metadata", "namespace"), nameOf(objs[i]))
			objs = slices.Delete(objs, i, i+1)
		}
		return save()
	case "annotate":
		idx, err := selected(pos[0], name())
		if err != nil || len(idx) != 1 {
			fmt.Fprintln(os.Stderr, "annotate:", err, idx)
			return 1
		}
		meta := objs[idx[0]]["metadata"].(map[string]any)
		for _, kv := range pos[2:] {
			key, ok := strings.CutSuffix(kv, "-")
			ann, _ := meta["annotations"].(map[string]any)
			if !ok || ann[key] == nil {
				fmt.Fprintf(os.Stderr, "fake kubectl: annotate %q\n", kv)
				return 1
			}
			delete(ann, key)
			logChange("annotate %s/%s %s-", meta["namespace"], meta["name"], key)
		}
		return save()
	case "scale":
		idx, err := selected(pos[0], name())
		if err != nil || len(idx) != 1 || flags["--replicas"] != "0" {
			fmt.Fprintln(os.Stderr, "scale:", err, idx)
			return 1
		}
		d := objs[idx[0]]
		d["spec"].(map[string]any)["replicas"] = 0
		logChange("scale %s/%s 0", str(d, "metadata", "namespace"), nameOf(d))
		// As the Deployment controller and the kubelet would: its pods go.
		sel := dig(d, "spec", "selector", "matchLabels").(map[string]any)
		objs = slices.DeleteFunc(objs, func(o obj) bool {
			return o["kind"] == "Pod" && str(o, "metadata", "namespace") == str(d, "metadata", "namespace") && labelsMatch(dig(o, "metadata", "labels"), stringMap(sel))
		})
		return save()
	case "wait":
		idx, err := selected(pos[0], "")
		if err != nil || len(idx) > 0 {
			fmt.Fprintln(os.Stderr, "error: timed out waiting for the condition", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "fake kubectl: no verb %q\n", verb)
	return 1
}

func orDefault(v, fallback string) string {
	if v == "" {
		return fallback
	}
	return v
}

func pick(objs []obj, idx []int) []any {
	out := []any{}
	for _, i := range idx {
		out = append(out, objs[i])
	}
	return out
}

func stringMap(m map[string]any) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k], _ = v.(string)
	}
	return out
}

// matches reports whether o has every key=value of sel (comma-separated) at
// the path under prefix (labels), or as a dotted field path (a field selector).
func matches(o obj, sel string, prefix ...string) bool {
	if sel == "" {
		return true
	}
	for _, term := range strings.Split(sel, ",") {
		k, v, _ := strings.Cut(term, "=")
		path := append(slices.Clone(prefix), k)
		if len(prefix) == 0 {
			path = strings.Split(k, ".")
		}
		if dig(o, path...) != v {
			return false
		}
	}
	return true
}

// uninstallCluster is an install of the cluster-wide overlay in namespace
// cw, acting in team-a, which opted in, beside a namespaced install of
// another team's in team-b, which did not, and a user's lookalikes.
func uninstallCluster(t *testing.T) []obj {
	t.Helper()
	var objs []obj
	for _, o := range render(t, "cluster-wide") {
		if o["kind"] != "ClusterRole" && o["kind"] != "ClusterRoleBinding" {
			o["metadata"].(map[string]any)["namespace"] = "cw"
		}
		if o["kind"] == "ClusterRoleBinding" {
			for _, s := range list(o, "subjects") {
				s.(map[string]any)["namespace"] = "cw"
			}
		}
		objs = append(objs, o)
	}
	add := func(s string) {
		var o obj
		require.NoError(t, json.Unmarshal([]byte(s), &o), s)
		objs = append(objs, o)
	}
	add(`{"kind":"Namespace","metadata":{"name":"cw"}}`)
	add(`{"kind":"Namespace","metadata":{"name":"team-a","labels":{"config-watcher.k8spatterns.io/enabled":"true"}}}`)
	add(`{"kind":"Namespace","metadata":{"name":"team-b"}}`)
	for _, p := range []string{"config-watcher-1", "config-watcher-2"} {
		add(`{"kind":"Pod","metadata":{"namespace":"cw","name":"` + p + `","labels":{"app.kubernetes.io/name":"config-watcher","app.kubernetes.io/component":"controller"}}}`)
	}
	add(`{"kind":"Secret","metadata":{"namespace":"cw","name":"config-watcher-digest-key"}}`)
	for _, ns := range []string{"cw", "team-b"} {
		add(`{"kind":"Lease","metadata":{"namespace":"` + ns + `","name":"config-watcher"}}`)
	}
	for _, ns := range []string{"team-a", "team-b"} {
		add(`{"kind":"ConfigMap","metadata":{"namespace":"` + ns + `","name":"webapp-config","annotations":{
			"k8spatterns.io/podDeleteSelector":"app=webapp",
			"config-watcher.k8spatterns.io/restarted-for":"sha256:1","config-watcher.k8spatterns.io/halted":"x",
			"config-watcher.k8spatterns.io/note":"the user's own"}}}`)
		add(`{"kind":"ConfigMap","metadata":{"namespace":"` + ns + `","name":"config-watcher-secret.db",
			"labels":{"app.kubernetes.io/managed-by":"config-watcher"},
			"annotations":{"config-watcher.k8spatterns.io/state-of-secret":"db"},
			"ownerReferences":[{"apiVersion":"v1","kind":"Secret","name":"db","uid":"1"}]}}`)
		add(`{"kind":"ConfigMap","metadata":{"namespace":"` + ns + `","name":"lookalike","labels":{"app.kubernetes.io/managed-by":"config-watcher"}}}`)
		add(`{"kind":"Event","reportingComponent":"config-watcher","metadata":{"namespace":"` + ns + `","name":"webapp-config.1"}}`)
		add(`{"kind":"Event","reportingComponent":"kubelet","metadata":{"namespace":"` + ns + `","name":"webapp.2"}}`)
	}
	return objs
}

// runUninstall runs hack/uninstall.sh for namespace cw against the fake
// cluster objs with env and stdin; it returns the objects left, the changes
// made, the script's output and its error.
func runUninstall(t *testing.T, objs []obj, stdin string, env ...string) (left []obj, changes []string, out string, err error) {
	t.Helper()
	script := filepath.Join("..", "hack", "uninstall.sh")
	_, rerr := os.ReadFile(script) // go test's cache then keys on the script, which only bash opens
	require.NoError(t, rerr)
	dir := t.TempDir()
	state := filepath.Join(dir, "cluster.json")
	b, jerr := json.Marshal(objs)
	require.NoError(t, jerr)
	require.NoError(t, os.WriteFile(state, b, 0o600))
	self, serr := os.Executable()
	require.NoError(t, serr)
	kubectl := filepath.Join(dir, "kubectl")
	require.NoError(t, os.WriteFile(kubectl, []byte("#!/bin/sh\nexec "+self+" \"$@\"\n"), 0o700))

	cmd := exec.Command("bash", script, "cw")
	cmd.Env = append(os.Environ(), "KUBECTL="+kubectl, fakeKubectlState+"="+state)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	err = cmd.Run()

	b, rerr = os.ReadFile(state)
	require.NoError(t, rerr)
	require.NoError(t, json.Unmarshal(b, &left))
	log, _ := os.ReadFile(state + ".log")
	changes = strings.Fields(strings.ReplaceAll(string(log), " ", "_"))
	return left, changes, output.String(), err
}

// summary names each object as "Kind ns/name", with a ConfigMap's
// config-watcher annotations.
func summary(objs []obj) []string {
	var out []string
	for _, o := range objs {
		s := fmt.Sprintf("%s %s/%s", o["kind"], str(o, "metadata", "namespace"), nameOf(o))
		if o["kind"] == "ConfigMap" {
			var keys []string
			ann, _ := dig(o, "metadata", "annotations").(map[string]any)
			for k := range ann {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			s += " " + strings.Join(keys, ",")
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// TestUninstallRemovesOnlyWhatThisInstallWrote ensures make uninstall, for a
// cluster-wide install, removes its objects, Lease, pods, digest key, and in
// the namespaces it acted in (those that opted in) its Events, the state
// ConfigMaps it made (label, the annotation naming the Secret, that Secret
// as owner) and the annotations it writes, and nothing else: not another
// install's state, annotations, Events and Lease in a namespace it did not
// watch, not a ConfigMap that carries its label alone, not the user's own
// annotations.
func TestUninstallRemovesOnlyWhatThisInstallWrote(t *testing.T) {
	before := uninstallCluster(t)
	left, _, out, err := runUninstall(t, before, "", "YES=1")
	require.NoError(t, err, out)

	gone := []string{
		"Lease cw/config-watcher", "Secret cw/config-watcher-digest-key",
		"Pod cw/config-watcher-1", "Pod cw/config-watcher-2",
		"Event team-a/webapp-config.1",
		"Deployment cw/config-watcher", "PodDisruptionBudget cw/config-watcher",
		"ServiceAccount cw/config-watcher", "Role cw/config-watcher", "RoleBinding cw/config-watcher",
		"ClusterRole /config-watcher", "ClusterRoleBinding /config-watcher",
	}
	var want []obj
	for _, o := range before {
		name := fmt.Sprintf("%s %s/%s", o["kind"], str(o, "metadata", "namespace"), nameOf(o))
		switch {
		case slices.Contains(gone, name):
		case name == "ConfigMap team-a/config-watcher-secret.db":
		case name == "ConfigMap team-a/webapp-config":
			o = deepCopy(t, []obj{o})[0]
			ann := dig(o, "metadata", "annotations").(map[string]any)
			delete(ann, "config-watcher.k8spatterns.io/restarted-for")
			delete(ann, "config-watcher.k8spatterns.io/halted")
			want = append(want, o)
		default:
			want = append(want, o)
		}
	}
	assert.Equal(t, summary(want), summary(left), "what is left\n%s", out)
}

// TestUninstallListsAndAsksFirst ensures make uninstall shows what it will
// remove and removes nothing unless told yes: without an answer on stdin
// (and no YES=1) it refuses, any answer but yes stops it, yes goes on.
func TestUninstallListsAndAsksFirst(t *testing.T) {
	before := uninstallCluster(t)
	for _, tc := range []struct {
		name, stdin string
		removes     bool
	}{
		{"NoAnswer", "", false},
		{"AnswerNo", "no\n", false},
		{"AnswerYes", "yes\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			left, changes, out, err := runUninstall(t, before, tc.stdin)
			for _, shown := range []string{"state ConfigMap team-a config-watcher-secret.db", "annotations of ConfigMap team-a webapp-config " +
				"config-watcher.k8spatterns.io/halted config-watcher.k8spatterns.io/restarted-for", "cw lease/config-watcher", "1 Events"} {
				assert.Contains(t, out, shown)
			}
			assert.NotContains(t, out, "team-b")
			if !tc.removes {
				assert.Error(t, err)
				assert.Empty(t, changes)
				assert.Equal(t, summary(before), summary(left))
				return
			}
			require.NoError(t, err, out)
			assert.NotEmpty(t, changes)
		})
	}
}
