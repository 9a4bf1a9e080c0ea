// Command image assembles container images from files on this machine, without a
// container engine or a registry, and writes a release's dist/.
//
// `image -ref …` is what `make image` runs: one image as a tarball that `docker load`,
// `kind load image-archive`, `ctr images import` and `crane push` read. The
// controller's image holds the static binary and a CA bundle, owned by root and run as
// 65532:65532, as the Dockerfile's result does. `image release` is what `make release`
// runs (release.go); `image sums DIST` writes DIST's SHA256SUMS again, after make release
// added the chart (hack/helm); `image cabundle FILE` writes the pinned CA bundle (cabundle.go);
// `image pin` is what `make pin-images` runs (pin.go).
// Timestamps come from SOURCE_DATE_EPOCH (default 0), so the same inputs give the same
// digest. It lives in its own module so that go-containerregistry and kustomize never
// enter the controller's go.mod.
//
// Usage:
//
//	image -ref NAME:TAG -o OUT.tar -entrypoint /bin/x -user 65532:65532 \
//	      -file SRC=DST[:MODE] [-file …] [-port 8080/tcp] [-label K=V] [-env K=V] [-cmd ARG]
//	image release -version vX.Y.Z -image REPO -revision COMMIT -manifests DIR -o DIST \
//	      -bin amd64=PATH -bin arm64=PATH
//	image sums DIST
//	image cabundle FILE
//	image pin -repo DIR [-crane PATH]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var err error
	switch args := os.Args[1:]; {
	case len(args) > 0 && args[0] == "release":
		err = runRelease(args[1:])
	case len(args) == 2 && args[0] == "sums":
		err = writeSums(args[1])
	case len(args) > 0 && args[0] == "cabundle":
		err = writeCABundle(args[1:])
	case len(args) > 0 && args[0] == "pin":
		err = runPin(args[1:])
	default:
		err = run(args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	ref := fs.String("ref", "", "image reference, e.g. ghcr.io/k8spatterns/config-watcher:v0.1.0")
	out := fs.String("o", "", "tarball to write")
	entrypoint := fs.String("entrypoint", "", "entrypoint, comma-separated")
	user := fs.String("user", "", "user[:group], numeric so that runAsNonRoot can check it")
	workdir := fs.String("workdir", "", "working directory")
	arch := fs.String("arch", runtime.GOARCH, "architecture recorded in the config (the binaries' own)")
	var files, ports, labels, env, cmd listFlag
	fs.Var(&files, "file", "SRC=DST[:MODE], MODE octal, default 0755 (repeatable)")
	fs.Var(&ports, "port", "exposed port, e.g. 8080/tcp (repeatable)")
	fs.Var(&labels, "label", "K=V (repeatable)")
	fs.Var(&env, "env", "K=V (repeatable)")
	fs.Var(&cmd, "cmd", "default argument (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if *ref == "" || *out == "" {
		return errors.New("-ref and -o are required")
	}
	tag, err := name.NewTag(*ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("-ref %q: %w", *ref, err)
	}
	created, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	spec := Spec{User: *user, Env: env, Ports: ports, Cmd: cmd, WorkingDir: *workdir, Created: created}
	if *entrypoint != "" {
		spec.Entrypoint = strings.Split(*entrypoint, ",")
	}
	for _, f := range files {
		file, err := parseFile(f)
		if err != nil {
			return err
		}
		spec.Files = append(spec.Files, file)
	}
	if len(labels) > 0 {
		spec.Labels = map[string]string{}
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok || k == "" {
				return fmt.Errorf("-label %q: want K=V", l)
			}
			spec.Labels[k] = v
		}
	}
	img, err := Build(spec, *arch)
	if err != nil {
		return err
	}
	// Written beside the target and renamed, so that a failed run leaves no half tarball.
	tmp := *out + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", *out, err)
	}
	if err := os.Rename(tmp, *out); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", *out, tag.Name(), digest)
	return nil
}

// writeCABundle is `image cabundle FILE`: the pinned CA bundle the images carry.
func writeCABundle(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: image cabundle FILE")
	}
	ca, err := caBundle()
	if err != nil {
		return err
	}
	return os.WriteFile(args[0], ca, 0o644)
}

// parseFile reads SRC=DST[:MODE].
func parseFile(s string) (File, error) {
	src, dst, ok := strings.Cut(s, "=")
	if !ok || src == "" || dst == "" {
		return File{}, fmt.Errorf("-file %q: want SRC=DST[:MODE]", s)
	}
	mode := int64(0o755)
	if d, m, ok := strings.Cut(dst, ":"); ok {
		v, err := strconv.ParseInt(m, 8, 64)
		if err != nil {
			return File{}, fmt.Errorf("-file %q: mode %q is not octal", s, m)
		}
		dst, mode = d, v
	}
	return File{Src: src, Dst: dst, Mode: mode}, nil
}

func sourceDateEpoch() (time.Time, error) {
	v, ok := os.LookupEnv("SOURCE_DATE_EPOCH")
	if !ok || v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970", v)
	}
	return time.Unix(n, 0).UTC(), nil
}
