//go:build linux

package netaddr

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestChoose(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	a, err := Choose(map[string]string{"iface": "lo"})
	require.NoError(t, err)
	require.Equal(t, lo, a)
	a, err = Choose(map[string]string{"iface": "127.0.0.1"})
	require.NoError(t, err)
	require.Equal(t, lo, a)
	_, err = Choose(map[string]string{"iface": "0.0.0.0"})
	require.Error(t, err, "never every interface")
	_, err = Choose(map[string]string{"iface": "::"})
	require.Error(t, err)
	_, err = Choose(map[string]string{"iface": "nosuchif0"})
	require.Error(t, err)
	t.Setenv("AMGO_IFACE", "127.0.0.1")
	a, err = Choose(nil)
	require.NoError(t, err)
	require.Equal(t, lo, a, "AMGO_IFACE when no option is given")
	t.Setenv("AMGO_IFACE", "")
	a, err = Choose(nil)
	require.NoError(t, err)
	require.True(t, a.Is4() && !a.IsUnspecified(), "%v", a)
}
