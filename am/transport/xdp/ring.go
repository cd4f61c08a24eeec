//go:build linux

package xdp

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is one of an AF_XDP socket's four single-producer single-consumer
// rings, mapped from the kernel (Documentation/networking/af_xdp.rst). The
// producer and consumer words are shared with the kernel: this side reads
// the other side's word with an atomic load (acquire) before it touches the
// descriptors it covers, and publishes its own word with an atomic store
// (release) after it has written or finished reading them. Go's atomics are
// sequentially consistent, which is at least that.
//
// fill and tx are produced by this process and consumed by the kernel; rx
// and completion the other way round. The fill and completion rings carry
// 8-byte UMEM addresses, rx and tx 16-byte descriptors (unix.XDPDesc).
type ring struct {
	prod, cons *atomic.Uint32
	flags      *atomic.Uint32
	descs      unsafe.Pointer // the descriptor array
	mask       uint32
	// local is this side's own index, the word it alone writes: the next
	// entry to fill (a producer) or to read (a consumer).
	local uint32
	mem   []byte // the mapping, for Close
}

// mapRing maps the ring of n entries of descSize bytes at page offset pgoff
// of socket fd, whose words and descriptors lie at the offsets off gives.
func mapRing(fd int, off unix.XDPRingOffset, pgoff int64, n, descSize uint32) (*ring, error) {
	size := int(off.Desc) + int(n)*int(descSize)
	mem, err := unix.Mmap(fd, pgoff, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap ring at page offset %#x: %w", pgoff, err)
	}
	base := unsafe.Pointer(&mem[0])
	r := &ring{
		prod:  (*atomic.Uint32)(unsafe.Add(base, off.Producer)),
		cons:  (*atomic.Uint32)(unsafe.Add(base, off.Consumer)),
		flags: (*atomic.Uint32)(unsafe.Add(base, off.Flags)),
		descs: unsafe.Add(base, off.Desc),
		mask:  n - 1,
		mem:   mem,
	}
	return r, nil
}

// unmap releases the mapping.
func (r *ring) unmap() {
	if r != nil && r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem = nil
	}
}

// addr is entry i of a fill or completion ring.
func (r *ring) addr(i uint32) *uint64 {
	return (*uint64)(unsafe.Add(r.descs, uintptr(i&r.mask)*8))
}

// desc is entry i of an rx or tx ring.
func (r *ring) desc(i uint32) *unix.XDPDesc {
	return (*unix.XDPDesc)(unsafe.Add(r.descs, uintptr(i&r.mask)*unsafe.Sizeof(unix.XDPDesc{})))
}

// ready is how many entries a consumer may read now.
func (r *ring) ready() uint32 { return r.prod.Load() - r.local }

// waiting reports whether entries are in the ring between the two sides'
// published words: safe from any goroutine, unlike ready, which
// reads the local index of the side that owns it.
func (r *ring) waiting() bool { return r.prod.Load() != r.cons.Load() }

// publish makes the entries a producer filled up to local visible to the
// kernel (release).
func (r *ring) publish() { r.prod.Store(r.local) }

// release hands the entries a consumer read up to local back to the kernel
// (release).
func (r *ring) release() { r.cons.Store(r.local) }
