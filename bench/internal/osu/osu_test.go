package osu

import (
	"bytes"
	"testing"

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
	require.Equal(t, "# amgo AM Latency Test\n# Size          Latency (us)\n8                       0.25\n", b.String())
}
