package am

import (
	"fmt"
	"runtime"
	"sort"
	"unsafe"

	"github.com/amgo-hpc/amgo/internal/wire"
)

// Segment is memory a rank registered as a Store destination (the GASNet
// segment, or the receive buffer the rendezvous protocol names to the
// sender). Addr is its address in the registering process; peers store to
// Addr+offset. The memory stays pinned and reachable until Unregister.
type Segment struct {
	// Addr is the segment's first byte as peers name it.
	Addr uint64
	// Len is its size in bytes.
	Len int
}

type segment struct {
	base uint64
	buf  []byte
	pin  *runtime.Pinner
	refs int // registrations of exactly this range
}

// RegisterSegment makes buf a Store destination and returns the name peers
// use for it. buf must not be empty and must not partly overlap a registered
// segment; registering exactly the same range again is counted, and it stays
// registered until unregistered as many times (several pending receives into
// one buffer, as benchmarks post them).
// It is pinned (runtime.Pinner) so that its address stays valid for
// single-copy puts from other processes. Errors: ErrSegment.
func (ep *Endpoint) RegisterSegment(buf []byte) (Segment, error) {
	if len(buf) == 0 {
		return Segment{}, fmt.Errorf("%w: empty segment", ErrSegment)
	}
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	ep.segMu.Lock()
	defer ep.segMu.Unlock()
	i := sort.Search(len(ep.segs), func(i int) bool { return ep.segs[i].base >= base })
	if i < len(ep.segs) && ep.segs[i].base == base && len(ep.segs[i].buf) == len(buf) {
		ep.segs[i].refs++
		return Segment{Addr: base, Len: len(buf)}, nil
	}
	if i < len(ep.segs) && ep.segs[i].base < base+uint64(len(buf)) {
		return Segment{}, fmt.Errorf("%w: [%#x,+%d) overlaps a registered segment", ErrSegment, base, len(buf))
	}
	if i > 0 && ep.segs[i-1].base+uint64(len(ep.segs[i-1].buf)) > base {
		return Segment{}, fmt.Errorf("%w: [%#x,+%d) overlaps a registered segment", ErrSegment, base, len(buf))
	}
	var p *runtime.Pinner
	if n := len(ep.pinners); n > 0 {
		p = ep.pinners[n-1]
		ep.pinners[n-1] = nil
		ep.pinners = ep.pinners[:n-1]
	} else {
		p = new(runtime.Pinner)
	}
	p.Pin(unsafe.SliceData(buf))
	ep.segs = append(ep.segs, segment{})
	copy(ep.segs[i+1:], ep.segs[i:])
	ep.segs[i] = segment{base: base, buf: buf, pin: p, refs: 1}
	return Segment{Addr: base, Len: len(buf)}, nil
}

// maxSparePinners bounds the unpinned Pinners an endpoint keeps for reuse.
const maxSparePinners = 64

// UnregisterSegment removes a segment registered by RegisterSegment. Stores into
// it that arrive later through the network are dropped; a peer must not
// single-copy store into it any more (see Store). Errors: ErrSegment if it is not registered.
func (ep *Endpoint) UnregisterSegment(s Segment) error {
	ep.segMu.Lock()
	defer ep.segMu.Unlock()
	i := sort.Search(len(ep.segs), func(i int) bool { return ep.segs[i].base >= s.Addr })
	if i == len(ep.segs) || ep.segs[i].base != s.Addr || len(ep.segs[i].buf) != s.Len {
		return fmt.Errorf("%w: [%#x,+%d) is not registered", ErrSegment, s.Addr, s.Len)
	}
	if ep.segs[i].refs--; ep.segs[i].refs > 0 {
		return nil
	}
	pin := ep.segs[i].pin
	pin.Unpin()
	if len(ep.pinners) < maxSparePinners {
		ep.pinners = append(ep.pinners, pin)
	}
	ep.segs = append(ep.segs[:i], ep.segs[i+1:]...)
	return nil
}

// lookupRegion returns the registered bytes [addr, addr+n).
func (ep *Endpoint) lookupRegion(addr uint64, n uint64) ([]byte, error) {
	ep.segMu.RLock()
	defer ep.segMu.RUnlock()
	i := sort.Search(len(ep.segs), func(i int) bool { return ep.segs[i].base > addr }) - 1
	if i < 0 {
		return nil, fmt.Errorf("%w: [%#x,+%d)", ErrSegment, addr, n)
	}
	s := &ep.segs[i]
	off := addr - s.base
	if off > uint64(len(s.buf)) || n > uint64(len(s.buf))-off {
		return nil, fmt.Errorf("%w: [%#x,+%d) runs past segment [%#x,+%d)", ErrSegment, addr, n, s.base, len(s.buf))
	}
	return s.buf[off : off+n : off+n], nil
}

// storeRegion validates a store packet's destination and, for a fragment,
// copies its payload there. It returns the store's whole region.
func (ep *Endpoint) storeRegion(h *wire.Header, payload []byte) ([]byte, error) {
	region, err := ep.lookupRegion(h.Addr, uint64(h.Total))
	if err != nil {
		return nil, err
	}
	if h.Kind == wire.KindRequestStore {
		if uint64(h.Frag)+uint64(len(payload)) > uint64(h.Total) {
			return nil, fmt.Errorf("%w: fragment [%d,+%d) past the store's %d bytes", ErrSegment, h.Frag, len(payload), h.Total)
		}
		copy(region[h.Frag:], payload)
	}
	return region, nil
}

// unregisterAll unpins every segment; Close calls it.
func (ep *Endpoint) unregisterAll() {
	ep.segMu.Lock()
	defer ep.segMu.Unlock()
	for _, s := range ep.segs {
		s.pin.Unpin()
	}
	ep.segs = nil
}
