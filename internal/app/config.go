package app

import (
	"bytes"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/k8spatterns/config-watcher/internal/k8sname"
	"github.com/k8spatterns/config-watcher/leader"
	"github.com/k8spatterns/config-watcher/policy"
	"github.com/k8spatterns/config-watcher/selector"
)

// config is every setting, parsed and validated once at start.
type config struct {
	Namespaces         []string // "" alone: every namespace
	LeaseNamespace     string
	APIURL             string
	SelectorAnnotation string
	HTTPAddr           string
	LogFormat          string
	LogLevel           slog.Level
	PodName            string
	PodNamespace       string
	PodUID             string
	// NamespaceSelector chooses the Namespaces that opted in under
	// WATCH_NAMESPACE=*; nil: every namespace.
	NamespaceSelector *selector.Selector
	// PodOptIn is the label every restarted pod must carry; nil: none.
	PodOptIn         *selector.Selector
	RecordHash       bool
	WatchSecrets     bool
	DigestKeyFile    string
	DigestKey        []byte // read from DigestKeyFile when WatchSecrets
	Workers          int
	ShutdownTimeout  time.Duration
	RestartStrategy  string
	MaxUnavailable   policy.Budget
	MinReadySeconds  int
	ProgressDeadline time.Duration
	MaxConcurrent    int
	Settle           time.Duration
	StormChanges     int
	StormWindow      time.Duration
	MaxRestartsPerS  int
	DryRun           bool
	PodIndex         bool
	Events           bool
	LeaderElect      bool
	LeaseName        string
	LeaseDuration    time.Duration
	RenewDeadline    time.Duration
	RetryPeriod      time.Duration
}

// setting is one environment variable and its flag twin.
type setting struct {
	env, flag, def, help string
	value                value
}

// value reads a setting's text, from its variable or its flag alike, into
// the config. kind names what it takes in --help: bool, int, duration,
// string, or the choices (text|json).
type value struct {
	kind  string
	apply func(c *config, v string) error
}

// text is a setting whose value is a string the function checks.
func text(apply func(c *config, v string) error) value { return value{"string", apply} }

