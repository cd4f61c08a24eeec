package memcopy

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestPrefetch asks for the lines of empty, short, unaligned and long
// slices, and of a slice that ends at the last byte before a page that may
// not be touched: a prefetch never faults, and the data is unchanged.
func TestPrefetch(t *testing.T) {
	Prefetch(nil)
	b := make([]byte, 3*PrefetchMax)
	for i := range b {
		b[i] = byte(i)
	}
	for _, s := range [][]byte{b[:0], b[:1], b[1:64], b[63:700], b[5:], b} {
		Prefetch(s)
	}
	for i := range b {
		require.Equal(t, byte(i), b[i])
	}
	page := unix.Getpagesize()
	m, err := unix.Mmap(-1, 0, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	require.NoError(t, err)
	defer unix.Munmap(m)
	require.NoError(t, unix.Mprotect(m[page:], unix.PROT_NONE))
	Prefetch(m[page-100 : page])
	Prefetch(m[1:page])
}
