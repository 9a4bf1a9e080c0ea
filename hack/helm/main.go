package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "helm:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: helm template|package [flags] CHART, helm install|upgrade [flags] NAME CHART, or helm pull [flags] oci://…")
	}
	switch args[0] {
	case "template":
		return runTemplate(args[1:])
	case "package":
		return runPackage(args[1:])
	case "install":
		return runInstall(args[1:])
	case "upgrade":
		return runUpgrade(args[1:])
	case "pull":
		return runPull(args[1:])
	}
	return fmt.Errorf("unknown command %q: want template, package, install, upgrade or pull", args[0])
}

// runTemplate prints the chart's objects and its NOTES as `helm template` would.
func runTemplate(args []string) error {
	fs := flag.NewFlagSet("helm template", flag.ContinueOnError)
	values := addValueFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("want one CHART directory")
	}
	vals, err := values.read()
	if err != nil {
		return err
	}
	rel, err := render(fs.Arg(0), vals)
	if err != nil {
		return err
	}
	fmt.Print(rel.Manifest)
	fmt.Fprintln(os.Stderr, rel.Info.Notes)
	return nil
}

// runPackage writes the release's chart archive (pack) and its OCI layout (ociLayout).
func runPackage(args []string) error {
	fs := flag.NewFlagSet("helm package", flag.ContinueOnError)
	version := fs.String("version", "", "the release, vX.Y.Z")
	image := fs.String("image", "", "the controller's image repository")
	digest := fs.String("digest", "", "the controller's image index digest, sha256:…")
	ambassador := fs.String("ambassador-digest", "", "the ambassador image's digest, sha256:… (empty: its tag)")
	out := fs.String("o", "", "directory to write the .tgz into")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *out == "" {
		return errors.New("want -o DIR and one CHART directory")
	}
	modTime, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	path, err := pack(fs.Arg(0), *version, *image, *digest, *ambassador, modTime, *out)
	if err != nil {
		return err
	}
	layout, err := ociLayout(path, modTime, *out)
	if err != nil {
		return err
	}
	fmt.Println(path)
	fmt.Println(layout)
	return nil
}

// valueFlags are the values a command takes: a file, then a JSON object over it.
type valueFlags struct {
	file, setJSON *string
}

func addValueFlags(fs *flag.FlagSet) *valueFlags {
	return &valueFlags{
		file:    fs.String("f", "", "a values file"),
		setJSON: fs.String("set-json", "", "values as a JSON object, over -f"),
	}
}

// read returns the values given, an empty map for none.
func (v *valueFlags) read() (map[string]any, error) {
	vals := map[string]any{}
	if *v.file != "" {
		f, err := common.ReadValuesFile(*v.file)
		if err != nil {
			return nil, err
		}
		vals = f
	}
	if *v.setJSON != "" {
		var over map[string]any
		if err := json.Unmarshal([]byte(*v.setJSON), &over); err != nil {
			return nil, fmt.Errorf("-set-json: %w", err)
		}
		vals = util.CoalesceTables(over, vals)
	}
	return vals, nil
}

// sourceDateEpoch is the time every file of the archive carries: SOURCE_DATE_EPOCH (the
// commit's time, which make release sets), so that the archive is reproducible.
func sourceDateEpoch() (time.Time, error) {
	v, ok := os.LookupEnv("SOURCE_DATE_EPOCH")
	if !ok {
		return time.Time{}, errors.New("SOURCE_DATE_EPOCH is not set (make release sets it to the commit's time)")
	}
	s, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", v, err)
	}
	return time.Unix(s, 0).UTC(), nil
}