var settings = []setting{
	{"WATCH_NAMESPACE", "watch-namespace", "default", "namespaces whose ConfigMaps are watched: one, a comma-separated list, or * for all (one cluster-wide watch; needs a ClusterRole)", text(func(c *config, v string) error {
		if v == "*" {
			c.Namespaces = []string{""}
			return nil
		}
		c.Namespaces = nil
		for _, ns := range strings.Split(v, ",") {
			ns = strings.TrimSpace(ns)
			if k8sname.Label(ns) != nil {
				return fmt.Errorf("%q is not a namespace name (a DNS-1123 label); give one, a comma-separated list, or *", ns)
			}
			if slices.Contains(c.Namespaces, ns) {
				return fmt.Errorf("namespace %q is listed twice", ns)
			}
			c.Namespaces = append(c.Namespaces, ns)
		}
		return nil
	})},
	{"LEASE_NAMESPACE", "lease-namespace", "", "namespace of the leader-election Lease (default: the first watched namespace; required with WATCH_NAMESPACE=*)", namespaceName(func(c *config) *string { return &c.LeaseNamespace })},
	{"API_URL", "api-url", "http://localhost:8001", "base URL of the API server, normally the kubectl proxy ambassador", text(func(c *config, v string) error {
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return errors.New("must be an http:// or https:// URL with a host")
		}
		c.APIURL = v
		return nil
	})},
	{"SELECTOR_ANNOTATION", "selector-annotation", "k8spatterns.io/podDeleteSelector", "annotation on a ConfigMap that holds the label selector of the pods to restart", text(func(c *config, v string) error {
		if err := selector.ValidateKey(v); err != nil {
			return fmt.Errorf("must be an annotation key: %w", err)
		}
		c.SelectorAnnotation = v
		return nil
	})},
	{"HTTP_ADDR", "http-addr", ":8080", "address serving /healthz, /readyz and /metrics", text(func(c *config, v string) error {
		if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
			return errors.New("must be host:port or :port")
		}
		c.HTTPAddr = v
		return nil
	})},
	{"LOG_FORMAT", "log-format", "text", "log format", oneOf(func(c *config, v string) { c.LogFormat = v }, "text", "json")},
	{"LOG_LEVEL", "log-level", "info", "least severe level logged", oneOf(func(c *config, v string) { c.LogLevel = logLevels[v] }, "debug", "info", "warn", "error")},
	{"POD_NAME", "pod-name", "", "name of the controller's own pod, which it never deletes (from the Downward API)", text(func(c *config, v string) error {
		c.PodName = v
		return nil
	})},
	{"POD_NAMESPACE", "pod-namespace", "", "namespace of the controller's own pod (from the Downward API): with POD_NAME, the controller reads its pod once to learn its owner, and never restarts a pod of that owner (a standby replica)", namespaceName(func(c *config) *string { return &c.PodNamespace })},
	{"POD_UID", "pod-uid", "", "uid of the controller's own pod (from the Downward API), which it never restarts", text(func(c *config, v string) error {
		if len(v) > 128 || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r > '~' }) {
			return errors.New("must be a pod's metadata.uid")
		}
		c.PodUID = v
		return nil
	})},
	{"NAMESPACE_SELECTOR", "namespace-selector", "config-watcher.k8spatterns.io/enabled=true", "with WATCH_NAMESPACE=*, the label selector of the Namespaces that opt in: ConfigMaps and Secrets elsewhere are ignored (needs list and watch on namespaces); empty: every namespace", selectorSetting(selector.ParseAny, func(c *config) **selector.Selector { return &c.NamespaceSelector })},
	{"POD_OPT_IN_LABEL", "pod-opt-in-label", "", "a label (key=value) every restarted pod must carry besides matching the selector, so a workload consents in its own pod template (e.g. config-watcher.k8spatterns.io/restart=true); empty: none, the book's pattern", selectorSetting(selector.ParseLabel, func(c *config) **selector.Selector { return &c.PodOptIn })},
	{"RECORD_HASH", "record-hash", "true", "record the restarted-for data hash on each ConfigMap (needs patch on configmaps); false keeps it in memory only", boolSetting(func(c *config) *bool { return &c.RecordHash })},
	{"WATCH_SECRETS", "watch-secrets", "false", "also watch Secrets carrying the selector annotation or restartReferencingPods (needs the manifests/secrets component: list and watch on secrets, create on configmaps)", boolSetting(func(c *config) *bool { return &c.WatchSecrets })},
	{"DIGEST_KEY_FILE", "digest-key-file", "/etc/config-watcher/digest-key/key", "file holding the key of the digests of Secret data: 32 random bytes, base64-encoded (blanks around it ignored); required with WATCH_SECRETS", text(func(c *config, v string) error {
		c.DigestKeyFile = v
		return nil
	})},
	{"WORKERS", "workers", "4", "ConfigMaps and Secrets reconciled at once", intSetting(1, 64, func(c *config) *int { return &c.Workers })},
	{"SHUTDOWN_TIMEOUT", "shutdown-timeout", "10s", "how long in-flight restarts may finish after SIGTERM (keep it below the pod's grace period)", durationSetting(0, 5*time.Minute, "0s to 5m", func(c *config) *time.Duration { return &c.ShutdownTimeout })},
	{"RESTART_STRATEGY", "restart-strategy", "delete", "how pods are restarted: delete (the pattern) or evict (the Eviction API, which honours PodDisruptionBudgets; needs create on pods/eviction)", oneOf(func(c *config, v string) { c.RestartStrategy = v }, "delete", "evict")},
	{"MAX_UNAVAILABLE", "max-unavailable", "25%", "how many of the pods an object selects may be unavailable during its restarts, counting pods down for any reason: a number, or a percentage of the pods their owners expect, rounded down (at least 1); pods that serve nothing (crash-looping, or not Ready for 10s) are restarted first, outside it; 100% restarts all at once", text(func(c *config, v string) error {
		b, err := policy.ParseBudget(v)
		c.MaxUnavailable = b
		return err
	})},
	{"MIN_READY_SECONDS", "min-ready-seconds", "0", "seconds a pod must have been Ready to count as available in the restart budget (as a Deployment's minReadySeconds)", intSetting(0, 3600, func(c *config) *int { return &c.MinReadySeconds })},
	{"PROGRESS_DEADLINE", "progress-deadline", "10m", "a round that could restart no pod for this long halts (Warning Event RolloutHalted) and goes on when pods become Ready; replacements not Ready this long after the last restart get a ReplacementsNotReady Event", durationSetting(time.Second, 24*time.Hour, "1s to 24h", func(c *config) *time.Duration { return &c.ProgressDeadline })},
	{"MAX_CONCURRENT_RESTARTS", "max-concurrent-restarts", "10", "restart requests of one ConfigMap or Secret in flight at once; 0: no cap", intSetting(0, 10000, func(c *config) *int { return &c.MaxConcurrent })},
	{"SETTLE", "settle", "0s", "a round's first restart waits until no annotated object selecting any of its pods has changed for this long, so that changes arriving together (a Helm upgrade, a GitOps sync) restart each pod once; 0s: at once", durationSetting(0, 10*time.Minute, "0s to 10m", func(c *config) *time.Duration { return &c.Settle })},
	{"STORM_CHANGES", "storm-changes", "5", "more data changes of one object than this within STORM_WINDOW are a storm: Warning Event ChangeStorm, and its pods restarted at most once per STORM_WINDOW until its data has been quiet that long; 0: no storm guard", intSetting(0, 1000, func(c *config) *int { return &c.StormChanges })},
	{"STORM_WINDOW", "storm-window", "1m", "the window of STORM_CHANGES, and in a storm the least time between two rounds of the object", durationSetting(time.Second, time.Hour, "1s to 1h", func(c *config) *time.Duration { return &c.StormWindow })},
	{"MAX_RESTARTS_PER_SECOND", "max-restarts-per-second", "50", "restart requests of all objects together per second, with bursts of ten times as many; 0: no cap", intSetting(0, 10000, func(c *config) *int { return &c.MaxRestartsPerS })},
	{"DRY_RUN", "dry-run", "false", "do everything but restart: requests go with dryRun=All, nothing is deleted, evicted or recorded", boolSetting(func(c *config) *bool { return &c.DryRun })},
	{"POD_INDEX", "pod-index", "true", "keep an index of pods (owner, readiness) from a pod watch, with either strategy: every round decides from it, without a LIST per wave (needs watch on pods); false lists pods for each wave", boolSetting(func(c *config) *bool { return &c.PodIndex })},
	{"EVENTS", "events", "true", "record Kubernetes Events on the ConfigMaps and Secrets acted for (needs create on events)", boolSetting(func(c *config) *bool { return &c.Events })},
	{"LEADER_ELECT", "leader-elect", "false", "elect one active replica with a Lease in the watched namespace (needs POD_NAME); standbys watch but never act", boolSetting(func(c *config) *bool { return &c.LeaderElect })},
	{"LEASE_NAME", "lease-name", "config-watcher", "name of the coordination.k8s.io Lease used for leader election", text(func(c *config, v string) error {
		if k8sname.Subdomain(v) != nil {
			return errors.New("must be a Lease name (a DNS-1123 subdomain)")
		}
		c.LeaseName = v
		return nil
	})},
	{"LEASE_DURATION", "lease-duration", "15s", "how long standbys wait after the leader's last renewal before taking over", leaseTime(func(c *config) *time.Duration { return &c.LeaseDuration })},
	{"RENEW_DEADLINE", "renew-deadline", "10s", "how long the leader keeps acting without renewing its lease (shorter than LEASE_DURATION)", leaseTime(func(c *config) *time.Duration { return &c.RenewDeadline })},
	{"RETRY_PERIOD", "retry-period", "2s", "interval between attempts to acquire or renew the lease", leaseTime(func(c *config) *time.Duration { return &c.RetryPeriod })},
}

