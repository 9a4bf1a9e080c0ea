package metrics

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// userHZ is the unit of the times in /proc/PID/stat. Linux fixes it at 100
// for user space whatever the kernel's own tick rate; client_golang's procfs
// assumes the same.
const userHZ = 100

// RegisterProcess registers the process_* series of client_golang's process
// collector, same names and meanings, read at each scrape from the procfs
// under root's proc/ (root is os.DirFS("/") but in tests). A series that
// cannot be read there (another OS, a procfs without it) is exported
// without a sample.
func (r *Registry) RegisterProcess(root fs.FS) {
	p := procFS{root}
	r.NewCounterFunc("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", func() (float64, bool) {
		st, ok := p.stat()
		return float64(st.utime+st.stime) / userHZ, ok
	})
	r.NewGaugeFunc("process_open_fds", "Number of open file descriptors.", func() (float64, bool) {
		fds, err := fs.ReadDir(root, "proc/self/fd")
		return float64(len(fds)), err == nil
	})
	r.NewGaugeFunc("process_max_fds", "Maximum number of open file descriptors.", p.maxFDs)
	r.NewGaugeFunc("process_virtual_memory_bytes", "Virtual memory size in bytes.", func() (float64, bool) {
		st, ok := p.stat()
		return float64(st.vsize), ok
	})
	r.NewGaugeFunc("process_resident_memory_bytes", "Resident memory size in bytes.", func() (float64, bool) {
		st, ok := p.stat()
		return float64(st.rss * uint64(os.Getpagesize())), ok
	})
	r.NewGaugeFunc("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", func() (float64, bool) {
		st, ok := p.stat()
		boot, bootOK := p.bootTime()
		return float64(boot) + float64(st.starttime)/userHZ, ok && bootOK
	})
}

// procFS reads the files of a procfs that the process series come from.
type procFS struct{ root fs.FS }

// procStat is what the series use of /proc/self/stat (proc(5)).
type procStat struct {
	utime, stime, starttime, vsize, rss uint64 // clock ticks, ticks, ticks since boot, bytes, pages
}

// stat reads /proc/self/stat. The command name (field 2) is in parentheses
// and may hold spaces and parentheses itself: the fields are counted from the
// last ')'.
func (p procFS) stat() (procStat, bool) {
	raw, err := fs.ReadFile(p.root, "proc/self/stat")
	i := bytes.LastIndexByte(raw, ')')
	if err != nil || i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(raw[i+1:])) // f[0] is field 3, state
	field := func(n int) uint64 {
		if n-3 >= len(f) {
			err = fmt.Errorf("field %d missing", n)
			return 0
		}
		v, perr := strconv.ParseUint(f[n-3], 10, 64)
		if perr != nil {
			err = perr
		}
		return v
	}
	st := procStat{utime: field(14), stime: field(15), starttime: field(22), vsize: field(23), rss: field(24)}
	return st, err == nil
}

// bootTime reads the btime line of /proc/stat: the boot time in Unix seconds.
func (p procFS) bootTime() (uint64, bool) {
	return p.find("proc/stat", func(line string) (uint64, bool) {
		v, ok := strings.CutPrefix(line, "btime ")
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		return n, ok && err == nil
	})
}

// maxFDs reads the soft limit of open files from /proc/self/limits.
func (p procFS) maxFDs() (float64, bool) {
	n, ok := p.find("proc/self/limits", func(line string) (uint64, bool) {
		v, ok := strings.CutPrefix(line, "Max open files")
		f := strings.Fields(v)
		if !ok || len(f) == 0 {
			return 0, false
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		return n, err == nil
	})
	return float64(n), ok
}

// find returns the value parse finds on the first line of file it accepts.
func (p procFS) find(file string, parse func(line string) (uint64, bool)) (uint64, bool) {
	f, err := p.root.Open(file)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := parse(sc.Text()); ok {
			return v, true
		}
	}
	return 0, false
}
