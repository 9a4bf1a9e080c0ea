// Command benchtool is bench/run.sh's helper: it loads the API server, drives the
// latency and burst scenarios, reads the audit log, samples /proc, and draws the
// chart. It talks to the API through the kubectl proxy (plain HTTP) with the
// User-Agent "cw-bench", so its own requests are told apart in the audit log from
// the controller's, which go through the same proxy as the same user.
//
//	benchtool ns        -api URL -ns NS                      create a namespace, wait for its ServiceAccount
//	benchtool create    -api URL -ns NS -n N [-from I] ...   create N ConfigMaps of -size bytes, every 2nd annotated
//	benchtool secrets   -api URL -ns NS -n N [-from I] ...   create N Secrets of a realistic mix (20 % TLS), every 500th annotated
//	benchtool pods      -api URL -ns NS -n N -prefix P        create N bare pods P-FROM… labelled bench-pod=P-i (and -labels k=v,…)
//	benchtool latency   -api URL -ns NS -audit F -n N ...     N sequential data changes, latency from the audit log
//	benchtool burst     -api URL -ns NS -audit F -n N ...     N ConfigMaps changed at once
//	benchtool spawn     -log F -ready URL -- CMD ARGS...     start CMD in its own session, time exec -> ready
//	benchtool quiesce   -pid P                               wait until P's session stops using CPU
//	benchtool mem|cpu   -pid P                               RSS/HWM (KiB) or CPU seconds of P's session
//	benchtool idle      -pids P,Q -seconds S                 CPU seconds each session used over S seconds
//	benchtool chart     -in latency.csv -out chart.png
//	benchtool summary   -dir results                         the Markdown table
//	benchtool listprobe -api URL -ns NS                      time pod LISTs right after a ConfigMap write
//	benchtool floor                                          the latency floor: DELETE on each event, nothing else
//	benchtool meter     -upstream URL -addr-file F            count a controller's API requests and bytes read (GET /_meter)
//	benchtool standin   -api URL -ns NS -delay D              the kubelet's readiness: selected pods Ready D after they appear
//	benchtool rollout   -api URL -ns NS -audit F -setting S   one data change: time until every selected pod is new and Ready
//	benchtool waves-summary -dir D                           the waves table (rollout.csv, latency.csv)
//	benchtool coalesce  -api URL -ns NS -audit F -scenario S  changes together, or a storm: pod deletions per pod
//	benchtool coalesce-summary -dir D                        the coalescing table (coalesce.csv)
//	benchtool spread    -dirs D1,D2,D3                       each headline ratio per run, and its spread
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchtool ns|create|secrets|pods|latency|burst|spawn|quiesce|mem|cpu|idle|chart|summary|listprobe|floor|meter|standin|rollout|waves-summary|coalesce|coalesce-summary|spread [flags]")
		os.Exit(2)
	}
	cmds := map[string]func([]string) error{
		"ns": cmdNamespace, "create": cmdCreate, "secrets": cmdSecrets, "pods": cmdPods, "latency": cmdLatency,
		"burst": cmdBurst, "spawn": cmdSpawn, "quiesce": cmdQuiesce, "mem": cmdMem, "cpu": cmdCPU,
		"idle": cmdIdle, "chart": cmdChart, "summary": cmdSummary, "listprobe": cmdListProbe, "floor": cmdFloor, "meter": cmdMeter,
		"standin": cmdStandin, "rollout": cmdRollout, "waves-summary": cmdWavesSummary, "spread": cmdSpread,
		"coalesce": cmdCoalesce, "coalesce-summary": cmdCoalesceSummary,
	}
	f, ok := cmds[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "benchtool: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
	if err := f(os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "benchtool %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
