package main

import (
	"bufio"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const clockTicks = 100 // USER_HZ on Linux

// sessionPids returns the processes whose session id is sid: a controller
// started by spawn leads its own session, so for the shell script this is
// bash, its subshells, curl and jq.
func sessionPids(sid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f := statFields(pid)
		if len(f) > 6 {
			if s, _ := strconv.Atoi(f[3]); s == sid { // field 6: session
				out = append(out, pid)
			}
		}
	}
	return out
}

// statFields returns /proc/PID/stat split after the command name: index 0 is
// field 3 (state).
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// cpuSeconds sums utime+stime (and the children's, reaped) over the session.
func cpuSeconds(sid int) float64 {
	var ticks int64
	for _, pid := range sessionPids(sid) {
		f := statFields(pid)
		if len(f) < 15 {
			continue // exited meanwhile (the script's jq and curl come and go)
		}
		// fields 14..17: utime stime cutime cstime -> indexes 11..14
		for _, k := range []int{11, 12, 13, 14} {
			v, _ := strconv.ParseInt(f[k], 10, 64)
			ticks += v
		}
	}
	return float64(ticks) / clockTicks
}

// memKiB sums VmRSS and VmHWM over the session.
func memKiB(sid int) (rss, hwm int64) {
	for _, pid := range sessionPids(sid) {
		f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 {
				continue
			}
			v, _ := strconv.ParseInt(fields[1], 10, 64)
			switch fields[0] {
			case "VmRSS:":
				rss += v
			case "VmHWM:":
				hwm += v
			}
		}
		f.Close()
	}
	return rss, hwm
}

// cmdSpawn starts a command in its own session with its output in -log, writes
// its pid to -pidfile, and (with -ready) polls the URL every 2 ms until it
// answers 200, printing the time from exec.
func cmdSpawn(args []string) error {
	fs := flag.NewFlagSet("spawn", flag.ExitOnError)
	logPath := fs.String("log", "", "output file")
	pidfile := fs.String("pidfile", "", "pid file")
	ready := fs.String("ready", "", "readiness URL (optional)")
	timeout := fs.Duration("timeout", 120*time.Second, "readiness timeout")
	controller := fs.String("controller", "", "name in the results")
	results := fs.String("results", "", "results dir (with -ready: records start_ms)")
	metric := fs.String("metric", "start", "metric name for the start time")
	_ = fs.Parse(args)
	argv := fs.Args()
	if len(argv) == 0 {
		return fmt.Errorf("no command")
	}
	out, err := os.Create(*logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	if err := os.WriteFile(*pidfile, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if *ready == "" {
		return nil
	}
	client := &http.Client{Timeout: time.Second}
	for time.Since(start) < *timeout {
		select {
		case err := <-exited:
			return fmt.Errorf("%s exited before it was ready: %v (log: %s)", argv[0], err, *logPath)
		default:
		}
		if resp, err := client.Get(*ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				el := time.Since(start)
				fmt.Printf("  %s: exec -> %s 200 in %d ms\n", *controller, *ready, el.Milliseconds())
				if *results != "" {
					return addMetric(*results, *controller, *metric, float64(el.Microseconds())/1000, "ms")
				}
				return nil
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s", argv[0], *timeout)
}

func pidFlag(fs *flag.FlagSet) *int { return fs.Int("pid", 0, "session leader pid") }

// cmdQuiesce waits until the session used no CPU tick for -still.
func cmdQuiesce(args []string) error {
	fs := flag.NewFlagSet("quiesce", flag.ExitOnError)
	pid := pidFlag(fs)
	still := fs.Duration("still", 3*time.Second, "quiet period")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after")
	_ = fs.Parse(args)
	start := time.Now()
	last, since := cpuSeconds(*pid), time.Now()
	for time.Since(start) < *timeout {
		time.Sleep(500 * time.Millisecond)
		if c := cpuSeconds(*pid); c != last {
			last, since = c, time.Now()
		} else if time.Since(since) >= *still {
			fmt.Printf("  quiet after %s (%.2f CPU s so far)\n", time.Since(start).Round(100*time.Millisecond), c)
			return nil
		}
	}
	return fmt.Errorf("session %d still busy after %s", *pid, *timeout)
}

func cmdMem(args []string) error {
	fs := flag.NewFlagSet("mem", flag.ExitOnError)
	pid := pidFlag(fs)
	controller := fs.String("controller", "", "name in the results")
	results := fs.String("results", "", "results dir")
	metric := fs.String("metric", "rss", "metric prefix: records PREFIX_rss and PREFIX_hwm")
	_ = fs.Parse(args)
	rss, hwm := memKiB(*pid)
	fmt.Printf("  %s: %s VmRSS %.1f MiB, VmHWM %.1f MiB\n", *controller, *metric, float64(rss)/1024, float64(hwm)/1024)
	if *results == "" {
		return nil
	}
	if err := addMetric(*results, *controller, *metric+"_rss", float64(rss)/1024, "MiB"); err != nil {
		return err
	}
	return addMetric(*results, *controller, *metric+"_hwm", float64(hwm)/1024, "MiB")
}

func cmdCPU(args []string) error {
	fs := flag.NewFlagSet("cpu", flag.ExitOnError)
	pid := pidFlag(fs)
	_ = fs.Parse(args)
	fmt.Printf("%.2f\n", cpuSeconds(*pid))
	return nil
}

// cmdIdle samples several sessions over the same window.
func cmdIdle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	pids := fs.String("pids", "", "NAME=PID,...")
	seconds := fs.Int("seconds", 60, "window")
	results := fs.String("results", "", "results dir")
	_ = fs.Parse(args)
	type proc struct {
		name   string
		pid    int
		before float64
	}
	var ps []proc
	for _, kv := range strings.Split(*pids, ",") {
		name, p, _ := strings.Cut(kv, "=")
		pid, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("-pids %q: %w", kv, err)
		}
		ps = append(ps, proc{name, pid, cpuSeconds(pid)})
	}
	time.Sleep(time.Duration(*seconds) * time.Second)
	for _, p := range ps {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(p.pid))); err != nil {
			return fmt.Errorf("%s (pid %d) is gone", p.name, p.pid)
		}
		d := cpuSeconds(p.pid) - p.before
		fmt.Printf("  %s: %.2f CPU s in %d s idle\n", p.name, d, *seconds)
		if *results != "" {
			if err := addMetric(*results, p.name, "idle_cpu", d, "s/60s"); err != nil {
				return err
			}
		}
	}
	return nil
}
