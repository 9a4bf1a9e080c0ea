// Package app is the program: its settings, the wiring of its parts, its
// probes and signals. main stamps the version and calls Main; tests and the
// simulator call Run with their own environment and transport.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/events"
	"github.com/k8spatterns/config-watcher/internal/memlimit"
	"github.com/k8spatterns/config-watcher/leader"
	"github.com/k8spatterns/config-watcher/metrics"
	"github.com/k8spatterns/config-watcher/podindex"
	"github.com/k8spatterns/config-watcher/policy"
	"github.com/k8spatterns/config-watcher/selector"
	"github.com/k8spatterns/config-watcher/watch"
)

// Options are what the program takes from its process; tests and the
// simulator give their own.
type Options struct {
	Args      []string
	LookupEnv func(string) (string, bool)
	Stdout    io.Writer
	Stderr    io.Writer
	// Version and Revision are what --version and build_info say.
	Version, Revision string
	// Ready, if not nil, receives the HTTP address once it listens (for tests).
	Ready chan<- string
	// Transport, if not nil, carries every API request instead of the
	// network, and no HTTP server is started: a goroutine blocked on a real
	// socket would keep a synctest bubble's clock from moving (the simulator).
	Transport http.RoundTripper
	// Wired, if not nil, is called once the parts are wired with what a
	// test may read of them while the program runs (the simulator reads
	// them in its bubble, where no listener serves /metrics).
	Wired func(Wiring)
	// Stall, if not nil, holds a round's worker up before each wave
	// (policy.Config.Stall): the simulator's scheduling noise.
	Stall func(site string) time.Duration
}

// Wiring is what Options.Wired is given: read-only views of the parts.
type Wiring struct {
	// Metrics serves what /metrics serves.
	Metrics http.Handler
	// Sizes returns the sizes of the controller's tables (policy.Controller.Sizes).
	Sizes func() map[string]int
}

// Main runs the program with its arguments until SIGTERM or SIGINT and
// returns the exit code.
func Main(args []string, version, revision string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := Run(ctx, Options{Args: args, LookupEnv: os.LookupEnv, Stdout: os.Stdout, Stderr: os.Stderr, Version: version, Revision: revision})
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "config-watcher: %v\n", err)
		return 1
	}
	return 0
}