// namespaceName is a namespace's name, or none when empty.
func namespaceName(field func(c *config) *string) value {
	return text(func(c *config, v string) error {
		if v != "" && k8sname.Label(v) != nil {
			return errors.New("must be a namespace name (a DNS-1123 label)")
		}
		*field(c) = v
		return nil
	})
}

// selectorSetting is a selector parse takes, or none when empty.
func selectorSetting(parse func(string) (*selector.Selector, error), field func(c *config) **selector.Selector) value {
	return text(func(c *config, v string) error {
		*field(c) = nil
		if v == "" {
			return nil
		}
		sel, err := parse(v)
		*field(c) = sel
		return err
	})
}

func boolSetting(field func(c *config) *bool) value {
	return value{"bool", func(c *config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("must be true or false")
		}
		*field(c) = b
		return nil
	}}
}

func intSetting(lo, hi int, field func(c *config) *int) value {
	return value{"int", func(c *config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return fmt.Errorf("must be a whole number from %d to %d", lo, hi)
		}
		*field(c) = n
		return nil
	}}
}

func durationSetting(lo, hi time.Duration, bounds string, field func(c *config) *time.Duration) value {
	return value{"duration", func(c *config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < lo || d > hi {
			return fmt.Errorf("must be a duration from %s", bounds)
		}
		*field(c) = d
		return nil
	}}
}

