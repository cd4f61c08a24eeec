package memcopy

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestCopyNT copies every length up to 300 bytes between every pair of
// alignments up to 17 bytes into a buffer whose other bytes must stay as
// they were, and a copy that ends at a page that may not be touched.
func TestCopyNT(t *testing.T) {
	src := make([]byte, 512)
	for i := range src {
		src[i] = byte(i*7 + 1)
	}
	dst := make([]byte, 512)
	for so := range 18 {
		for do := range 18 {
			for n := range 301 {
				clear(dst)
				got := CopyNT(dst[do:do+n], src[so:])
				StoreFence()
				require.Equal(t, n, got)
				for i := range dst {
					want := byte(0)
					if i >= do && i < do+n {
						want = src[so+i-do]
					}
					if dst[i] != want {
						t.Fatalf("src+%d dst+%d n %d: byte %d is %d, want %d", so, do, n, i, dst[i], want)
					}
				}
			}
		}
	}
	require.Equal(t, 0, CopyNT(nil, src))
	require.Equal(t, 3, CopyNT(dst[:3], src[:10]))

	page := unix.Getpagesize()
	m, err := unix.Mmap(-1, 0, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	require.NoError(t, err)
	defer unix.Munmap(m)
	require.NoError(t, unix.Mprotect(m[page:], unix.PROT_NONE))
	for i := range page {
		m[i] = byte(i)
	}
	out := make([]byte, page)
	require.Equal(t, page-3, CopyNT(out, m[3:page]))
	require.Equal(t, m[3:page], out[:page-3])
	require.Equal(t, 509, CopyNT(m[page-509:page], src))
	require.Equal(t, src[:509], m[page-509:page])
}

// TestGatherNT gathers words at positive and negative strides, counts 0 to
// 13 (whole rounds of four and the rest), leaving the rest of the
// destination alone, and reads no word past the last one.
func TestGatherNT(t *testing.T) {
	mem := make([]byte, 16<<10)
	for i := range mem {
		mem[i] = byte(i*13 + 5)
	}
	dst := make([]byte, 8*16)
	for _, stride := range []int{8, 16, 24, 40, 1000, -8, -16, -312} {
		for n := range 14 {
			clear(dst)
			first := 0
			if stride < 0 {
				first = -stride * max(n-1, 0)
			}
			GatherNT(unsafe.Pointer(&dst[0]), unsafe.Pointer(&mem[first]), stride, n)
			StoreFence()
			for k := range n {
				off := first + k*stride
				require.Equal(t, mem[off:off+8], dst[8*k:8*k+8], "stride %d n %d word %d", stride, n, k)
			}
			require.Equal(t, make([]byte, len(dst)-8*n), dst[8*n:], "stride %d n %d: bytes past the words", stride, n)
		}
	}

	page := unix.Getpagesize()
	m, err := unix.Mmap(-1, 0, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	require.NoError(t, err)
	defer unix.Munmap(m)
	require.NoError(t, unix.Mprotect(m[page:], unix.PROT_NONE))
	// Five words 16 bytes apart, the last one ending at the page's end.
	GatherNT(unsafe.Pointer(&dst[0]), unsafe.Pointer(&m[page-8-4*16]), 16, 5)
	StoreFence()
}
