// Command config-watcher restarts the pods that read a ConfigMap when its
// data changes: the Controller pattern of "Kubernetes Patterns", done with a
// raw list + watch through a kubectl proxy ambassador. A ConfigMap opts in
// with the annotation
//
//	k8spatterns.io/podDeleteSelector: "app=webapp"
//
// and every change of its data deletes the pods that selector matches,
// exactly once, so their Deployment recreates them with the new values.
// Settings are environment variables with flag twins; see --help.
package main

import (
	"os"
	"runtime/debug"

	"github.com/k8spatterns/config-watcher/internal/app"
)

// version and commit are stamped at build time with
// -ldflags "-X main.version=… -X main.commit=…".
var version, commit = "dev", ""

func main() { os.Exit(app.Main(os.Args[1:], version, revision())) }

// revision is the commit the binary was built from: the stamped one, else
// the one the go command recorded (with -dirty for a modified tree), else
// "unknown".
func revision() string {
	if commit != "" {
		return commit
	}
	rev, dirty := "unknown", ""
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return rev
	}
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	return rev + dirty
}