// Run wires the parts together and blocks until ctx is done.
func Run(ctx context.Context, o Options) error {
	lookupEnv, stderr := o.LookupEnv, o.Stderr
	cfg, err := loadConfig(o.Args, lookupEnv, stderr)
	if errors.Is(err, errVersion) {
		fmt.Fprintf(o.Stdout, "config-watcher %s (commit %s, %s, %s/%s)\n", o.Version, o.Revision, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return nil
	}
	if err != nil {
		return err
	}
	logOpts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var logHandler slog.Handler = slog.NewTextHandler(stderr, logOpts)
	if cfg.LogFormat == "json" {
		logHandler = slog.NewJSONHandler(stderr, logOpts)
	}
	log := slog.New(logHandler)
	// Before anything allocates much: the initial list is the peak.
	if ml, err := memlimit.Set(lookupEnv, os.DirFS("/")); err != nil {
		log.Warn("could not read the container's memory limit; GOMEMLIMIT not set", "err", err)
	} else if ml.Limit > 0 {
		log.Info("memory limit", "gomemlimit", ml.Limit, "container_limit", ml.Container, "source", ml.Source, "from_env", ml.FromEnv)
	}

	newClient := apiclient.New
	if o.Transport != nil {
		newClient = func(url, agent string) (*apiclient.Client, error) {
			return apiclient.NewWithTransport(url, agent, o.Transport)
		}
	}
	client, err := newClient(cfg.APIURL, "config-watcher/"+o.Version)
	if err != nil {
		return err
	}
	reg := metrics.NewRegistry()
	reg.NewInfo("config_watcher_build_info", "Build information.", map[string]string{"version": o.Version, "revision": o.Revision, "goversion": runtime.Version()})
	reg.RegisterProcess(os.DirFS("/"))
	reg.RegisterGoRuntime()

	leading := reg.NewGauge("config_watcher_leader", "1 while this replica may act (always, without leader election).")
	pcfg := policy.Config{
		SelectorAnnotation:    cfg.SelectorAnnotation,
		RecordHash:            cfg.RecordHash,
		OwnPod:                cfg.ownPod(),
		PodOptIn:              cfg.PodOptIn,
		Workers:               cfg.Workers,
		ShutdownGrace:         cfg.ShutdownTimeout,
		Strategy:              cfg.RestartStrategy,
		MaxUnavailable:        cfg.MaxUnavailable,
		MinReadySeconds:       time.Duration(cfg.MinReadySeconds) * time.Second,
		ProgressDeadline:      cfg.ProgressDeadline,
		MaxConcurrentRestarts: cfg.MaxConcurrent,
		Settle:                cfg.Settle,
		StormChanges:          cfg.StormChanges,
		StormWindow:           cfg.StormWindow,
		MaxRestartsPerSecond:  cfg.MaxRestartsPerS,
		DryRun:                cfg.DryRun,
		DigestKey:             cfg.DigestKey,
		Stall:                 o.Stall,
	}
	var recorder *events.Recorder
	if cfg.Events {
		recorder = events.New(events.Config{Instance: cfg.PodName}, client, log, reg)
		pcfg.Events = recorder
	}
	var elector *leader.Elector
	if cfg.LeaderElect {
		elector, err = leader.New(cfg.election(), client, log, func(leads bool) {
			v := 0.0
			if leads {
				v = 1
			}
			leading.Set(v)
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		pcfg.MayAct = elector.Leading
	} else {
		leading.Set(1)
	}
	var pods *podindex.Namespaces
	if cfg.PodIndex {
		// An index is offered only while its watch stream is open (Watching,
		// not Ready with its grace: a frozen index must not decide), and is
		// not part of readiness: without one a round lists pods. It watches
		// whole pods: rounds decide from their owners and readiness.
		podMetrics := watch.NewMetricsFor(reg, "pod_index")
		indexed := reg.NewGauge("config_watcher_pod_index_namespaces", "Namespaces whose pods are indexed (those holding an annotated ConfigMap or Secret, and, for 30 s, those that lost their last one).")
		podLog := log.With("watch", "pods")
		pods = podindex.NewNamespaces(podindex.NamespacesConfig{
			Watch: func(ns string, h watch.Handler) *watch.ListWatcher {
				return watch.New(watch.Config{Path: apiclient.CorePath(ns, "pods", ""), Kind: "Pod"}, client, h, podLog.With("namespace", ns), podMetrics)
			},
			Indexed: func(n int) { indexed.Set(float64(n)) },
		}, log)
		pcfg.Pods = pods
	}
	if cfg.PodNamespace != "" && cfg.PodName != "" && cfg.watches(cfg.PodNamespace) {
		// Before anything acts: a standby replica is spared by its owner.
		if pcfg.OwnPod, err = learnOwnPod(ctx, client, cfg.ownPod(), log); err != nil {
			return err
		}
	}
	var lws []*watch.ListWatcher
	var consent *policy.NamespaceConsent
	var startAfter <-chan struct{}
	if cfg.namespaceConsent() {
		consent = policy.NewNamespaceConsent(cfg.NamespaceSelector, log.With("watch", "namespaces"))
		pcfg.Namespaces, startAfter = consent, consent.Listed()
		// Only the Namespaces that opted in, and only their metadata (no
		// Kind: metadata-only watch events are PartialObjectMetadata).
		lws = append(lws, watch.New(watch.Config{Path: apiclient.CoreClusterPath("namespaces"), MetadataOnly: true, LabelSelector: cfg.NamespaceSelector.String()},
			client, consent, log.With("watch", "namespaces"), watch.NewMetricsFor(reg, "namespace")))
	}
	ctrl := policy.New(pcfg, client, log, policy.NewMetrics(reg))
	watchMetrics := watch.NewMetrics(reg)
	var objectLWs []*watch.ListWatcher // of ConfigMaps and Secrets
	for _, ns := range cfg.Namespaces {
		path := apiclient.CoreClusterPath("configmaps") // WATCH_NAMESPACE=*
		if ns != "" {
			path = apiclient.CorePath(ns, "configmaps", "")
		}
		// Paged lists decoded item by item: memory follows the largest
		// ConfigMap, not the namespace (docs/memory.md).
		objectLWs = append(objectLWs, watch.New(watch.Config{Path: path, Kind: "ConfigMap", StartAfter: startAfter}, client, ctrl.ForConfigMaps(ns), log, watchMetrics))
	}
	if cfg.WatchSecrets {
		secretMetrics := watch.NewMetricsFor(reg, "secret")
		secretLog := log.With("watch", "secrets")
		for _, ns := range cfg.Namespaces {
			path := apiclient.CoreClusterPath("secrets")
			if ns != "" {
				path = apiclient.CorePath(ns, "secrets", "")
			}
			// Helm keeps up to 1 MiB per release in Secrets no one
			// annotates: the server leaves them out.
			objectLWs = append(objectLWs, watch.New(watch.Config{Path: path, Kind: "Secret", FieldSelector: "type!=helm.sh/release.v1", StartAfter: startAfter}, client, ctrl.ForSecrets(ns), secretLog, secretMetrics))
		}
	}
	lws = append(lws, objectLWs...)
	if consent != nil {
		// The objects of a namespace that opts in were ignored: a list
		// shows them again, to be adopted as new.
		consent.OptedIn = func(string) {
			for _, lw := range objectLWs {
				lw.Relist()
			}
		}
		consent.OptedOut = ctrl.ForgetNamespace
	}

	if o.Wired != nil {
		o.Wired(Wiring{Metrics: reg, Sizes: ctrl.Sizes})
	}

	httpAddr := "none"
	var srv *http.Server
	if o.Transport == nil {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("HTTP_ADDR: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /healthz", probe(lws, notAlive))
		mux.Handle("GET /readyz", probe(lws, (*watch.ListWatcher).Unready))
		mux.Handle("GET /metrics", reg)
		srv = newHTTPServer(mux)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("HTTP server failed", "err", err)
			}
		}()
		httpAddr = ln.Addr().String()
		if o.Ready != nil {
			o.Ready <- httpAddr
		}
	}

	log.Info("starting", "version", o.Version, "namespaces", cfg.watched(), "api_url", cfg.APIURL,
		"namespace_selector", fmtSelector(cfg.NamespaceSelector), "pod_opt_in_label", fmtSelector(cfg.PodOptIn), "own_pod", cfg.PodName,
		"selector_annotation", cfg.SelectorAnnotation, "record_hash", cfg.RecordHash, "leader_elect", cfg.LeaderElect, "restart_strategy", cfg.RestartStrategy, "max_unavailable", cfg.MaxUnavailable.String(), "min_ready_seconds", cfg.MinReadySeconds, "pod_index", cfg.PodIndex, "watch_secrets", cfg.WatchSecrets, "dry_run", cfg.DryRun, "http_addr", httpAddr)
	if cfg.WatchSecrets {
		go reportSecretAccess(ctx, client, cfg.Namespaces, cfg.RecordHash && !cfg.DryRun, log)
	}
	var wg sync.WaitGroup
	for _, lw := range lws {
		wg.Go(func() { _ = lw.Run(ctx) })
	}
	if pods != nil {
		wg.Go(func() { pods.Run(ctx) })
	}
	if recorder != nil {
		// Events go on until run returns, so a round that finishes during
		// the shutdown grace is still reported (best effort).
		eventsCtx, stopEvents := context.WithCancel(context.WithoutCancel(ctx))
		defer stopEvents()
		go recorder.Run(eventsCtx)
	}
	if elector == nil {
		wg.Go(func() { ctrl.Run(ctx) })
	} else {
		wg.Go(func() {
			elector.Run(ctx, func(leadCtx context.Context) {
				ctrl.Lead(leadCtx, func() time.Duration {
					if ctx.Err() != nil {
						// Shutting down: finish in-flight work while the lease is surely ours.
						return min(cfg.ShutdownTimeout, elector.ValidFor())
					}
					return 0 // leadership lost: stop at once
				})
			})
		})
	}
	wg.Wait()

	if srv != nil {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}
	log.Info("stopped")
	return nil
}

// fmtSelector renders a setting's selector, "" if there is none.
func fmtSelector(s *selector.Selector) string {
	if s == nil {
		return ""
	}
	return s.String()
}

// learnOwnPod reads the controller's own pod to learn its owner, retrying
// what a retry can fix until ctx is done.
func learnOwnPod(ctx context.Context, client *apiclient.Client, own policy.OwnPod, log *slog.Logger) (policy.OwnPod, error) {
	learned, err := backoff.RetryNotifyWithData(func() (policy.OwnPod, error) {
		return policy.LearnOwnPod(ctx, client, own)
	}, backoff.WithContext(apiclient.DefaultBackOff(), ctx), func(err error, d time.Duration) {
		log.Warn("could not read own pod; retrying", "err", err, "retry_in", d)
	})
	if err != nil {
		return own, err
	}
	log.Info("own pod", "namespace", learned.Namespace, "pod", learned.Name, "uid", learned.UID, "owner_uid", learned.OwnerUID)
	return learned, nil
}

// probe answers "ok" while why says nothing of every loop, else 503 and,
// for each loop that is not ok, its path and why.
func probe(lws []*watch.ListWatcher, why func(*watch.ListWatcher) string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		var not []string
		for _, lw := range lws {
			if reason := why(lw); reason != "" {
				not = append(not, lw.Path()+": "+reason)
			}
		}
		if len(not) > 0 {
			http.Error(w, strings.Join(not, "\n"), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}
}

// notAlive is /healthz's reason: the loop is not running.
func notAlive(lw *watch.ListWatcher) string {
	if lw.Alive() {
		return ""
	}
	return "watch loop not running"
}
