// Package flowctl is the credit of the buffered protocol of MPI over
// SP AM (Chang, Czajkowski, Hawblitzel, Hu and von Eicken, "Low-Latency
// Communication on the IBM RISC System/6000 SP", Supercomputing 1996): every
// receiver holds one buffer (16 KiB there; here its size may differ from
// peer to peer, the same at both ends of a pair) for every other process; a sender
// allocates space in its buffer at the receiver on its own, with no
// communication, and the receiver's reply, once it has consumed the message,
// frees that space.
//
// A Window is that allocation: the sender's picture of its buffer at one peer.
// Space is handed out in ring order in units of Granule bytes; replies free it
// in any order (a message that waits in the receiver's unexpected list keeps its
// space while later ones are freed), and the ring advances past a freed block
// only once everything before it is free. When the window is full the sender
// polls until replies free space: back-pressure, never loss and never unbounded
// memory.
//
// An Owed is the other side: what the receiver has consumed and owes back to
// one sender, coalesced into one range, and the rules of when it goes back
// (CarryOnRequest, Urgent; owed.go).
//
// Sender and Ledger put these together into the credit engine (credit.go):
// a Sender, one per peer, reserves a request's room (Params.Reservation)
// and picks the owed range it carries back, and undoes both when the
// network refuses the packet; a Ledger, one per rank, checks each arriving
// request's reservation, records what is consumed, and decides which ranges
// go back in acks and when (at once when displaced, before the next
// delivery when Urgent, all when the receiver idles).
//
// The package does no I/O and starts no goroutine: the caller (package am)
// sends what it decides, and the engine is tested here against a reference
// model without sockets or goroutines. A Window and a Sender take no lock
// (the caller serializes access per peer); an Owed is lock-free.
package flowctl

import (
	"errors"
	"fmt"

	"github.com/amgo-hpc/amgo/internal/cacheline"
)

// Granule is the allocation unit in bytes; every reservation is a multiple of it.
const Granule = 64

// DefaultBufferBytes is the per-peer receive buffer of MPI over SP AM: 16 KiB.
const DefaultBufferBytes = 16 << 10

// Errors of Free; a malformed or duplicated reply yields one of them.
var (
	ErrNotAllocated = errors.New("flowctl: range not allocated")
	ErrBadSize      = errors.New("flowctl: invalid size")
)

type block struct {
	pos   uint64 // position in the unbounded ring, bytes
	off   uint32 // pos modulo the buffer's size: its offset in the buffer
	n     uint32 // bytes
	freed bool
}

// Window allocates space in one peer's receive buffer of Size bytes.
//
// Its memory grows with the blocks outstanding at once, not with the
// buffer: a job keeps a Window for every peer, most of which see little
// traffic, and a buffer of 256 KiB could hold 4096 blocks of one granule.
// The FIFO of blocks starts empty and doubles when full (at most
// Size/Granule entries); a free that does not start at the oldest block finds
// its block by binary search, the blocks being in position order.
type Window struct {
	size   uint64
	head   uint64  // next position to hand out
	hoff   uint64  // head modulo size (kept, so that no path divides)
	tail   uint64  // oldest position not yet free
	blocks []block // FIFO of outstanding blocks, ring buffer (grows: grow)
	first  int     // index of the oldest block in blocks
	count  int
}

// minBlocks is the FIFO's first capacity, in blocks.
const minBlocks = 16

// NewWindow returns a window over a buffer of size bytes (a positive multiple of
// Granule, at most 1 GiB).
func NewWindow(size int) (*Window, error) {
	if size <= 0 || size%Granule != 0 || size > 1<<30 {
		return nil, fmt.Errorf("%w: buffer of %d bytes (want a positive multiple of %d up to 1 GiB)", ErrBadSize, size, Granule)
	}
	// Off other objects' cache lines: an endpoint allocates and frees on
	// every message, and goroutine ranks share one heap (internal/cacheline).
	w := cacheline.New[Window]()
	*w = Window{size: uint64(size)}
	return w, nil
}

// grow doubles the FIFO of blocks (to at least minBlocks, at most one block
// per granule of the buffer), keeping its order; the FIFO is full.
func (w *Window) grow() {
	n := min(max(2*len(w.blocks), minBlocks), int(w.size/Granule))
	b := cacheline.Slice[block](n)
	for k, j := 0, w.first; k < w.count; k, j = k+1, w.next(j) {
		b[k] = w.blocks[j]
	}
	w.blocks, w.first = b, 0
}

// Size is the buffer's size in bytes.
func (w *Window) Size() int { return int(w.size) }

// InUse is the number of bytes between the oldest unfreed block and the next
// allocation, including padding skipped at the ring's end.
func (w *Window) InUse() int { return int(w.head - w.tail) }

// Outstanding is the number of blocks handed out and not yet freed.
func (w *Window) Outstanding() int {
	n := 0
	for i, j := 0, w.first; i < w.count; i, j = i+1, w.next(j) {
		if !w.blocks[j].freed {
			n++
		}
	}
	return n
}

