// Package osu holds what amgo's microbenchmarks share with the OSU
// Micro-Benchmarks 7.2: the options (-m min:max, -i iterations, -x warm-up,
// -W window) with OSU's default iteration counts, and the output layout (a
// "# title" line, a "# Size" column header line, then one row per message
// size: the size left-aligned in 10 columns, each figure right-aligned in
// FieldWidth (20) columns with 2 decimals), so that amgo's figures can be laid
// beside those of the OSU Micro-Benchmarks' own programs.
package osu

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// OSU's layout and defaults (util/osu_util.h).
const (
	FieldWidth     = 20      // width of every figure column
	SizeWidth      = 10      // width of the size column
	Precision      = 2       // decimals of every figure
	LargeThreshold = 8192    // sizes above this use the "large" iteration counts
	MaxMessageSize = 1 << 22 // default largest size (4 MiB)
	DefaultWindow  = 64      // default window of the bandwidth tests
)

// Options are the OSU options amgo's benchmarks accept. Iters and Warmup apply
// to sizes up to LargeThreshold, ItersLarge and WarmupLarge above it; -i and -x
// set both, as a single count for every size.
type Options struct {
	MinSize, MaxSize        int // message sizes in bytes, powers of two from Min to Max (0 first when Min is 0)
	Iters, Warmup           int // timed and untimed iterations per size up to LargeThreshold
	ItersLarge, WarmupLarge int // timed and untimed iterations per size above LargeThreshold
	Window                  int // messages in flight for bandwidth tests (-W)
}

// LatencyOptions are osu_latency's defaults: sizes 0..4 MiB, 10000 iterations
// (100 warm-up) up to 8 KiB, 1000 (10) above.
func LatencyOptions() Options {
	return Options{MinSize: 0, MaxSize: MaxMessageSize, Iters: 10000, Warmup: 100, ItersLarge: 1000, WarmupLarge: 10, Window: DefaultWindow}
}

// BandwidthOptions are osu_bw's (and osu_bibw's, osu_mbw_mr's) defaults: sizes
// 1..4 MiB, window 64, 100 iterations (10 warm-up) up to 8 KiB, 20 (2) above.
func BandwidthOptions() Options {
	return Options{MinSize: 1, MaxSize: MaxMessageSize, Iters: 100, Warmup: 10, ItersLarge: 20, WarmupLarge: 2, Window: DefaultWindow}
}

// Register adds -m, -i, -x and -W to fs; the current values of o are the defaults.
func Register(fs *flag.FlagSet, o *Options) {
	if o.ItersLarge == 0 {
		o.ItersLarge = o.Iters
	}
	if o.WarmupLarge == 0 {
		o.WarmupLarge = o.Warmup
	}
	fs.Func("m", fmt.Sprintf("message sizes min:max in bytes (default %d:%d)", o.MinSize, o.MaxSize), func(s string) error {
		lo, hi, err := ParseRange(s)
		if err != nil {
			return err
		}
		o.MinSize, o.MaxSize = lo, hi
		return nil
	})
	fs.Func("i", fmt.Sprintf("timed iterations per size (default %d, %d above %d bytes)", o.Iters, o.ItersLarge, LargeThreshold), func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("bad iteration count %q", s)
		}
		o.Iters, o.ItersLarge = n, n
		return nil
	})
	fs.Func("x", fmt.Sprintf("warm-up iterations per size (default %d, %d above %d bytes)", o.Warmup, o.WarmupLarge, LargeThreshold), func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return fmt.Errorf("bad warm-up count %q", s)
		}
		o.Warmup, o.WarmupLarge = n, n
		return nil
	})
	fs.IntVar(&o.Window, "W", o.Window, "window size for bandwidth tests")
}

// Counts returns the timed and warm-up iterations for a message size.
func (o Options) Counts(size int) (iters, warmup int) {
	if size > LargeThreshold {
		return o.ItersLarge, o.WarmupLarge
	}
	return o.Iters, o.Warmup
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
	Columns(w, columns...)
}

// Columns writes OSU's column header line: "# Size" then each column name.
func Columns(w io.Writer, columns ...string) { KeyColumns(w, "# Size", columns...) }

// KeyColumns writes a column header line whose first column is key (for
// tests whose rows are not message sizes, such as "# Queued").
func KeyColumns(w io.Writer, key string, columns ...string) {
	fmt.Fprintf(w, "%-*s", SizeWidth, key)
	for _, c := range columns {
		fmt.Fprintf(w, "%*s", FieldWidth, c)
	}
	fmt.Fprintln(w)
}

// Row writes one result row in OSU's layout.
func Row(w io.Writer, size int, values ...float64) {
	fmt.Fprintf(w, "%-*d", SizeWidth, size)
	for _, v := range values {
		fmt.Fprintf(w, "%*.*f", FieldWidth, Precision, v)
	}
	fmt.Fprintln(w)
}

// Result is one parsed row of OSU-layout output.
type Result struct {
	Size   int
	Values []float64
}

// Parse reads OSU-layout output (amgo's or OSU's own, or bench/ref's): it
// returns the column names of the last "# Size" (or "# Queued") line and every
// row.
// Lines that are neither comments nor rows are ignored.
func Parse(r io.Reader) (columns []string, rows []Result, err error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if key, ok := keyOf(line); ok {
			columns = splitColumns(line[len(key):])
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		size, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		res := Result{Size: size}
		for _, s := range f[1:] {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				break
			}
			res.Values = append(res.Values, v)
		}
		rows = append(rows, res)
	}
	return columns, rows, sc.Err()
}

// splitColumns splits a header line's column part into names: columns are
// right-aligned in FieldWidth characters and names contain single spaces.
func splitColumns(s string) []string {
	var out []string
	for _, part := range strings.Split(s, "  ") {
		if p := strings.TrimSpace(part); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// keyOf reports whether line is a column header line and returns its key.
func keyOf(line string) (string, bool) {
	for _, k := range []string{"# Size", "# Queued"} {
		if strings.HasPrefix(line, k) {
			return k, true
		}
	}
	return "", false
}

// PageSize is the alignment of Buffer's slices, in bytes (OSU aligns its
// buffers to getpagesize(): util/osu_util_mpi.c allocate_memory_pt2pt).
const PageSize = 4096

// Buffer returns n zero bytes (n >= 0) that start on a page boundary and share
// no cache line with any other object, as OSU's posix_memalign'd buffers: in a
// run of goroutine ranks, which share one heap, two ranks' small buffers could
// otherwise sit in one 64-byte line and every copy into one would take the
// line from the other rank's core.
func Buffer(n int) []byte {
	lines := (max(n, 1) + 63) &^ 63
	b := make([]byte, lines+PageSize)
	off := 0
	if r := int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) % PageSize); r != 0 {
		off = PageSize - r
	}
	return b[off : off+n : off+n]
}

// origin is where Now counts from.
var origin = time.Now()

// Now reads the monotonic clock only, as MPI_Wtime does in Open MPI and
// MPICH (clock_gettime(CLOCK_MONOTONIC)): one clock read. time.Now reads the
// wall clock as well, a second vDSO call (tens of nanoseconds on a KVM
// guest), which a test that times every call of a sub-microsecond
// operation would charge to amgo alone.
func Now() time.Duration { return time.Since(origin) }
