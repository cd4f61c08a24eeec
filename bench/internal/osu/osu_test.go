package osu

import (
	"bytes"
	"flag"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func TestParseRange(t *testing.T) {
	lo, hi, err := ParseRange("4:1024")
	require.NoError(t, err)
	require.Equal(t, [2]int{4, 1024}, [2]int{lo, hi})
	lo, hi, err = ParseRange("64")
	require.NoError(t, err)
	require.Equal(t, [2]int{0, 64}, [2]int{lo, hi})
	for _, bad := range []string{"", "x", "8:4", "-1:4", "1:y"} {
		_, _, err := ParseRange(bad)
		require.Error(t, err, bad)
	}
}

func TestSizesAndLayout(t *testing.T) {
	require.Equal(t, []int{0, 1, 2, 4, 8}, Options{MinSize: 0, MaxSize: 8}.Sizes())
	require.Equal(t, []int{4, 8, 16}, Options{MinSize: 3, MaxSize: 16}.Sizes())
	var b bytes.Buffer
	Header(&b, "amgo AM Latency Test", "Latency (us)")
	Row(&b, 8, 0.25)
	// OSU 7.2: "%-*s%*s\n", 10, "# Size", FIELD_WIDTH (20), ...
	require.Equal(t, "# amgo AM Latency Test\n# Size            Latency (us)\n8                         0.25\n", b.String())
}

func TestOptionsAndCounts(t *testing.T) {
	o := LatencyOptions()
	require.Equal(t, [2]int{10000, 100}, pair(o.Counts(8192)))
	require.Equal(t, [2]int{1000, 10}, pair(o.Counts(16384)))
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	Register(fs, &o)
	require.NoError(t, fs.Parse([]string{"-i", "50", "-x", "5", "-m", "2:64", "-W", "8"}))
	require.Equal(t, [2]int{50, 5}, pair(o.Counts(1<<20)))
	require.Equal(t, []int{2, 4, 8, 16, 32, 64}, o.Sizes())
	require.Equal(t, 8, o.Window)
}

func pair(a, b int) [2]int { return [2]int{a, b} }

func TestParse(t *testing.T) {
	var b bytes.Buffer
	Header(&b, "amgo MPI Multiple Bandwidth / Message Rate Test", "MB/s", "Messages/s")
	Row(&b, 1, 2.5, 2500000)
	Row(&b, 2, 5, 2500000)
	cols, rows, err := Parse(strings.NewReader("# [ pairs: 1 ] [ window size: 64 ]\n" + b.String() + "garbage line\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"MB/s", "Messages/s"}, cols)
	require.Equal(t, []Result{{1, []float64{2.5, 2500000}}, {2, []float64{5, 2500000}}}, rows)
}

func TestBufferIsPageAligned(t *testing.T) {
	for _, n := range []int{0, 1, 8, 4096, 10000} {
		b := Buffer(n)
		require.Len(t, b, n)
		if n > 0 {
			require.Zero(t, uintptr(unsafe.Pointer(&b[0]))%PageSize)
		}
	}
}
