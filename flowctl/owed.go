package flowctl

import "sync/atomic"

// The receiver's side of the credit: what it owes each sender.
//
// When a request's handler returns without a reply (every MPI eager message,
// for one), the space it took in the sender's buffer is consumed but not yet
// returned. The receiver owes it: Owed keeps one range per sender, to which
// adjacent consumptions coalesce (senders allocate in ring order, so they
// usually are adjacent). The range goes back on the next request to that
// sender that carries it (CarryOnRequest), on a reply that it directly
// precedes (TakeBefore), or as an acknowledgement: at once when a range that
// is not adjacent displaces it (Add), before the next delivery once it is
// Urgent, and when the receiver idles. Every way takes the range with one
// atomic operation, so a range is returned exactly once, whichever goroutine
// takes it.

// CarryMin is the smallest request payload, in bytes, that carries the credit
// owed to its destination however little it is: below it a request carries
// credit only once the range is CarryAny bytes or Urgent, because the free
// extension's 8 bytes would make an 8-byte MPI message two cache lines in a
// ring instead of one.
const CarryMin = 256

// CarryAny is the owed range, in bytes, from which every request to its
// sender carries it back, whatever its payload: a request's answer to what
// the range held (8 bytes acknowledging a 48 KiB message) then returns the
// space with it, where the idle flush would return it about a microsecond
// later, after the sender may have decided its next message by the space it
// still holds. The extension's line is worth as much from this size.
const CarryAny = 4096

// CarryOnRequest reports whether a request with a payload of payload bytes
// carries the owed range of owedLen bytes, for a receive buffer of
// bufferBytes.
func CarryOnRequest(owedLen uint32, payload, bufferBytes int) bool {
	return owedLen != 0 && (payload >= CarryMin || owedLen >= CarryAny || Urgent(owedLen, bufferBytes))
}

// Urgent reports whether an owed range of owedLen bytes must go back before
// the receiver delivers another packet (a quarter of the buffer): the sender
// may be short of space.
func Urgent(owedLen uint32, bufferBytes int) bool {
	return int(owedLen) >= bufferBytes/4
}

// Owed is the credit a receiver owes one sender: the range [Off, Off+Len) of
// the sender's space in the receiver's buffer that has been consumed and not
// yet returned. The zero value owes nothing. It is safe for concurrent use
// without a lock (the receiver's poller adds, its senders take).
type Owed struct {
	w atomic.Uint64 // off<<32 | len; 0: nothing owed
}

func packOwed(off, n uint32) uint64 { return uint64(off)<<32 | uint64(n) }

func unpackOwed(w uint64) (off, n uint32) { return uint32(w >> 32), uint32(w) }

// Add records that [off, off+n) was consumed (n > 0). When it directly
// follows the range owed, the two coalesce; otherwise it becomes the range
// owed and the older range is returned (prevLen > 0) for the caller to send
// back at once. total is the length of the range owed afterwards.
func (o *Owed) Add(off, n uint32) (prevOff, prevLen, total uint32) {
	for {
		old := o.w.Load()
		if po, pl := unpackOwed(old); pl != 0 && po+pl == off {
			if o.w.CompareAndSwap(old, packOwed(po, pl+n)) {
				return 0, 0, pl + n
			}
			continue // a sender took the range meanwhile
		}
		prevOff, prevLen = unpackOwed(o.w.Swap(packOwed(off, n)))
		return prevOff, prevLen, n
	}
}

// Len is the length of the range owed now (0: none).
func (o *Owed) Len() uint32 {
	_, n := unpackOwed(o.w.Load())
	return n
}

// Take takes the whole range owed; ok is false when nothing is owed.
func (o *Owed) Take() (off, n uint32, ok bool) {
	if o.w.Load() == 0 {
		return 0, 0, false
	}
	off, n = unpackOwed(o.w.Swap(0))
	return off, n, n != 0
}

// TakeBefore takes the range owed if it ends exactly at end (a reply to the
// request whose space starts at end returns both at once).
func (o *Owed) TakeBefore(end uint32) (off, n uint32, ok bool) {
	old := o.w.Load()
	if old == 0 {
		return 0, 0, false
	}
	off, n = unpackOwed(old)
	if off+n != end || !o.w.CompareAndSwap(old, 0) {
		return 0, 0, false
	}
	return off, n, true
}
