// Package memcopy copies large buffers so that the destination stays in the
// caches.
//
// Go's copy (runtime.memmove) on amd64 switches to non-temporal stores for a
// single move of 1 MiB or more: the destination goes to memory, bypassing
// the caches, so that a huge copy does not evict everything else. For an MPI
// library the destination is what the program reads next (a collective's
// own block, a message to self), and the switch happens at a size that fits
// in the last-level cache of any server CPU: an Alltoall of 1 MiB blocks on
// two ranks took 1.5 times as long as one of 512 KiB blocks would suggest.
// glibc's memcpy makes the same switch only above three quarters of the
// shared cache per thread (several MiB). Copy moves the data in pieces
// below Go's threshold instead.
//
// Prefetch asks for a buffer's lines all at once, before a loop of small
// loads reads them (unpacking non-contiguous data out of a message that
// another core wrote). CopyNT and GatherNT store around the caches, for a
// buffer that another core reads next (a shared staging area), and
// StoreFence orders those stores before the one that publishes them.
package memcopy

import "unsafe"

// Piece is the largest single move, in bytes: below the 1 MiB from which
// runtime.memmove stores around the caches on amd64.
const Piece = 512 << 10

// Min is the smallest copy, in bytes, that Copy splits: below it the
// built-in copy keeps to the caches anyway.
const Min = 1 << 20

// Max is the largest copy, in bytes, that Copy splits: above it the data no
// longer fits beside the rest of a node's working set in a last-level cache,
// and stores around the caches are the faster copy (the built-in one).
const Max = 4 << 20

// Copy copies min(len(dst), len(src)) bytes from src to dst, as the built-in
// copy does, and returns the number of bytes copied; from Min to Max bytes
// in moves of at most Piece bytes. Overlapping slices are copied as the
// built-in copy does, in one move.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < Min || n > Max || overlap(dst[:n], src[:n]) {
		return copy(dst, src)
	}
	for off := 0; off < n; off += Piece {
		end := min(off+Piece, n)
		copy(dst[off:end], src[off:end])
	}
	return n
}

// overlap reports whether a and b (both non-empty) share memory.
func overlap(a, b []byte) bool {
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}