// leaseTime is the range of the durations of leader election.
func leaseTime(field func(c *config) *time.Duration) value {
	return durationSetting(100*time.Millisecond, 10*time.Minute, "100ms to 10m", field)
}

// oneOf takes one of choices, in any case, and sets it as written there.
func oneOf(set func(c *config, v string), choices ...string) value {
	return value{strings.Join(choices, "|"), func(c *config, v string) error {
		for _, choice := range choices {
			if strings.EqualFold(v, choice) {
				set(c, choice)
				return nil
			}
		}
		return fmt.Errorf("must be one of %s (any case)", strings.Join(choices, ", "))
	}}
}

var logLevels = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}

// digestKeyBytes is the size of the digest key: SHA-256's output, all of
// it random.
const digestKeyBytes = 32

// The key must be one policy accepts.
var _ [digestKeyBytes - policy.MinDigestKey]struct{}

// validate checks what involves several settings, reads the digest key,
// and fills LeaseNamespace.
func (c *config) validate() error {
	if c.WatchSecrets {
		key, err := readDigestKey(c.DigestKeyFile)
		if err != nil {
			return fmt.Errorf("WATCH_SECRETS=true needs a digest key of %d random bytes, base64-encoded, in DIGEST_KEY_FILE (%s): %w. In the cluster, create it once with: kubectl -n <controller namespace> create secret generic config-watcher-digest-key --from-literal=key=\"$(head -c 32 /dev/urandom | base64)\"", digestKeyBytes, c.DigestKeyFile, err)
		}
		c.DigestKey = key
	}
	if !c.LeaderElect {
		return nil
	}
	if c.LeaseNamespace == "" {
		c.LeaseNamespace = c.Namespaces[0]
	}
	switch {
	case c.LeaseNamespace == "":
		return errors.New("LEADER_ELECT=true with WATCH_NAMESPACE=* needs LEASE_NAMESPACE: where the Lease lives")
	case c.PodName == "":
		return errors.New("LEADER_ELECT=true needs POD_NAME: it is the replica's identity in the Lease")
	case !c.RecordHash:
		return errors.New("LEADER_ELECT=true needs RECORD_HASH=true: a standby learns what the leader did from the recorded hashes, and would otherwise repeat its restarts after a failover")
	}
	return c.election().Validate()
}

// readDigestKey reads the digest key: base64 text of digestKeyBytes bytes.
// Blanks around it are not part of it (a file written with echo ends in a
// newline), and a key that is not base64, or of another size, is refused:
// text typed by hand is no random key.
func readDigestKey(file string) ([]byte, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	key, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(text)))
	switch {
	case err != nil:
		return nil, errors.New("the key is not base64")
	case len(key) != digestKeyBytes:
		return nil, fmt.Errorf("the key is %d bytes once decoded, not %d", len(key), digestKeyBytes)
	}
	return key, nil
}

