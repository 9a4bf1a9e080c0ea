// Package memlimit sets the Go runtime's soft memory limit (GOMEMLIMIT) from
// the container's memory limit, so that the garbage collector works harder
// near the limit instead of letting a burst of garbage (a relist of large
// ConfigMaps) get the process OOM-killed; docs/memory.md says more. The
// limit is the smallest of the process's memory cgroup and its ancestors:
// memory.max on cgroup v2, memory.limit_in_bytes on the v1 memory
// controller. GOMEMLIMIT set in the environment wins.
package memlimit

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
)

// Fraction of the container's limit given to the Go heap and runtime; the
// rest is headroom for what the runtime does not count (thread stacks outside
// Go, the binary's text, page cache charged to the cgroup).
const Fraction = 0.9

// noLimit is what cgroup v1 reports for an unlimited group (the largest page
// multiple below 2^63); anything this large means no limit.
const noLimit = math.MaxInt64 / 2

// ErrNoLimit: the process runs in no memory cgroup with a limit.
var ErrNoLimit = errors.New("no cgroup memory limit")

// ContainerLimit returns the memory limit in bytes of the cgroup the process
// runs in, read from fsys (the root file system, os.DirFS("/")), and the file
// it came from.
func ContainerLimit(fsys fs.FS) (int64, string, error) {
	v1Path, v2Path, err := ownCgroups(fsys)
	if err != nil {
		return 0, "", err
	}
	best, from := int64(0), ""
	consider := func(mounts []string, cgroup, file string) {
		if cgroup == "" {
			return
		}
		for _, mount := range mounts {
			for dir := cgroup; ; dir = path.Dir(dir) {
				p := path.Join(mount, dir, file)
				if n, ok := readLimit(fsys, p); ok && (from == "" || n < best) {
					best, from = n, "/"+p
				}
				if dir == "/" || dir == "." {
					break
				}
			}
		}
	}
	consider([]string{"sys/fs/cgroup", "sys/fs/cgroup/unified"}, v2Path, "memory.max")
	consider([]string{"sys/fs/cgroup/memory"}, v1Path, "memory.limit_in_bytes")
	if from == "" {
		return 0, "", ErrNoLimit
	}
	return best, from, nil
}

// ownCgroups reads the process's memory cgroup on each hierarchy from
// /proc/self/cgroup: "0::/path" (v2), "N:...memory...:/path" (v1).
func ownCgroups(fsys fs.FS) (v1, v2 string, err error) {
	b, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		return "", "", fmt.Errorf("read own cgroup: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		id, rest, _ := strings.Cut(strings.TrimRight(line, "\r\n"), ":")
		controllers, p, _ := strings.Cut(rest, ":")
		if !strings.HasPrefix(p, "/") {
			continue
		}
		switch {
		case id == "0" && controllers == "":
			v2 = p
		case slices.Contains(strings.Split(controllers, ","), "memory"):
			v1 = p
		}
	}
	return v1, v2, nil
}

// readLimit reads one limit file: a number of bytes, or "max" (v2) or a huge
// number (v1) for none.
func readLimit(fsys fs.FS, p string) (int64, bool) {
	b, err := fs.ReadFile(fsys, p)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil && n > 0 && n < noLimit
}

// Result says what Set did, for the start-up log.
type Result struct {
	Limit     int64  // the soft memory limit in force, 0 when none was set
	Container int64  // the container's limit it was derived from
	Source    string // the file Container was read from
	FromEnv   bool   // GOMEMLIMIT was set in the environment and left alone
}

// Set applies Fraction of the container's memory limit as the runtime's
// soft memory limit, unless GOMEMLIMIT is set in the environment. No cgroup
// limit is not an error: the result then says no limit was set.
func Set(lookupEnv func(string) (string, bool), fsys fs.FS) (Result, error) {
	if _, ok := lookupEnv("GOMEMLIMIT"); ok {
		return Result{Limit: debug.SetMemoryLimit(-1), FromEnv: true}, nil
	}
	limit, source, err := ContainerLimit(fsys)
	if errors.Is(err, ErrNoLimit) {
		return Result{}, nil
	}
	if err != nil {
		return Result{}, err
	}
	soft := int64(float64(limit) * Fraction)
	debug.SetMemoryLimit(soft)
	return Result{Limit: soft, Container: limit, Source: source}, nil
}
