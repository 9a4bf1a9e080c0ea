package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	release "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// clusterTimeout bounds one install or upgrade: Helm applies the objects and does not wait
// for them (the chart has no hooks); the caller waits for what it needs.
const clusterTimeout = 2 * time.Minute

// clusterFlags are what install and upgrade take, as the helm CLI spells them: the
// kubeconfig (KUBECONFIG when unset), the release's namespace and its values.
type clusterFlags struct {
	fs         *flag.FlagSet
	kubeconfig *string
	namespace  *string
	values     *valueFlags
}

func newClusterFlags(name string) *clusterFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return &clusterFlags{
		fs:         fs,
		kubeconfig: fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "the cluster's kubeconfig"),
		namespace:  fs.String("namespace", "", "the release's namespace"),
		values:     addValueFlags(fs),
	}
}

// parse reads args as NAME CHART (a directory or a packaged .tgz) and returns the
// release's name, its chart loaded, its values and the action configuration for the
// cluster.
func (c *clusterFlags) parse(args []string) (string, *chart.Chart, map[string]any, *action.Configuration, error) {
	if err := c.fs.Parse(args); err != nil {
		return "", nil, nil, nil, err
	}
	if c.fs.NArg() != 2 || *c.namespace == "" || *c.kubeconfig == "" {
		return "", nil, nil, nil, errors.New("want -namespace NS, a kubeconfig (-kubeconfig or KUBECONFIG), NAME and CHART")
	}
	vals, err := c.values.read()
	if err != nil {
		return "", nil, nil, nil, err
	}
	ch, err := loader.Load(c.fs.Arg(1))
	if err != nil {
		return "", nil, nil, nil, fmt.Errorf("load %s: %w", c.fs.Arg(1), err)
	}
	getter := genericclioptions.NewConfigFlags(false)
	getter.KubeConfig, getter.Namespace = c.kubeconfig, c.namespace
	cfg := action.NewConfiguration()
	if err := cfg.Init(getter, *c.namespace, "secret"); err != nil {
		return "", nil, nil, nil, err
	}
	return c.fs.Arg(0), ch, vals, cfg, nil
}

// runInstall is `helm install`: the chart as release NAME in NAMESPACE, adopting the
// objects already there that carry the release's meta.helm.sh annotations.
func runInstall(args []string) error {
	c := newClusterFlags("helm install")
	name, ch, vals, cfg, err := c.parse(args)
	if err != nil {
		return err
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace = name, *c.namespace
	in.WaitStrategy, in.Timeout = kube.HookOnlyStrategy, clusterTimeout
	r, err := in.Run(ch, vals)
	if err != nil {
		return err
	}
	return printRelease(r)
}

// runUpgrade is `helm upgrade`: release NAME in NAMESPACE to the chart with these values
// (none given: the release's own, as helm does).
func runUpgrade(args []string) error {
	c := newClusterFlags("helm upgrade")
	name, ch, vals, cfg, err := c.parse(args)
	if err != nil {
		return err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace = *c.namespace
	up.WaitStrategy, up.Timeout = kube.HookOnlyStrategy, clusterTimeout
	r, err := up.Run(name, ch, vals)
	if err != nil {
		return err
	}
	return printRelease(r)
}

// printRelease says what was released, as helm's first lines do, then its NOTES.
func printRelease(r any) error {
	rel, ok := r.(*release.Release)
	if !ok {
		return fmt.Errorf("a %T, not a v1 release", r)
	}
	fmt.Printf("NAME: %s\nNAMESPACE: %s\nREVISION: %d\nCHART: %s-%s\nSTATUS: %s\n",
		rel.Name, rel.Namespace, rel.Version, rel.Chart.Metadata.Name, rel.Chart.Metadata.Version, rel.Info.Status)
	fmt.Fprintln(os.Stderr, rel.Info.Notes)
	return nil
}
