package memcopy

import "unsafe"

// Non-temporal stores (MOVNTI, MOVNTDQ on amd64) write whole lines to
// memory through the write-combining buffers, without first reading the
// line into this core's cache. That is the cheaper way to fill a buffer that
// another core reads next and has read before (a staging area that two
// processes pass pieces through): an ordinary store must first take the
// line from the other core's cache, a round trip between cores for each
// line, while a non-temporal store only invalidates the other core's copy.
// The reader then loads the lines from memory. Such stores are not ordered
// with the ordinary stores after them: StoreFence must run before the
// store that tells the reader the data is there.

// CopyNT copies min(len(dst), len(src)) bytes from src to dst with
// non-temporal stores (the last len%8 bytes with ordinary ones), and returns
// the number of bytes copied. The slices must not overlap. Elsewhere than
// on amd64 it is the built-in copy. Call StoreFence before publishing the
// data to another core.
func CopyNT(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n == 0 {
		return 0
	}
	words := n &^ 7
	if words > 0 {
		copyNT(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), words)
	}
	copy(dst[words:n], src[words:n])
	return n
}

// GatherNT copies n words of 8 bytes, the first at src and each next one
// stride bytes (which may be negative) after the one before, into
// consecutive words from dst, with non-temporal stores. The caller has
// checked that dst holds 8n bytes and that every word read lies inside one
// object with src (n <= 0 copies nothing). Elsewhere than on amd64 the
// stores are ordinary ones. Call StoreFence before publishing the data to
// another core.
func GatherNT(dst, src unsafe.Pointer, stride, n int) {
	if n <= 0 {
		return
	}
	gatherNT(dst, src, stride, n)
}
