package opts

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBytes(t *testing.T) {
	n, err := Bytes(map[string]string{"x": "64k"}, "x", "AMGO_TEST_X", 1, 1, 1<<30)
	require.NoError(t, err)
	require.Equal(t, 64<<10, n)
	n, err = Bytes(nil, "x", "AMGO_TEST_X", 7, 1, 1<<30)
	require.NoError(t, err)
	require.Equal(t, 7, n)
	t.Setenv("AMGO_TEST_X", "2M")
	n, err = Bytes(nil, "x", "AMGO_TEST_X", 7, 1, 1<<30)
	require.NoError(t, err)
	require.Equal(t, 2<<20, n)
	for _, bad := range []string{"x", "-1", "0", "3g", "99999999999m"} {
		_, err = Bytes(map[string]string{"x": bad}, "x", "", 1, 1, 1<<30)
		require.Error(t, err, bad)
	}
	_, err = Bytes(map[string]string{"x": "100"}, "x", "", 1, 1000, 1<<30)
	require.Error(t, err, "below the range")
}
