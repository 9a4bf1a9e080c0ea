package memlimit

import (
	"io/fs"
	"runtime/debug"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

// TestContainerLimit ensures the limit is read from the process's own cgroup
// on v2 and on v1, the smallest of it and its ancestors wins, and "max" or
// v1's huge number mean no limit.
func TestContainerLimit(t *testing.T) {
	const v1Self = "12:memory:/kubepods/pod1/c1\n11:cpu,cpuacct:/kubepods/pod1/c1\n0::/\n"
	tests := []struct {
		name       string
		fs         fstest.MapFS
		wantLimit  int64
		wantSource string
		wantErr    error
	}{
		{
			name: "V2OwnCgroup",
			fs: fstest.MapFS{
				"proc/self/cgroup":                          file("0::/kubepods/pod1/c1\n"),
				"sys/fs/cgroup/kubepods/pod1/c1/memory.max": file("67108864\n"),
			},
			wantLimit: 64 << 20, wantSource: "/sys/fs/cgroup/kubepods/pod1/c1/memory.max",
		},
		{
			name: "V2NamespacedRoot",
			fs: fstest.MapFS{
				"proc/self/cgroup":         file("0::/\n"),
				"sys/fs/cgroup/memory.max": file("134217728\n"),
			},
			wantLimit: 128 << 20, wantSource: "/sys/fs/cgroup/memory.max",
		},
		{
			name: "V2ParentSmallerWins",
			fs: fstest.MapFS{
				"proc/self/cgroup":                file("0::/pod/c1\n"),
				"sys/fs/cgroup/pod/c1/memory.max": file("max\n"),
				"sys/fs/cgroup/pod/memory.max":    file("33554432\n"),
			},
			wantLimit: 32 << 20, wantSource: "/sys/fs/cgroup/pod/memory.max",
		},
		{
			name: "V2MaxIsNoLimit",
			fs: fstest.MapFS{
				"proc/self/cgroup":            file("0::/c1\n"),
				"sys/fs/cgroup/c1/memory.max": file("max\n"),
			},
			wantErr: ErrNoLimit,
		},
		{
			name: "V1OwnCgroup",
			fs: fstest.MapFS{
				"proc/self/cgroup": file(v1Self),
				"sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes": file("67108864\n"),
				"sys/fs/cgroup/memory/memory.limit_in_bytes":                  file("9223372036854771712\n"),
			},
			wantLimit: 64 << 20, wantSource: "/sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes",
		},
		{
			name: "V1ContainerMountRoot",
			fs: fstest.MapFS{
				"proc/self/cgroup":                           file(v1Self), // a host path the container's mount does not show
				"sys/fs/cgroup/memory/memory.limit_in_bytes": file("67108864\n"),
			},
			wantLimit: 64 << 20, wantSource: "/sys/fs/cgroup/memory/memory.limit_in_bytes",
		},
		{
			name: "V1UnlimitedIsNoLimit",
			fs: fstest.MapFS{
				"proc/self/cgroup":                           file(v1Self),
				"sys/fs/cgroup/memory/memory.limit_in_bytes": file("9223372036854771712\n"),
			},
			wantErr: ErrNoLimit,
		},
		{
			name: "HybridV1LimitV2Unlimited",
			fs: fstest.MapFS{
				"proc/self/cgroup": file("4:memory:/t\n0::/t\n"),
				"sys/fs/cgroup/memory/t/memory.limit_in_bytes": file("50331648\n"),
				"sys/fs/cgroup/unified/t/memory.max":           file("max\n"),
			},
			wantLimit: 48 << 20, wantSource: "/sys/fs/cgroup/memory/t/memory.limit_in_bytes",
		},
		{
			name: "GarbageIsNoLimit",
			fs: fstest.MapFS{
				"proc/self/cgroup":            file("0::/c1\n"),
				"sys/fs/cgroup/c1/memory.max": file("lots\n"),
			},
			wantErr: ErrNoLimit,
		},
		{
			name:    "NoCgroupFile",
			fs:      fstest.MapFS{},
			wantErr: fs.ErrNotExist,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limit, source, err := ContainerLimit(tt.fs)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantLimit, limit)
			assert.Equal(t, tt.wantSource, source)
		})
	}
}

// TestSet ensures Set applies 90% of the container's limit, leaves a
// GOMEMLIMIT from the environment alone, and sets nothing without a limit.
func TestSet(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	limited := fstest.MapFS{
		"proc/self/cgroup":         file("0::/\n"),
		"sys/fs/cgroup/memory.max": file("67108864\n"),
	}
	noEnv := func(string) (string, bool) { return "", false }

	t.Run("NinetyPercentOfTheLimit", func(t *testing.T) {
		debug.SetMemoryLimit(prev)
		res, err := Set(noEnv, limited)
		require.NoError(t, err)
		want := int64(64<<20) * 9 / 10
		assert.Equal(t, Result{Limit: want, Container: 64 << 20, Source: "/sys/fs/cgroup/memory.max"}, res)
		assert.Equal(t, want, debug.SetMemoryLimit(-1))
	})
	t.Run("EnvironmentWins", func(t *testing.T) {
		debug.SetMemoryLimit(123 << 20) // as the runtime did from GOMEMLIMIT
		res, err := Set(func(k string) (string, bool) { return "123MiB", k == "GOMEMLIMIT" }, limited)
		require.NoError(t, err)
		assert.Equal(t, Result{Limit: 123 << 20, FromEnv: true}, res)
		assert.Equal(t, int64(123<<20), debug.SetMemoryLimit(-1))
	})
	t.Run("NoLimitSetsNothing", func(t *testing.T) {
		debug.SetMemoryLimit(prev)
		res, err := Set(noEnv, fstest.MapFS{"proc/self/cgroup": file("0::/\n")})
		require.NoError(t, err)
		assert.Equal(t, Result{}, res)
		assert.Equal(t, prev, debug.SetMemoryLimit(-1))
	})
}
