package memcopy

import "unsafe"

// copyNT copies n bytes, a multiple of 8, from src to dst with
// non-temporal stores (MOVNTDQ for the 16-byte-aligned middle, MOVNTI
// around it).
//
//go:noescape
func copyNT(dst, src unsafe.Pointer, n int)

// gatherNT is GatherNT for n > 0 (MOVNTI).
//
//go:noescape
func gatherNT(dst, src unsafe.Pointer, stride, n int)

// StoreFence makes every store before it, the non-temporal ones included,
// visible to other cores before any store after it (SFENCE on amd64;
// nothing elsewhere, where CopyNT and GatherNT make ordinary stores).
func StoreFence()