// ownPod is the controller's own pod as the settings name it.
func (c *config) ownPod() policy.OwnPod {
	return policy.OwnPod{Namespace: c.PodNamespace, Name: c.PodName, UID: c.PodUID}
}

// watches reports whether namespace is watched.
func (c *config) watches(namespace string) bool {
	return c.watched() == "*" || slices.Contains(c.Namespaces, namespace)
}

// namespaceConsent reports whether only opted-in namespaces are acted in.
func (c *config) namespaceConsent() bool { return c.watched() == "*" && c.NamespaceSelector != nil }

// watched names the namespaces watched as WATCH_NAMESPACE does.
func (c *config) watched() string {
	if len(c.Namespaces) == 1 && c.Namespaces[0] == "" {
		return "*"
	}
	return strings.Join(c.Namespaces, ",")
}

// election is the leader election's configuration.
func (c *config) election() leader.Config {
	return leader.Config{
		Namespace:     c.LeaseNamespace,
		Name:          c.LeaseName,
		Identity:      c.PodName,
		LeaseDuration: c.LeaseDuration,
		RenewDeadline: c.RenewDeadline,
		RetryPeriod:   c.RetryPeriod,
	}
}

// errVersion: --version was given; nothing is to run.
var errVersion = errors.New("--version given")

// loadConfig reads each setting from its flag if given, else from its
// environment variable if set (even to ""), else its default.
func loadConfig(args []string, lookupEnv func(string) (string, bool), out io.Writer) (config, error) {
	fs := flag.NewFlagSet("config-watcher", flag.ContinueOnError)
	fs.SetOutput(out)
	for _, s := range settings {
		fs.Var(&flagText{isBool: s.value.kind == "bool"}, s.flag, s.help)
	}
	showVersion := fs.Bool("version", false, "print the version, the commit and the Go version, and exit")
	fs.Usage = func() { usage(out) }
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if *showVersion {
		return config{}, errVersion
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	given := map[string]string{} // flag → value, of the flags given
	fs.Visit(func(f *flag.Flag) { given[f.Name] = f.Value.String() })

	var c config
	for _, s := range settings {
		v, source := s.def, "default"
		if fv, ok := given[s.flag]; ok {
			v, source = fv, "--"+s.flag
		} else if ev, ok := lookupEnv(s.env); ok {
			v, source = ev, s.env
		}
		if err := s.value.apply(&c, v); err != nil {
			return config{}, fmt.Errorf("%s=%q (from %s): %w", s.env, v, source, err)
		}
	}
	if err := c.validate(); err != nil {
		return config{}, err
	}
	return c, nil
}

// flagText holds a flag's text as given, so that it is read by the same code
// and with the same errors as its variable's. A bool flag may stand alone:
// --dry-run is --dry-run=true.
type flagText struct {
	text   string
	isBool bool
}

func (f *flagText) String() string     { return f.text }
func (f *flagText) Set(v string) error { f.text = v; return nil }
func (f *flagText) IsBoolFlag() bool   { return f.isBool }

// usage prints --help: each setting in the order of the table, with what it
// takes, its variable and its default.
func usage(out io.Writer) {
	fmt.Fprintf(out, "config-watcher restarts pods when the data of a ConfigMap that selects them changes.\n\n")
	fmt.Fprintf(out, "Every setting is an environment variable with a flag twin; a flag wins.\n\n")
	for _, s := range settings {
		takes := " " + s.value.kind
		if s.value.kind == "bool" {
			takes = "" // --flag alone is true; --flag=false
		}
		def := s.def
		if s.value.kind == "string" {
			def = strconv.Quote(def)
		}
		fmt.Fprintf(out, "  --%s%s\n    \t%s (env %s, default %s)\n", s.flag, takes, s.help, s.env, def)
	}
	fmt.Fprintf(out, "  --version\n    \tprint the version, the commit and the Go version, and exit\n")
}
