// Package cacheline allocates objects that share no cache line with any other
// object.
//
// Ranks that run as goroutines of one process (the loop transport) share one
// heap, and the Go allocator packs small objects of one size class side by
// side: one rank's request, matching node or sequence counter can sit in the
// same 64-byte line as another rank's, and every write by one core then takes
// the line away from the other (false sharing). Objects written on every
// message are allocated here instead: each sits inside an allocation of its
// own with a full line of padding on either side.
package cacheline

import "unsafe"

// Size is the cache line size assumed, in bytes (x86-64, and arm64's common
// 64-byte lines; on 128-byte lines the padding halves the sharing).
const Size = 64

// New returns a pointer to a zero T that shares no cache line with another
// object. It allocates sizeof(T) rounded up to Size, plus 2*Size bytes.
func New[T any]() *T {
	return &Slice[T](1)[0]
}

// Slice returns a slice of n zero Ts (n >= 0) whose elements share no cache
// line with another object (they may share lines with each other). It
// allocates n*sizeof(T) rounded up to Size, plus 2*Size bytes.
func Slice[T any](n int) []T {
	var zero T
	size := int(unsafe.Sizeof(zero))
	if size == 0 {
		return make([]T, n)
	}
	pad := (Size + size - 1) / size // elements that cover one line
	s := make([]T, pad+n+pad)
	return s[pad : pad+n : pad+n]
}
