// Command plot draws the figures of a bench/harness run: latency and
// bandwidth against message size, log-log, one line per implementation and
// network (the median of the repetitions), from the harness's results.csv.
// It is a module of its own (github.com/amgo-hpc/amgo/bench/plot) so that
// amgo's module does not depend on gonum.org/v1/plot.
//
//	cd bench/plot && go run . -o ../results/latest ../results/latest/results.csv
//
// It writes latency, bandwidth (osu bw) and bibw, each as .svg and .png.
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// figure is one plot: the harness's bench and column to draw.
type figure struct {
	file, bench, column, title, ylabel string
}

var figures = []figure{
	{"latency.svg", "latency", "Latency (us)", "Ping-pong latency (osu latency)", "latency (µs, one way)"},
	{"bandwidth.svg", "bw", "Bandwidth (MB/s)", "Unidirectional bandwidth (osu bw, window 64)", "bandwidth (MB/s)"},
	{"bibw.svg", "bibw", "Bandwidth (MB/s)", "Bidirectional bandwidth (osu bibw, window 64)", "bandwidth (MB/s)"},
}

func main() {
	out := flag.String("o", ".", "directory for the SVG files")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: plot [-o dir] results.csv")
		os.Exit(2)
	}
	recs, err := readCSV(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
	for _, f := range figures {
		if err := draw(recs, f, filepath.Join(*out, f.file)); err != nil {
			fmt.Fprintln(os.Stderr, "plot:", err)
			os.Exit(1)
		}
	}
}

// series maps configuration -> size -> values over repetitions.
type series map[string]map[int][]float64

func readCSV(path string) (map[[2]string]series, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, err
	}
	recs := map[[2]string]series{}
	for i, r := range rows {
		if i == 0 || len(r) < 6 {
			continue // header
		}
		size, err1 := strconv.Atoi(r[3])
		v, err2 := strconv.ParseFloat(r[5], 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s line %d: bad number", path, i+1)
		}
		k := [2]string{r[0], r[2]}
		if recs[k] == nil {
			recs[k] = series{}
		}
		if recs[k][r[1]] == nil {
			recs[k][r[1]] = map[int][]float64{}
		}
		recs[k][r[1]][size] = append(recs[k][r[1]][size], v)
	}
	return recs, nil
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func draw(recs map[[2]string]series, f figure, path string) error {
	ser := recs[[2]string{f.bench, f.column}]
	if len(ser) == 0 {
		return nil // nothing measured
	}
	p := plot.New()
	p.Title.Text = f.title
	p.X.Label.Text = "message size (bytes)"
	p.Y.Label.Text = f.ylabel
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, f.bench == "latency"
	names := make([]string, 0, len(ser))
	for n := range ser {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		var pts plotter.XYs
		sizes := make([]int, 0, len(ser[n]))
		for s := range ser[n] {
			sizes = append(sizes, s)
		}
		sort.Ints(sizes)
		for _, s := range sizes {
			if m := median(ser[n][s]); s > 0 && m > 0 { // log axes: no zeros
				pts = append(pts, plotter.XY{X: float64(s), Y: m})
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		l.Color, sc.Color = plotutil.Color(i), plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / 7)
		sc.Shape = plotutil.Shape(i)
		sc.Radius = vg.Points(2)
		p.Add(l, sc)
		p.Legend.Add(n, l, sc)
	}
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return err
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, strings.TrimSuffix(path, ".svg")+".png")
}
