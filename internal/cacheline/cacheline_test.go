package cacheline

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

type small struct{ a, b uint32 }

// Every byte within a line of the object belongs to the same allocation: the
// returned slice has at least Size bytes of its backing array on each side.
func TestPadding(t *testing.T) {
	for _, n := range []int{0, 1, 2, 7, 100} {
		s := Slice[small](n)
		require.Len(t, s, n)
		require.Equal(t, n, cap(s))
		if n == 0 {
			continue // slicing to capacity 0 keeps the base pointer
		}
		full := unsafe.Slice((*small)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(s)), -Size)), n+2*Size/8)
		for i := range full {
			require.Zero(t, full[i]) // readable: part of the allocation
		}
	}
	p := New[uint64]()
	require.Zero(t, *p)
	*p = 7
	require.Equal(t, uint64(7), *p)
	require.Len(t, Slice[struct{}](3), 3)
}
