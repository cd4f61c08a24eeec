package opts

import (
	"testing"
	"time"

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
	n, err = Bytes(map[string]string{"x": "0"}, "x", "", 1, 0, 1<<30)
	require.NoError(t, err, "0 where lo is 0")
	require.Zero(t, n)
	_, err = Bytes(map[string]string{"x": "0"}, "x", "", 1, 1, 1<<30)
	require.Error(t, err, "0 where lo is 1")
	_, err = Bytes(map[string]string{"x": "100"}, "x", "", 1, 1000, 1<<30)
	require.Error(t, err, "below the range")
}

func TestDurationAndPort(t *testing.T) {
	d, err := Duration(map[string]string{"spin": "15us"}, "spin", "AMGO_TEST_SPIN", time.Second)
	require.NoError(t, err)
	require.Equal(t, 15*time.Microsecond, d)
	d, err = Duration(nil, "spin", "AMGO_TEST_SPIN", time.Second)
	require.NoError(t, err)
	require.Equal(t, time.Second, d, "unset: the default")
	t.Setenv("AMGO_TEST_SPIN", "2ms")
	d, err = Duration(nil, "spin", "AMGO_TEST_SPIN", time.Second)
	require.NoError(t, err)
	require.Equal(t, 2*time.Millisecond, d)
	for _, bad := range []string{"x", "-1us", "5"} {
		_, err = Duration(map[string]string{"spin": bad}, "spin", "", 0)
		require.ErrorContains(t, err, "bad spin", bad)
	}
	p, err := Port(nil, "port", "AMGO_TEST_PORT")
	require.NoError(t, err)
	require.Zero(t, p, "unset: any port")
	p, err = Port(map[string]string{"port": "4242"}, "port", "")
	require.NoError(t, err)
	require.Equal(t, 4242, p)
	for _, bad := range []string{"x", "-1", "65536"} {
		_, err = Port(map[string]string{"port": bad}, "port", "")
		require.ErrorContains(t, err, "bad port", bad)
	}
}
