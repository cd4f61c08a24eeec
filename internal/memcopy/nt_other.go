//go:build !amd64

package memcopy

import "unsafe"

func copyNT(dst, src unsafe.Pointer, n int) {
	copy(unsafe.Slice((*byte)(dst), n), unsafe.Slice((*byte)(src), n))
}

func gatherNT(dst, src unsafe.Pointer, stride, n int) {
	for i := range n {
		*(*[8]byte)(unsafe.Add(dst, 8*i)) = *(*[8]byte)(unsafe.Add(src, i*stride))
	}
}

// StoreFence makes every store before it visible to other cores before any
// store after it: nothing to do here, where CopyNT and GatherNT make
// ordinary stores (SFENCE on amd64).
func StoreFence() {}
