package main

import (
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

type summary struct{ n, min, p10, p25, p50, p75, p90, max float64 }

// quantile with linear interpolation between closest ranks.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

func stats(v []float64) summary {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return summary{}
	}
	return summary{float64(len(s)), s[0], quantile(s, .1), quantile(s, .25), quantile(s, .5), quantile(s, .75), quantile(s, .9), s[len(s)-1]}
}

var order = []string{"config-watcher", "informer", "shell"}

func readCSV(path string) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return rows[1:], nil
}

// latencies reads latency.csv into controller -> values in ms.
func latencies(path string) (map[string][]float64, error) {
	rows, err := readCSV(path)
	if err != nil {
		return nil, err
	}
	out := map[string][]float64{}
	for _, r := range rows {
		v, err := strconv.ParseFloat(r[2], 64)
		if err != nil {
			return nil, err
		}
		out[r[0]] = append(out[r[0]], v/1000)
	}
	return out, nil
}

// cmdChart draws one horizontal box plot per controller (whiskers min..max,
// box p25..p75, bar at p50, every sample as a dot) on a log-scale axis in ms.
func cmdChart(args []string) error {
	fs := flag.NewFlagSet("chart", flag.ExitOnError)
	in := fs.String("in", "", "latency.csv")
	out := fs.String("out", "", "PNG")
	title := fs.String("title", "Reaction latency: ConfigMap PATCH completed -> first pod DELETE received (apiserver audit log)", "")
	_ = fs.Parse(args)
	lat, err := latencies(*in)
	if err != nil {
		return err
	}
	const W, H, left, right, top, rowH = 1000, 330, 170, 30, 50, 70
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	black := color.RGBA{0, 0, 0, 255}
	grey := color.RGBA{210, 210, 210, 255}
	red := color.RGBA{200, 40, 40, 255}
	colors := map[string]color.RGBA{
		"config-watcher": {30, 110, 200, 255}, "informer": {40, 150, 70, 255}, "shell": {220, 120, 20, 255},
	}
	lo, hi := 1.0, 1000.0
	for _, v := range lat {
		for _, x := range v {
			for x < lo {
				lo /= 10
			}
			for x > hi {
				hi *= 10
			}
		}
	}
	xOf := func(ms float64) int {
		ms = math.Max(ms, lo)
		return left + int(float64(W-left-right)*math.Log10(ms/lo)/math.Log10(hi/lo))
	}
	text(img, 10, 20, *title, black)
	plotBottom := top + rowH*len(order)
	for d := lo; d <= hi; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			x := xOf(d * m)
			if d*m > hi {
				break
			}
			vline(img, x, top-5, plotBottom, grey)
			text(img, x-10, plotBottom+18, strconv.FormatFloat(d*m, 'g', -1, 64), black)
		}
	}
	text(img, (W-left)/2+left-20, plotBottom+40, "milliseconds (log scale)", black)
	tx := xOf(20)
	for y := top - 5; y < plotBottom; y += 6 {
		vline(img, tx, y, y+3, red)
	}
	text(img, tx+4, top-8, "target p50 20 ms", red)
	rng := rand.New(rand.NewPCG(1, 2))
	for i, name := range order {
		v := lat[name]
		cy := top + rowH*i + rowH/2
		if len(v) == 0 {
			text(img, 10, cy+4, name+": no data", black)
			continue
		}
		s := stats(v)
		c := colors[name]
		text(img, 10, cy-4, name, black)
		text(img, 10, cy+12, fmt.Sprintf("p50 %.1f ms", s.p50), black)
		hline(img, xOf(s.min), xOf(s.p25), cy, c)
		hline(img, xOf(s.p75), xOf(s.max), cy, c)
		vline(img, xOf(s.min), cy-8, cy+8, c)
		vline(img, xOf(s.max), cy-8, cy+8, c)
		x0, x1 := xOf(s.p25), xOf(s.p75)
		hline(img, x0, x1, cy-14, c)
		hline(img, x0, x1, cy+14, c)
		vline(img, x0, cy-14, cy+14, c)
		vline(img, x1, cy-14, cy+14, c)
		for dx := -1; dx <= 1; dx++ {
			vline(img, xOf(s.p50)+dx, cy-14, cy+14, black)
		}
		for _, x := range v {
			px, py := xOf(x), cy+20+rng.IntN(9)
			for dx := -1; dx <= 1; dx++ {
				for dy := -1; dy <= 1; dy++ {
					img.Set(px+dx, py+dy, c)
				}
			}
		}
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	for y := y0; y <= y1; y++ {
		img.Set(x, y, c)
	}
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// secretsMemory adds bench/memory.sh's Secrets rows (memory-secrets.csv: both kinds
// watched together) to m as secrets_rss and secrets_hwm, and returns what was watched,
// for the rows' names. No file: nothing added.
func secretsMemory(path string, m map[string]map[string]float64) (string, error) {
	rows, err := readCSV(path)
	if errors.Is(err, os.ErrNotExist) {
		return "Secrets + CMs", nil
	}
	if err != nil {
		return "", err
	}
	what := "Secrets + CMs"
	for _, r := range rows {
		// controller,kinds,secrets,configmaps,start_hwm_mib,steady_rss_mib,relist_hwm_mib
		if len(r) < 6 || r[1] != "configmaps+secrets" {
			continue
		}
		hwm, err1 := strconv.ParseFloat(r[4], 64)
		rss, err2 := strconv.ParseFloat(r[5], 64)
		if err := errors.Join(err1, err2); err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		if m[r[0]] == nil {
			m[r[0]] = map[string]float64{}
		}
		m[r[0]]["secrets_hwm"], m[r[0]]["secrets_rss"] = hwm, rss
		what = fmt.Sprintf("%s Secrets + %s CMs", thousands(r[2]), thousands(r[3]))
	}
	return what, nil
}

// thousands writes a decimal count with commas, as the table's other rows do.
func thousands(n string) string {
	for i := len(n) - 3; i > 0; i -= 3 {
		n = n[:i] + "," + n[i:]
	}
	return n
}

// cmdSummary prints the results as a Markdown table.
// loadRun reads a run's results dir: the latencies per controller, the
// metrics per controller and key (memory-secrets.csv's rows among them), and
// the name of the Secrets row.
func loadRun(dir string) (lat map[string][]float64, m map[string]map[string]float64, secretsRow string, err error) {
	if lat, err = latencies(filepath.Join(dir, "latency.csv")); err != nil {
		return nil, nil, "", err
	}
	rows, err := readCSV(filepath.Join(dir, "metrics.csv"))
	if err != nil {
		return nil, nil, "", err
	}
	m = map[string]map[string]float64{}
	for _, r := range rows {
		v, _ := strconv.ParseFloat(r[2], 64)
		if m[r[0]] == nil {
			m[r[0]] = map[string]float64{}
		}
		m[r[0]][r[1]] = v
	}
	secretsRow, err = secretsMemory(filepath.Join(dir, "memory-secrets.csv"), m)
	return lat, m, secretsRow, err
}

// sameRunRows are the rows of the same-run latency tables (floor, base).
var sameRunRows = []struct {
	name string
	f    func(summary) float64
}{{"p50 (ms)", func(s summary) float64 { return s.p50 }}, {"p90 (ms)", func(s summary) float64 { return s.p90 }}}

func cmdSummary(args []string) error {
	fs := flag.NewFlagSet("summary", flag.ExitOnError)
	dir := fs.String("dir", "", "results dir")
	_ = fs.Parse(args)
	lat, m, secretsRow, err := loadRun(*dir)
	if err != nil {
		return err
	}
	get := func(c, k string) (float64, bool) { v, ok := m[c][k]; return v, ok }
	cell := func(v float64, ok bool, format string) string {
		if !ok || math.IsNaN(v) {
			return "n/a"
		}
		return fmt.Sprintf(format, v)
	}
	ratio := func(a, b float64, okA, okB bool) string {
		if !okA || !okB || b == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f×", a/b)
	}
	fmt.Println("| what | config-watcher | informer (client-go) | shell (curl+jq) | cw / informer | cw / shell | target |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, q := range []struct {
		name, target string
		f            func(summary) float64
	}{
		{"reaction latency p50 (ms)", "≤ 20 ms; ≤ 0.25× informer; ≤ 0.12× shell", func(s summary) float64 { return s.p50 }},
		{"reaction latency p90 (ms)", "", func(s summary) float64 { return s.p90 }},
		{"reaction latency max (ms)", "", func(s summary) float64 { return s.max }},
		{"reaction latency p25–p75 (ms)", "", nil},
	} {
		vals := map[string]summary{}
		for _, c := range order {
			vals[c] = stats(lat[c])
		}
		line := "| " + q.name
		for _, c := range order {
			s := vals[c]
			if s.n == 0 {
				line += " | n/a"
			} else if q.f == nil {
				line += fmt.Sprintf(" | %.1f–%.1f", s.p25, s.p75)
			} else {
				line += fmt.Sprintf(" | %.1f", q.f(s))
			}
		}
		if q.f == nil {
			line += " | |"
		} else {
			cw, inf, sh := vals["config-watcher"], vals["informer"], vals["shell"]
			line += " | " + ratio(q.f(cw), q.f(inf), cw.n > 0, inf.n > 0) + " | " + ratio(q.f(cw), q.f(sh), cw.n > 0, sh.n > 0)
		}
		fmt.Println(line + " | " + q.target + " |")
	}
	fmt.Printf("| changes measured | %d | %d | %d | | | ≥ 30 |\n", len(lat["config-watcher"]), len(lat["informer"]), len(lat["shell"]))
	for _, q := range []struct{ key, name, format, target string }{
		{"rss5k_rss", "RSS after sync, 5,000 CMs (MiB)", "%.1f", "≤ 12 MiB; ≤ 0.3× informer"},
		{"rss5k_hwm", "peak RSS (VmHWM), 5,000 CMs (MiB)", "%.1f", ""},
		{"rss20k_rss", "RSS after sync, 20,000 CMs (MiB)", "%.1f", ""},
		{"rss20k_hwm", "peak RSS (VmHWM), 20,000 CMs (MiB)", "%.1f", ""},
		{"growth", "RSS growth per 1,000 more CMs (MiB)", "%.2f", "≤ 0.5 MiB"},
		{"secrets_rss", "RSS after sync, " + secretsRow + " (MiB)", "%.1f", ""},
		{"secrets_hwm", "peak RSS (VmHWM), " + secretsRow + " (MiB)", "%.1f", ""},
		{"start5k", "start: exec → /readyz 200, 5,000 CMs (ms)", "%.0f", "≤ 1 s"},
		{"start20k", "start: exec → /readyz 200, 20,000 CMs (ms)", "%.0f", ""},
		{"idle_cpu", "idle CPU over 60 s (CPU s)", "%.3f", "≈ 0"},
		{"idle_rss", "RSS idle, 1 ConfigMap (MiB)", "%.1f", ""},
		{"burst_last_delete", "burst: first PATCH → last pod DELETE (s)", "%.2f", "report, vs shell"},
		{"burst_patch_span", "burst: time to send the 500 PATCHes (s)", "%.2f", ""},
		{"burst_per_cm_p50", "burst: per-ConfigMap PATCH → DELETE, p50 (ms)", "%.0f", ""},
		{"burst_once", "burst: pods deleted exactly once (of 500)", "%.0f", "500"},
		{"burst_dup", "burst: pods deleted more than once", "%.0f", "0"},
		{"burst_missing", "burst: pods never deleted", "%.0f", "0"},
		{"size", "binary size, stripped static (MB)", "%.2f", "≤ 8 MB"},
	} {
		line := "| " + q.name
		var v [3]float64
		var ok [3]bool
		for i, c := range order {
			if q.key == "growth" {
				a, okA := get(c, "rss5k_rss")
				b, okB := get(c, "rss20k_rss")
				v[i], ok[i] = (b-a)/15, okA && okB
			} else {
				v[i], ok[i] = get(c, q.key)
			}
			line += " | " + cell(v[i], ok[i], q.format)
		}
		line += " | " + ratio(v[0], v[1], ok[0], ok[1]) + " | " + ratio(v[0], v[2], ok[0], ok[2])
		fmt.Println(line + " | " + q.target + " |")
	}
	// client-go's core clients ask for protobuf; config-watcher reads JSON. The
	// informer made to read JSON shows how much of the start is the wire format.
	if _, ok := get("informer-json", "start20k"); ok {
		fmt.Println()
		fmt.Println("| start: exec → /readyz 200, same run | config-watcher (JSON) | informer (protobuf, its default) | informer made to read JSON | cw / informer | cw / informer JSON |")
		fmt.Println("|---|---|---|---|---|---|")
		for _, q := range []struct{ key, name string }{{"start5k", "5,000 CMs (ms)"}, {"start20k", "20,000 CMs (ms)"}} {
			cw, okC := get("config-watcher", q.key)
			inf, okI := get("informer", q.key)
			js, okJ := get("informer-json", q.key)
			fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", q.name, cell(cw, okC, "%.0f"), cell(inf, okI, "%.0f"), cell(js, okJ, "%.0f"),
				ratio(cw, inf, okC, okI), ratio(cw, js, okC, okJ))
		}
	}
	if rss, ok := get("ambassador", "proxy_rss"); ok {
		hwm, _ := get("ambassador", "proxy_hwm")
		fmt.Printf("\nThe ambassador (the control plane's `kubectl proxy`) after the latency and burst steps: RSS %.1f MiB, peak %.1f MiB.\n", rss, hwm)
	}
	if floor := stats(lat["floor"]); floor.n > 0 {
		cw, inf := stats(lat["config-watcher"]), stats(lat["informer"])
		fmt.Println()
		fmt.Println("| reaction latency, same run | floor (DELETE on each event, nothing else) | config-watcher | informer | cw / floor | informer / floor |")
		fmt.Println("|---|---|---|---|---|---|")
		for _, q := range sameRunRows {
			fmt.Printf("| %s | %.1f | %.1f | %.1f | %s | %s |\n", q.name, q.f(floor), q.f(cw), q.f(inf),
				ratio(q.f(cw), q.f(floor), cw.n > 0, true), ratio(q.f(inf), q.f(floor), inf.n > 0, true))
		}
	}
	// The client-go controller that reads pods from an informer's cache.
	if cached := stats(lat["informer-podcache"]); cached.n > 0 {
		cw := stats(lat["config-watcher"])
		fmt.Println()
		fmt.Println("| same run | config-watcher | informer with a pod cache (lister) | cw / it |")
		fmt.Println("|---|---|---|---|")
		for _, q := range sameRunRows {
			fmt.Printf("| reaction latency %s | %.1f | %.1f | %s |\n", q.name, q.f(cw), q.f(cached), ratio(q.f(cw), q.f(cached), cw.n > 0, true))
		}
		cwBurst, okC := get("config-watcher", "burst_last_delete")
		cBurst, okB := get("informer-podcache", "burst_last_delete")
		fmt.Printf("| burst: first PATCH → last pod DELETE (s) | %s | %s | %s |\n", cell(cwBurst, okC, "%.2f"), cell(cBurst, okB, "%.2f"), ratio(cwBurst, cBurst, okC, okB))
	}
	// BENCH_BASE: this tree against the revision it changes, in the same run.
	if base := stats(lat["config-watcher-base"]); base.n > 0 {
		cw := stats(lat["config-watcher"])
		fmt.Println()
		fmt.Println("| reaction latency, same run | config-watcher | config-watcher at BENCH_BASE | cw / base |")
		fmt.Println("|---|---|---|---|")
		for _, q := range sameRunRows {
			fmt.Printf("| %s | %.1f | %.1f | %s |\n", q.name, q.f(cw), q.f(base), ratio(q.f(cw), q.f(base), cw.n > 0, true))
		}
		cwBurst, okC := get("config-watcher", "burst_last_delete")
		baseBurst, okB := get("config-watcher-base", "burst_last_delete")
		if okB {
			fmt.Printf("| burst: first PATCH → last pod DELETE (s) | %.2f | %.2f | %s |\n", cwBurst, baseBurst, ratio(cwBurst, baseBurst, okC, okB))
		}
	}
	return nil
}