// RoundUp returns n rounded up to a whole number of granules.
func RoundUp(n int) int { return (n + Granule - 1) &^ (Granule - 1) }

// Alloc reserves n bytes (a multiple of Granule, at most Size) contiguously in the
// buffer and returns their offset. ok is false when the space is not free now;
// the caller waits for replies and tries again. Sizes that can never fit return
// ErrBadSize.
func (w *Window) Alloc(n int) (off uint32, ok bool, err error) {
	if n <= 0 || n%Granule != 0 || uint64(n) > w.size {
		return 0, false, fmt.Errorf("%w: reservation of %d bytes in a %d-byte buffer", ErrBadSize, n, w.size)
	}
	pos, o := w.head, w.hoff
	if o+uint64(n) > w.size {
		pos += w.size - o // skip to the ring's start; the pad frees with its predecessor
		o = 0
	}
	if w.count == 0 {
		w.tail = pos // nothing outstanding: the pad is free at once
	}
	if pos+uint64(n)-w.tail > w.size {
		return 0, false, nil
	}
	if w.count == len(w.blocks) {
		w.grow() // never past a block per granule: the space check above bounds count
	}
	i := w.first + w.count
	if i >= len(w.blocks) {
		i -= len(w.blocks)
	}
	w.blocks[i] = block{pos: pos, off: uint32(o), n: uint32(n)}
	w.count++
	w.head = pos + uint64(n)
	if w.hoff = o + uint64(n); w.hoff == w.size {
		w.hoff = 0
	}
	return uint32(o), true, nil
}

// next is the index after i in the ring of blocks.
func (w *Window) next(i int) int {
	if i++; i == len(w.blocks) {
		return 0
	}
	return i
}

// Free releases n bytes at off. The range may cover several consecutive blocks
// (a receiver coalesces adjacent frees into one reply); it must start at a
// block and end at a block boundary. Freeing space not handed out, or twice, is
// ErrNotAllocated and changes nothing.
func (w *Window) Free(off, n uint32) error {
	if n == 0 || uint64(off)+uint64(n) > w.size || off%Granule != 0 {
		return fmt.Errorf("%w: [%d,+%d) in a %d-byte buffer", ErrNotAllocated, off, n, w.size)
	}
	end := off + n
	if w.count > 0 && w.blocks[w.first].off == off && w.freeOldest(off, end) {
		return nil
	}
	// Validate the whole range before changing anything. The blocks that
	// tile it are found one by one: they follow one another in the FIFO
	// except where the range joins the newest block to the oldest.
	for o := off; o < end; {
		k, ok := w.find(o)
		if !ok || w.blocks[w.at(k)].freed {
			return fmt.Errorf("%w: no block at offset %d (freeing [%d,+%d))", ErrNotAllocated, o, off, n)
		}
		o += w.blocks[w.at(k)].n
		if o > end {
			return fmt.Errorf("%w: [%d,+%d) ends inside a block", ErrNotAllocated, off, n)
		}
	}
	for o := off; o < end; {
		k, _ := w.find(o)
		b := &w.blocks[w.at(k)]
		b.freed = true
		o += b.n
	}
	w.advance()
	return nil
}

// at is the index in blocks of the k-th oldest outstanding block.
func (w *Window) at(k int) int {
	if i := w.first + k; i < len(w.blocks) {
		return i
	}
	return w.first + k - len(w.blocks)
}

// find returns k such that the k-th oldest outstanding block starts at
// offset off, and whether there is one. Outstanding blocks lie within one
// buffer's length of positions from the oldest, so off names one position
// there; their positions increase, so a binary search finds it.
func (w *Window) find(off uint32) (int, bool) {
	if w.count == 0 {
		return 0, false
	}
	b0 := &w.blocks[w.first]
	d := uint64(off) + w.size - uint64(b0.off)
	if d >= w.size {
		d -= w.size
	}
	pos := b0.pos + d
	lo, hi := 0, w.count
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if w.blocks[w.at(m)].pos < pos {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < w.count && w.blocks[w.at(lo)].pos == pos
}

// freeOldest is Free of [off, end) when the range starts at the oldest
// outstanding block, the common case (replies come back in the order of
// the requests): it checks that the range tiles outstanding blocks from
// there and drops them in one walk, without marking them freed one by one.
// false: the range is not such a run (nothing changed; Free's general path
// decides).
func (w *Window) freeOldest(off, end uint32) bool {
	j, k := w.first, 0
	for o := off; o != end; k++ {
		if k == w.count || o > end {
			return false
		}
		b := &w.blocks[j]
		if b.off != o || b.freed {
			return false
		}
		o += b.n
		j = w.next(j)
	}
	w.first, w.count = j, w.count-k
	w.advance()
	return true
}

// advance moves the tail past the freed blocks at the front.
func (w *Window) advance() {
	for w.count > 0 && w.blocks[w.first].freed {
		w.first = w.next(w.first)
		w.count--
	}
	if w.count > 0 {
		w.tail = w.blocks[w.first].pos
	} else {
		w.tail = w.head
	}
}
