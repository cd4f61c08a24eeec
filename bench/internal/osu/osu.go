// Package osu holds what amgo's microbenchmarks share with the OSU
// Micro-Benchmarks: the options (-m min:max, -i iterations, -x warm-up) and the
// output layout (a "# title" line, a "# column" header line, then one row per
// message size: the size left-aligned in 10 columns, each figure right-aligned
// in 18 columns with 2 decimals), so that amgo's figures can be laid beside
// OSU's (reference/peers.md §7.2).
package osu

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Options are the OSU options amgo's benchmarks accept.
type Options struct {
	MinSize, MaxSize int // message sizes in bytes, powers of two from Min to Max (0 first when Min is 0)
	Iters            int // timed iterations per size
	Warmup           int // untimed iterations per size
	Window           int // messages in flight for bandwidth tests (-W)
}

// Register adds -m, -i, -x and -W to fs with the given defaults.
func Register(fs *flag.FlagSet, o *Options) {
	fs.Func("m", fmt.Sprintf("message sizes min:max in bytes (default %d:%d)", o.MinSize, o.MaxSize), func(s string) error {
		lo, hi, err := ParseRange(s)
		if err != nil {
			return err
		}
		o.MinSize, o.MaxSize = lo, hi
		return nil
	})
	fs.IntVar(&o.Iters, "i", o.Iters, "timed iterations per size")
	fs.IntVar(&o.Warmup, "x", o.Warmup, "warm-up iterations per size")
	fs.IntVar(&o.Window, "W", o.Window, "window size for bandwidth tests")
}

// ParseRange parses OSU's "-m" argument: "max" or "min:max", in bytes.
func ParseRange(s string) (lo, hi int, err error) {
	parts := strings.SplitN(s, ":", 2)
	if len(parts) == 1 {
		hi, err = strconv.Atoi(parts[0])
	} else {
		if lo, err = strconv.Atoi(parts[0]); err == nil {
			hi, err = strconv.Atoi(parts[1])
		}
	}
	if err != nil || lo < 0 || hi < lo {
		return 0, 0, fmt.Errorf("bad message size range %q (want max or min:max, 0 <= min <= max)", s)
	}
	return lo, hi, nil
}

// Sizes lists the message sizes of a run: 0 if min is 0, then the powers of two
// from max(min,1) to max.
func (o Options) Sizes() []int {
	var s []int
	if o.MinSize == 0 {
		s = append(s, 0)
	}
	for n := 1; n <= o.MaxSize; n *= 2 {
		if n >= o.MinSize {
			s = append(s, n)
		}
	}
	return s
}

// Header writes OSU's two header lines: "# <title>" and the column names.
func Header(w io.Writer, title string, columns ...string) {
	fmt.Fprintf(w, "# %s\n", title)
	fmt.Fprintf(w, "%-10s", "# Size")
	for _, c := range columns {
		fmt.Fprintf(w, "%18s", c)
	}
	fmt.Fprintln(w)
}

// Row writes one result row in OSU's layout.
func Row(w io.Writer, size int, values ...float64) {
	fmt.Fprintf(w, "%-10d", size)
	for _, v := range values {
		fmt.Fprintf(w, "%18.2f", v)
	}
	fmt.Fprintln(w)
}
