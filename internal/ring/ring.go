package ring

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/amgo-hpc/amgo/internal/release"
)

// ControlLen is the size of the control block at the start of a region, in
// bytes; the data area follows it.
const ControlLen = 256

// MinCapacity is the smallest data area a ring accepts, in bytes.
const MinCapacity = 256

// MaxCapacity is the largest data area a ring uses, in bytes (a record
// header's length field has 29 bits, and a record is at most about half
// the data area).
const MaxCapacity = 1 << 30

// magic marks an initialized region of this record layout: "amgoRNG2" read
// as a little-endian word ("amgoRNG1" rings had 8-byte headers).
const magic = 0x32474e526f676d61

// Offsets inside the control block.
const (
	offMagic    = 0   // uint64, stored last by Init
	offCapacity = 8   // uint64, data area bytes
	offHead     = 64  // uint64, producer's published position (for Pending); alone on line 1
	offTail     = 128 // uint64, consumer's freed position; alone on lines 2 and 3
)

// Record header bits (a little-endian 32-bit word).
const (
	lenMask  = 1<<29 - 1 // data bytes; for a pad, the bytes it covers
	wideBit  = 1 << 29   // the data starts 8 bytes into the record, not 4
	validBit = 1 << 30   // set in every header, so no header is the zero word
	padBit   = 1 << 31   // a pad: skip the bytes it covers
)

// Errors.
var (
	// ErrRegion: the region is too small, misaligned, or not initialized.
	ErrRegion = errors.New("ring: bad region")
	// ErrCorrupt: the other side wrote a value that no correct peer writes
	// (a record header or tail out of bounds). The ring is unusable.
	ErrCorrupt = errors.New("ring: corrupt")
)

// RegionSize is the number of bytes a region needs for a data area of
// capacity bytes (a power of two, at least MinCapacity).
func RegionSize(capacity int) int { return ControlLen + capacity }

// MaxRecord is the largest record (header plus payload, in bytes) that a ring
// with a data area of capacity bytes accepts: about capacity/2, so that a
// record of this size always fits once the consumer has drained the ring,
// whatever the position of the wrap.
func MaxRecord(capacity int) int {
	if capacity < MinCapacity {
		return 0
	}
	// Positions are multiples of slotLen. A record of S bytes goes to
	// offset 0 only when it does not fit before the end, even after the
	// one-slot pad that would put it on a line: the pad to the end is then
	// at most S. A record of M data bytes (S at most M+39) therefore fits a
	// drained ring when 2S+8 <= capacity.
	return ((capacity - 88) / 2) &^ 7
}

// Alloc returns a heap region for a ring with a data area of capacity bytes
// (rounded up to a power of two, at least MinCapacity), aligned to 128 bytes
// and initialized. Errors: ErrRegion when capacity exceeds MaxCapacity.
func Alloc(capacity int) ([]byte, error) {
	if capacity > MaxCapacity {
		return nil, fmt.Errorf("%w: capacity %d exceeds %d", ErrRegion, capacity, MaxCapacity)
	}
	c := MinCapacity
	if capacity > c {
		c = 1 << bits.Len(uint(capacity-1))
	}
	const align = 128
	buf := make([]byte, RegionSize(c)+align)
	skip := int(-uintptr(unsafe.Pointer(&buf[0])) & (align - 1))
	mem := buf[skip : skip+RegionSize(c) : skip+RegionSize(c)]
	if err := Init(mem); err != nil {
		return nil, err
	}
	return mem, nil
}

// Init formats mem as an empty ring: it zeroes mem and writes the control
// block. The data area is the largest power of two that fits after the
// control block, at most MaxCapacity. Init must complete before either side
// attaches with NewProducer or NewConsumer, and must not run while either is in
// use. Errors: ErrRegion when mem is not 8-byte aligned or too small.
func Init(mem []byte) error {
	if checkBase(mem) == nil && FitCapacity(len(mem)) > 0 {
		clear(mem)
	}
	return InitZeroed(mem) // it reports a bad region
}

// InitZeroed formats mem as an empty ring, as Init does, when mem is known to
// be all zero bytes already (a region of a freshly created file or mapping):
// it writes only the control block's words and touches no page of the data
// area, so that a ring that is never used costs no memory. The same rules as
// Init's apply. Errors: ErrRegion when mem is not 8-byte aligned or too
// small.
func InitZeroed(mem []byte) error {
	if err := checkBase(mem); err != nil {
		return err
	}
	c := FitCapacity(len(mem))
	if c == 0 {
		return fmt.Errorf("%w: %d bytes, need at least %d", ErrRegion, len(mem), RegionSize(MinCapacity))
	}
	word(mem, offCapacity).Store(uint64(c))
	word(mem, offMagic).Store(magic)
	return nil
}

// FitCapacity is the data area, in bytes, of the ring that Init or InitZeroed
// formats in a region of n bytes: the largest power of two that fits after
// the control block, at most MaxCapacity; 0 when n is too small.
func FitCapacity(n int) int {
	n -= ControlLen
	if n < MinCapacity {
		return 0
	}
	return 1 << (bits.Len(uint(min(n, MaxCapacity))) - 1)
}

// Capacity reports the data area of the ring in mem, in bytes. Errors:
// ErrRegion when mem does not hold an initialized ring.
func Capacity(mem []byte) (int, error) {
	if err := checkBase(mem); err != nil {
		return 0, err
	}
	if len(mem) < ControlLen+MinCapacity {
		return 0, fmt.Errorf("%w: %d bytes", ErrRegion, len(mem))
	}
	if word(mem, offMagic).Load() != magic {
		return 0, fmt.Errorf("%w: not initialized (magic %#x)", ErrRegion, word(mem, offMagic).Load())
	}
	c := word(mem, offCapacity).Load()
	if c < MinCapacity || c > MaxCapacity || c&(c-1) != 0 || c > uint64(len(mem)-ControlLen) {
		return 0, fmt.Errorf("%w: capacity %d in a region of %d bytes", ErrRegion, c, len(mem))
	}
	return int(c), nil
}

func checkBase(mem []byte) error {
	if len(mem) == 0 {
		return fmt.Errorf("%w: empty", ErrRegion)
	}
	if uintptr(unsafe.Pointer(&mem[0]))&7 != 0 {
		return fmt.Errorf("%w: base %p not 8-byte aligned", ErrRegion, &mem[0])
	}
	return nil
}

// word is the 64-bit word at byte off of b; off must be a multiple of 8 and
// b's base 8-byte aligned.
func word(b []byte, off uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&b[off]))
}

// tailPtr is the tail word as a plain pointer, for release.Store64.
func tailPtr(t *atomic.Uint64) *uint64 { return (*uint64)(unsafe.Pointer(t)) }

// lineLen is the cache line size; slotLen the unit of ring space: records
// start on slot boundaries, and records of an even number of slots on line
// boundaries.
const (
	lineLen = 64
	slotLen = 32
)

// dataOff is where a record's data starts, in bytes from its header: 4, or
// 8 for a record whose header part (the hdr that Push copies first) has a
// length of 0 to 3 mod 8. Either way the payload after a header part of a
// multiple of 4 bytes starts 8-byte aligned: an immediate request (a 4-byte
// header and 8-byte arguments) at 4, a packet with an 8-byte-multiple header
// at 8.
func dataOff(hdrLen int) uint64 { return 8 - uint64(hdrLen)&4 }

// wideOf is the header bit for a record whose data starts at off
// (dataOff's result).
func wideOf(off uint64) uint32 { return uint32(off&8) << 26 }

// recordSize is the ring space of a record of n data bytes that start at
// off (4 or 8) past its header: header and data rounded up to whole slots.
// A record of up to 28 data bytes after a 4-byte header takes one slot,
// half a line (an 8-byte MPI message with its envelope and immediate
// header): two of them travel from the producer's cache to the consumer's
// in one transfer. A record of an even number of slots starts a line (Push
// puts a slot of pad before it when it would not), so that no record spans
// more lines than its size needs: one of up to 60 bytes is one line and one
// transfer, not two. One of an odd number spans as many lines wherever it
// starts.
func recordSize(n, off uint64) uint64 { return (off + n + slotLen - 1) &^ (slotLen - 1) }

// headerOff is the data offset a record header w gives (4 or 8).
func headerOff(w uint32) uint64 { return 4 + uint64(w&wideBit)>>27 }

// Producer is the sending side of a ring. Its methods must be called by one
// goroutine at a time.
type Producer struct {
	_       [64]byte // keep the fields below off the cache lines of neighbouring objects
	data    []byte   // data area, len == capacity
	mask    uint64
	cap     uint64
	maxData uint64
	pos     uint64 // position of the next record
	tail    uint64 // last tail seen
	zeroed  uint64 // every word in [pos, zeroed) is zero when zeroed > pos; zeroed <= tail+cap
	ahead   uint64 // how far past pos Push keeps the area zeroed
	// streaming: the caller said that records go back to back (Streaming),
	// so those between smallRecord and streamRecord bytes skip zeroing ahead.
	streaming bool
	// zeroAbove: the record size above which Push always zeroes ahead,
	// bigRecord, or streamRecord in a stream; set by Streaming rather than
	// worked out from streaming in zeroAheadDue, which Push inlines and
	// whose size its frame felt (docs/performance.md, "A gap after each
	// record of a stream").
	zeroAbove uint64
	// lap: records of at most lapRecord bytes go back to the data area's
	// start rather than past lap bytes into it, when that space is free
	// (SetLap); lap == cap when off.
	lap       uint64
	lapRecord uint64
	lapEnd    uint64         // the position past which such a record tries to wrap: its lap's start+lap, or further while the consumer lags
	lapFails  uint           // tries to wrap in a row that found the consumer lagging
	lapBig    bool           // a record over lapRecord went since the last wrap: no short lap until the next one
	lapPaused bool           // PauseLap
	lapZeroed uint64         // every word from the start of lapZeroed's lap up to it is zero (zeroAhead)
	base      unsafe.Pointer // &data[0]
	tailp     *atomic.Uint64
	headp     *uint64 // the control block's published position (Pending)
	err       error
	fence     atomic.Uint64 // a word of this producer's own for Fence
	_         [64]byte
}

// NewProducer attaches the sending side to the initialized ring in mem. The
// ring must be empty and no other producer may ever have pushed to it.
// Errors: ErrRegion.
func NewProducer(mem []byte) (*Producer, error) {
	c, err := Capacity(mem)
	if err != nil {
		return nil, err
	}
	return &Producer{
		data:      mem[ControlLen : ControlLen+c : ControlLen+c],
		base:      unsafe.Pointer(&mem[ControlLen]),
		mask:      uint64(c - 1),
		cap:       uint64(c),
		maxData:   uint64(MaxRecord(c)),
		tailp:     word(mem, offTail),
		headp:     tailPtr(word(mem, offHead)),
		zeroed:    uint64(c), // Init zeroed the whole data area
		ahead:     uint64(min(c/4, 1024)),
		lap:       uint64(c),
		zeroAbove: bigRecord,
	}, nil
}

// SetLap makes records of at most lap/4 bytes (header and rounding
// included) wrap to the start of the data area once they would pass lap
// bytes into it, rather than go on to its end, whenever the consumer is at
// most half a lap behind: a stream of small records then keeps to lap bytes
// of lines, few enough to stay in both cores' first-level caches, and moves
// up to about one and a half times as many bytes a second as one that
// marches through a ring of hundreds of KiB (docs/performance.md, "A short
// lap for small records"). While the consumer lags further, records go on
// past lap as before, so the ring's whole capacity still absorbs bursts;
// larger records always use it, and after one the short lap waits for the
// next lap of the whole ring. lap is rounded down to a multiple of a cache
// line; 0, or a lap of at least half the capacity, turns it off (the
// default).
func (p *Producer) SetLap(lap int) {
	l := uint64(max(lap, 0)) &^ (lineLen - 1)
	if l == 0 || l >= p.cap/2 {
		p.lap, p.lapRecord = p.cap, 0
		return
	}
	p.lap, p.lapRecord = l, l/4
	p.lapEnd = p.pos&^p.mask + l
}

// MaxRecord is the largest record Push accepts, in bytes.
func (p *Producer) MaxRecord() int { return int(p.maxData) }

// Push copies hdr and then payload into one contiguous record and publishes
// it. It returns false, copying nothing, when the ring has no room for it now,
// when len(hdr)+len(payload) exceeds MaxRecord (it never will have room), or
// when the ring is corrupt (see Err). It does not allocate.
func (p *Producer) Push(hdr, payload []byte) bool {
	n := uint64(len(hdr)) + uint64(len(payload))
	if p.streaming && n-(gapFrom+1) < gapTo-gapFrom && p.pushGapped(hdr, payload) {
		return true
	}
	// reserve's and publish's common case (a record that fits before the
	// wrap, in space known free and zeroed) in this frame, so that a small
	// message's push makes no call but its copies.
	at := dataOff(len(hdr))
	size := recordSize(n, at)
	off := p.pos & p.mask
	if !p.fits(n, off, size) {
		start, ok := p.reserveSlow(n, at)
		if !ok {
			return false
		}
		p.copyIn(start+at, hdr, payload)
		p.publish(start, n, at)
		return true
	}
	// publish's steps for a record without a pad, written out (publish
	// does not inline).
	p.copyIn(off+at, hdr, payload)
	if size > p.lapRecord {
		p.lapBig = true
	}
	end := p.pos + size
	if end+8 > p.zeroed {
		p.zeroNext(off, at, end) // the area ahead is not zeroed that far
	}
	release.Store32((*uint32)(unsafe.Add(p.base, off)), validBit|wideOf(at)|uint32(n))
	p.pos = end
	release.Store64(p.headp, end) // for Pending, which must not read the data area
	// readyAhead's steps, written out: it does not inline, and its call
	// would be on every message's way.
	if p.zeroAheadDue(end, size) {
		p.zeroAhead(end, size)
	} else if p.streaming && size > smallRecord {
		p.takeAhead(end, size)
	}
	return true
}

// A gap: in a stream, a record of more than gapFrom and at most gapTo
// bytes of data is followed by a pad of gapLen bytes that no record uses, so that
// the next record starts that far past it. A consumer that keeps up with
// the stream reads each record just after it is published, and its core's
// stream prefetcher, which runs ahead of sequential reads within a page,
// would take the lines the producer is about to write (a read of a line
// another core is writing costs both cores a transfer); behind a gap it
// takes lines nobody writes. Chunks of 1 and 2 KiB copied between two
// cores that way move at 1.6 and 1.8 times the rate with a 1 KiB gap after
// each (BenchmarkChase), and osu bw and bibw over shm gain 5-12 % at 1 and 2 KiB
// (docs/performance.md, "A gap after each record of a stream"). Records of
// up to gapFrom bytes are too many to a page for a gap to pay (bibw at 512
// bytes lost 3 %), and from 4 KiB the gap was level while it costs ring
// space.
const (
	gapFrom = 768
	gapTo   = 2560
	gapLen  = 1024
)

// pushGapped is Push for a record of a stream that takes a gap: it writes
// and publishes the record followed by a gap when both fit as one record
// would (fits: at the position, no pad before it, before the ring's end,
// in space known free up to the next header, within the short lap, which
// counts them as one record); else it returns
// false, having written nothing, and Push goes on as for any record. Push
// calls it first, with nothing of its own live across the call, so that
// its common case keeps its frame (a ping-pong's latency moved 2-3 % when
// it grew). It stores the next record's header zeroed
// past the gap, then the gap's pad, then the record's header: the
// consumer, which reads the pad only after the record, finds it, and past
// it never reads a stale header. No zeroing or taking lines ahead: the
// record is mid-sized and in a stream.
func (p *Producer) pushGapped(hdr, payload []byte) bool {
	n := uint64(len(hdr)) + uint64(len(payload))
	at := dataOff(len(hdr))
	size := recordSize(n, at)
	off := p.pos & p.mask
	if !p.fits(n, off, size+gapLen) { // the record and its gap as one
		return false
	}
	p.copyIn(off+at, hdr, payload)
	if size+gapLen > p.lapRecord {
		p.lapBig = true
	}
	g := off + size
	*(*uint64)(unsafe.Add(p.base, (g+gapLen)&p.mask)) = 0
	if at == 8 {
		*(*uint32)(unsafe.Add(p.base, off+4)) = 0
	}
	release.Store32((*uint32)(unsafe.Add(p.base, g)), validBit|padBit|gapLen)
	release.Store32((*uint32)(unsafe.Add(p.base, off)), validBit|wideOf(at)|uint32(n))
	p.pos += size + gapLen
	release.Store64(p.headp, p.pos)
	return true
}

// copyIn writes a record's data, hdr then payload, at at, which is where
// the data of the record reserve placed for their total length starts.
func (p *Producer) copyIn(at uint64, hdr, payload []byte) {
	// In bounds: the record's start+recordSize(n) <= cap.
	d := unsafe.Add(p.base, at)
	if n := len(hdr); wordHeaders && n&7 == 4 && n <= maxWordHeader {
		// A 4-byte word and then 8-byte words, as am's immediate header is
		// encoded (wire.EncodeImmediate) just before it is pushed: copy's
		// 16-byte loads would each span two of those stores, which no x86
		// core forwards, and wait for them to reach the cache.
		h := unsafe.Pointer(unsafe.SliceData(hdr))
		*(*uint32)(d) = *(*uint32)(h)
		for i := 4; i < n; i += 8 {
			*(*uint64)(unsafe.Add(d, i)) = *(*uint64)(unsafe.Add(h, i))
		}
	} else {
		copy(unsafe.Slice((*byte)(d), len(hdr)), hdr)
	}
	copy(unsafe.Slice((*byte)(unsafe.Add(d, len(hdr))), len(payload)), payload)
}

// wordHeaders: copyIn may copy a header by unaligned word loads and stores,
// which these architectures allow at full speed (internal/wire's
// unalignedWords is the same set).
const wordHeaders = runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64"

// maxWordHeader is the longest header copyIn copies by words, in bytes: an
// immediate header with up to four arguments (mpiam's eager messages carry
// two); longer ones, rare, take copy.
const maxWordHeader = 36

// Filler writes a record's payload in place (PushFill).
type Filler interface {
	// Fill writes all of p, which it must not keep.
	Fill(p []byte)
}

// PushFill is Push with a payload of n bytes that f.Fill writes straight
// into the record, after hdr is copied: a caller that would otherwise build
// the payload in a buffer of its own first (packing non-contiguous data)
// saves that copy. f.Fill runs before the record is published, so the
// consumer never sees a partly filled record; if it panics, nothing is
// published and the ring stays sound. Results as Push's.
func (p *Producer) PushFill(hdr []byte, n int, f Filler) bool {
	if n < 0 || f == nil {
		return false
	}
	total := uint64(len(hdr)) + uint64(n)
	at := dataOff(len(hdr))
	start, ok := p.reserve(total, at)
	if !ok {
		return false
	}
	p.copyIn(start+at, hdr, nil)
	filled := false
	defer func() {
		if !filled {
			// f.Fill panicked, having written who knows what where the next
			// (shorter) record's successor header may go: the area is
			// zeroed again before the next push.
			p.zeroed, p.lapZeroed = p.pos, 0
		}
	}()
	f.Fill(unsafe.Slice((*byte)(unsafe.Add(p.base, start+at+uint64(len(hdr)))), n))
	filled = true
	p.publish(start, total, at)
	return true
}

// reserve finds room for a record of n bytes whose data starts at at past
// its header, at p.pos, and returns where its header goes (past a pad when
// one comes first: 0 after a pad to the ring's end, or the next line after
// a slot of pad); false when the ring has no room now, n is over
// MaxRecord, or the ring is corrupt. The record's slots and the next
// header's 8 bytes are zero on return. Its common case inlines;
// reserveSlow does the rest.
func (p *Producer) reserve(n, at uint64) (start uint64, ok bool) {
	size := recordSize(n, at)
	off := p.pos & p.mask
	if p.fits(n, off, size) {
		return off, true
	}
	return p.reserveSlow(n, at)
}

// fits is reserve's common case: a record of n bytes (size with its
// header, rounded) fits at off, p.pos's offset, before the ring's end,
// needing no pad (it has an odd number of slots, or off starts a line), in
// space known free up to the next record's header. p.err is nil when it
// holds: a corrupt producer's tail check fails (refreshTail).
func (p *Producer) fits(n, off, size uint64) bool {
	end := p.pos + size
	return n <= p.maxData && (size&slotLen != 0 || off&slotLen == 0) && off+size <= p.cap &&
		end+8-p.tail <= p.cap && (end <= p.lapEnd || size > p.lapRecord)
}

// reserveSlow is reserve past its common case: a record too large, a pad,
// a stale tail, a corrupt ring.
func (p *Producer) reserveSlow(n, at uint64) (start uint64, ok bool) {
	if n > p.maxData || p.err != nil {
		return 0, false
	}
	size := recordSize(n, at)
	off := p.pos & p.mask
	start = off
	if size&slotLen == 0 && off&slotLen != 0 {
		start += slotLen // a record of an even number of slots starts a line
	}
	base := p.pos &^ p.mask // where this lap of the whole ring started
	if size <= p.lapRecord && p.lapEnd <= base {
		// The first small record since a lap of the whole ring began:
		// the short lap again.
		p.lapEnd, p.lapBig = base+p.lap, false
	}
	switch {
	case start+size > p.cap:
		start = 0
		p.lapEnd, p.lapBig = base+p.cap+p.lap, false
	case p.pos+(start-off)+size > p.lapEnd && size <= p.lapRecord:
		if !p.lapBig && !p.lapPaused && p.wrapFree(off, size) {
			start = 0
			p.lapEnd, p.lapFails = base+p.cap+p.lap, 0
		} else {
			// Go on past it, and try again twice as far on.
			p.lapFails = min(p.lapFails+1, 20)
			p.lapEnd = min(p.pos+p.lap<<p.lapFails, base+p.cap)
		}
	}
	if p.err != nil {
		return 0, false // wrapFree found the tail corrupt
	}
	pad := (start - off) & p.mask
	need := pad + size + 8 // 8: the next record's header, which must be zero
	if p.pos+need-p.tail > p.cap && !p.refreshTail(need) {
		return 0, false
	}
	return start, true
}

// PauseLap pauses the short lap (SetLap) while on is true: small records
// then wrap only at the end of the data area, as without one. A caller
// whose records stream both ways between two cores pauses it, since the
// short lap slows such traffic (docs/performance.md, "A short lap for
// small records").
func (p *Producer) PauseLap(on bool) { p.lapPaused = on }

// wrapFree reports whether a record within the short lap (SetLap) goes
// back to the data area's start, after a pad from off, p.pos's offset, to
// the end: when the consumer is at most half a lap behind. The pad takes the
// rest of the ring's space until the consumer passes it, so wrapping while
// the consumer lags further would leave the producer less room than the
// queue already holds; then the record goes on past the lap, and the whole
// ring absorbs the burst. The consumer's tail is reloaded only when the
// last one seen says it lags, and reserveSlow spaces the tries out (twice as
// far each time the consumer is found lagging), so that a producer running
// ahead of a lagging consumer seldom takes the tail's cache line from it.
func (p *Producer) wrapFree(off, size uint64) bool {
	if p.pos-p.tail <= p.lap/2 {
		return true
	}
	return p.refreshTail(p.cap-off+size+8) && p.pos-p.tail <= p.lap/2
}

// publish publishes the record of n bytes whose data starts at at, written
// at start (reserve's), with the pad before it if there is one, and zeroes
// the area ahead when it runs short (zeroAhead).
func (p *Producer) publish(start, n, at uint64) {
	size := recordSize(n, at)
	off := p.pos & p.mask
	end := p.pos + ((start-off)&p.mask + size) // the next record's position, past the pad
	if size > p.lapRecord {
		p.lapBig = true
	}
	if end+8 > p.zeroed {
		p.zeroNext(start, at, end)
	}
	release.Store32((*uint32)(unsafe.Add(p.base, start)), validBit|wideOf(at)|uint32(n))
	if start != off {
		release.Store32((*uint32)(unsafe.Add(p.base, off)), validBit|padBit|uint32((start-off)&p.mask))
	}
	p.pos = end
	release.Store64(p.headp, end) // for Pending, which must not read the data area
	p.readyAhead(end, size)
}

// zeroNext writes the zeroes that the record at start (data at at) needs
// before it is published, where the area ahead is not zeroed (after records
// that skipped zeroing ahead, or a wrap): the next record's header at end
// (8 bytes: its header and, if it is wide, its zero word) and this record's
// own zero word if it is wide. Plain stores: the header's publication,
// which follows, orders them.
func (p *Producer) zeroNext(start, at, end uint64) {
	*(*uint64)(unsafe.Add(p.base, end&p.mask)) = 0
	if at == 8 {
		*(*uint32)(unsafe.Add(p.base, start+4)) = 0
	}
}

// Streaming tells the producer whether its records now go back to back
// (true: a run of sends with no poll between) or one at a time (false, the
// default). Zeroing the area ahead takes its cache lines from the consumer
// while the producer has nothing else to do, so that the next record's
// stores find them here, which shortens a ping-pong of records of a few
// hundred bytes to 4 KiB; in a stream it is a second pass of stores on the
// side that bounds the rate (docs/performance.md, "Zeroing ahead only
// between streams"). In a stream, records of more than smallRecord and at
// most streamRecord bytes skip it; the zeroes correctness needs are written
// all the same (zeroNext).
func (p *Producer) Streaming(on bool) {
	p.streaming, p.zeroAbove = on, bigRecord
	if on {
		p.zeroAbove = streamRecord
	}
}

// readyAhead readies the area past the record of size bytes that ends at
// end for the records to come, once it is published: it zeroes it ahead
// when that is due (zeroAheadDue), else, for a mid-sized record in a
// stream, asks for the lines of the record takeRecords ahead (takeAhead).
func (p *Producer) readyAhead(end, size uint64) {
	if p.zeroAheadDue(end, size) {
		p.zeroAhead(end, size)
	} else if p.streaming && size > smallRecord {
		p.takeAhead(end, size)
	}
}

// zeroAheadDue reports whether, after publishing a record of size bytes
// that ends at end, the area ahead is to be zeroed now (zeroAhead): after
// a big record, unless it is in a stream and at most streamRecord bytes;
// after a small one, when the zeroed area is short of Producer.ahead,
// unless the record is mid-sized in a stream (Streaming).
func (p *Producer) zeroAheadDue(end, size uint64) bool {
	return size > p.zeroAbove || (size <= smallRecord || !p.streaming) && p.zeroed < end+p.ahead
}

// streamRecord is the largest record, in bytes, that skips zeroing ahead
// in a stream: a 32 KiB payload and its headers (over shm, MPI sends larger
// messages by rendezvous while others are in flight). Zeroing twice a 4 to
// 32 KiB record ahead in a stream cost osu bw and bibw 6-23 %
// (docs/performance.md, "No zeroing ahead in a stream of records up to
// 32 KiB").
const streamRecord = 32<<10 + 256

// smallRecord is the record size, in bytes, up to which Push keeps the area
// ahead zeroed even in a stream (a stream of them fills lines fast enough
// that taking each line ahead pays).
const smallRecord = 256

// zeroAhead zeroes the area for the next records after the record of size
// bytes that ends at end, once published, so that taking these cache lines
// away from the consumer is off the critical path (the publishing store
// waits for every earlier store).
func (p *Producer) zeroAhead(end, size uint64) {
	if p.zeroed < end {
		p.zeroed = end // records that skipped zeroing ahead wrote zeroNext's words only
		if p.lapZeroed > end && end > (p.lapZeroed-1)&^p.mask {
			// A record at the start of a lap whose first bytes were
			// zeroed before the wrap (below).
			p.zeroed = p.lapZeroed
		}
	}
	if off := end & p.mask; size <= p.lapRecord && off < p.lap {
		// Within a short lap (SetLap): zero up to its end and, for the
		// records after the wrap, the next lap's first bytes, rather than
		// lines past the lap that its records do not use.
		if p.zeroed-end < p.ahead {
			p.zeroTo(min(end+2*p.ahead, end-off+p.lap, p.tail+p.cap))
		}
		if next := end - off + p.cap; p.lapZeroed < next+p.ahead {
			lo, hi := max(p.lapZeroed, next), min(next+p.ahead, p.tail+p.cap)
			if lo < hi {
				clear(p.data[lo-next : hi-next])
				p.lapZeroed = hi
			}
		}
		return
	}
	ahead := p.ahead
	if size > bigRecord {
		// Twice a big record ahead: the next one of its size finds its
		// lines here (a 4 KiB ping-pong over shm 0.46 -> 0.34 us); small
		// records keep the short margin, under which a stream of 1 KiB
		// ones is faster.
		ahead = max(ahead, min(2*size, p.cap/4))
	}
	if p.zeroed-end < ahead {
		p.zeroTo(min(end+2*ahead, p.tail+p.cap))
	}
}

// takeAhead asks for the cache lines where the record takeRecords records
// of size bytes past the one that ends at end would go, for writing
// (prefetchW, no stores), in a stream of records that skip zeroing ahead:
// the lines come while the producer fills the records before it, rather
// than one store at a time when it gets there. It stops at the end of the
// data area and asks for nothing beyond the space known free, whose lines
// the consumer may still be reading. It pays most where moving a line
// between cores is slow (docs/performance.md, "What the waiting side and
// the ring's size do").
func (p *Producer) takeAhead(end, size uint64) {
	if first, lines := p.takeSpan(end, size); lines > 0 {
		prefetchW(uintptr(unsafe.Add(p.base, first)), lines)
	}
}

// takeSpan is the area takeAhead asks for: the offset of its first line in
// the data area and how many lines (0: none).
func (p *Producer) takeSpan(end, size uint64) (first uint64, lines int) {
	from := end + (takeRecords-1)*size
	if from+size > p.tail+p.cap {
		return 0, 0
	}
	off := from & p.mask
	if off+size > p.lap && size <= p.lapRecord {
		off %= p.lap // about where the short lap (SetLap) puts it
	}
	first = off &^ (lineLen - 1)
	last := min(off+size, p.cap)
	return first, int((last - first + lineLen - 1) / lineLen)
}

// takeRecords is how many records ahead of the one just published
// takeAhead asks for lines.
const takeRecords = 4

// bigRecord is the record size, in bytes, above which Push keeps twice the
// record's size zeroed ahead rather than Producer.ahead.
const bigRecord = 4096

// Fence is a full memory barrier: every store before it, the records Push
// published included, is visible to other cores before any load after it.
// Push publishes with a release store only, so that the producer does not
// wait for the consumer's cache line; a caller that next checks whether the
// consumer sleeps (publish, check, wake against announce, recheck, sleep) must
// call Fence between the two, or it can read a stale "awake" while the record
// is still in its store buffer and the consumer, rechecking, does not see it
// yet. The barrier is a locked add to a word only this producer touches.
// Where the consumer's sleep path runs the heavy side of an asymmetric
// barrier (internal/membarrier: Enabled), the caller needs no Fence.
func (p *Producer) Fence() { p.fence.Add(0) }

// zeroTo zeroes the data area from p.zeroed up to position to, which must not
// pass p.tail+p.cap (free space only). Plain stores suffice: the consumer
// loads these words only after loading a header published later.
func (p *Producer) zeroTo(to uint64) {
	for p.zeroed < to {
		off := p.zeroed & p.mask
		n := min(to-p.zeroed, p.cap-off)
		clear(p.data[off : off+n])
		p.zeroed += n
	}
}

// refreshTail reloads the consumer's tail and reports whether need bytes are
// free past the producer's position.
func (p *Producer) refreshTail(need uint64) bool {
	t := p.tailp.Load()
	if t > p.pos || p.pos-t > p.cap || t&7 != 0 {
		p.err = fmt.Errorf("%w: consumer tail %d with producer at %d, capacity %d", ErrCorrupt, t, p.pos, p.cap)
		return false
	}
	p.tail = t
	return p.pos+need-t <= p.cap
}

// Err reports why Push failed for a record that fits: nil when the ring was
// merely full, an error wrapping ErrCorrupt when the consumer's tail is
// impossible.
func (p *Producer) Err() error { return p.err }

// Consumer is the receiving side of a ring. Its methods must be called by one
// goroutine at a time.
type Consumer struct {
	_       [64]byte // see Producer: a consumer and its producer are often allocated together
	data    []byte   // data area, len == capacity
	mask    uint64
	cap     uint64
	maxData uint64
	lim     uint64         // cap, or 0 once corrupt: Peek's common case then never passes
	head    uint64         // position of the next record
	cur     uint64         // size of the record returned by Peek, 0 if none
	base    unsafe.Pointer // &data[0]
	tailp   *atomic.Uint64
	headp   *atomic.Uint64 // the producer's published position (Pending)
	err     error
	_       [64]byte
}

// NewConsumer attaches the receiving side to the initialized ring in mem.
// Errors: ErrRegion.
func NewConsumer(mem []byte) (*Consumer, error) {
	c, err := Capacity(mem)
	if err != nil {
		return nil, err
	}
	return &Consumer{
		data:    mem[ControlLen : ControlLen+c : ControlLen+c],
		mask:    uint64(c - 1),
		cap:     uint64(c),
		lim:     uint64(c),
		maxData: uint64(MaxRecord(c)),
		tailp:   word(mem, offTail),
		headp:   word(mem, offHead),
		head:    word(mem, offTail).Load(),
		base:    unsafe.Pointer(&mem[ControlLen]),
	}, nil
}

// Peek returns the oldest record in place, without copying, or false when the
// ring is empty or corrupt (see Err). The record stays valid, and Peek keeps
// returning it, until Advance. The caller must not write to it. It does not
// allocate.
func (c *Consumer) Peek() ([]byte, bool) {
	if rec := c.peekRecord(); rec != nil {
		return rec, true
	}
	return c.peekSlow()
}

// peekRecord is Peek's common case, inlined: the record at the head when it
// is a whole record in bounds with no pad before it, else nil (an empty
// ring, a pad, a corrupt header or ring: peekSlow). A record of no bytes is
// a non-nil empty slice.
func (c *Consumer) peekRecord() []byte {
	off := c.head & c.mask
	w := atomic.LoadUint32((*uint32)(unsafe.Add(c.base, off)))
	// A record's length; for a header without the valid bit or with the
	// pad bit (and for 0) a value over any maxData: one test for both.
	// headerOff and recordSize are written out: calling them would take
	// this function over the inlining budget.
	n, start := uint64(w&^wideBit-validBit), off+4+uint64(w&wideBit)>>27
	if end := (start + n + slotLen - 1) &^ (slotLen - 1); n <= c.maxData && end <= c.lim {
		c.cur = end - off
		return unsafe.Slice((*byte)(unsafe.Add(c.base, start)), n)
	}
	return nil
}

// empty reports whether the header at the head is zero: nothing has been
// published there yet.
func (c *Consumer) empty() bool {
	return atomic.LoadUint32((*uint32)(unsafe.Add(c.base, c.head&c.mask))) == 0
}

// peekSlow is Peek for an empty ring, a pad, a corrupt header or a corrupt
// ring.
func (c *Consumer) peekSlow() ([]byte, bool) {
	if c.err != nil {
		return nil, false
	}
	off := c.head & c.mask
	w := atomic.LoadUint32((*uint32)(unsafe.Add(c.base, off)))
	if w == 0 {
		return nil, false
	}
	for pads := 0; w&padBit != 0; pads++ {
		// A pad: to the end of the data area (the next record is at 0),
		// one slot (the next record starts a line), or a gap after a
		// record (Producer.pushGapped). At most two in a row: a gap, then
		// a slot or the end.
		pad := uint64(w & lenMask)
		if w&^lenMask != validBit|padBit || pads == 2 ||
			!(pad == c.cap-off && off != 0 || pad == slotLen && off&slotLen != 0 || pad == gapLen && off+pad <= c.cap) {
			c.fail(off, w)
			return nil, false
		}
		c.head += pad
		off = c.head & c.mask
		w = atomic.LoadUint32((*uint32)(unsafe.Add(c.base, off)))
		if w == 0 {
			// Past a gap, the next record not yet published (before a
			// pad to the end or of a slot, impossible for a correct
			// producer, which publishes the record before that pad).
			return nil, false
		}
	}
	n, at := uint64(w&lenMask), headerOff(w)
	size := recordSize(n, at)
	if w&^(lenMask|wideBit) != validBit || n > c.maxData || off+size > c.cap {
		c.fail(off, w)
		return nil, false
	}
	c.cur = size
	// In bounds: off+size <= cap was checked above.
	return unsafe.Slice((*byte)(unsafe.Add(c.base, off+at)), n), true
}

func (c *Consumer) fail(off uint64, w uint32) {
	c.lim = 0
	c.err = fmt.Errorf("%w: record header %#x at offset %d (capacity %d, max record %d)", ErrCorrupt, w, off, c.cap, c.maxData)
}

// Advance releases the record returned by the last Peek, making its space
// available to the producer. Without a preceding Peek that returned a record it
// does nothing.
func (c *Consumer) Advance() {
	if c.cur != 0 {
		c.advance()
	}
}

// advance is Advance after a Peek that returned a record.
func (c *Consumer) advance() {
	c.head += c.cur
	c.cur = 0
	release.Store64(tailPtr(c.tailp), c.head)
}

// Receiver takes the records Take hands over (transport.Receiver satisfies it).
type Receiver interface {
	// Deliver gets one record, in place; it is valid only until Deliver returns.
	Deliver(src int, rec []byte)
}

// ReceiverOf caches the conversion of a caller's receiver to Receiver: Of
// returns the Receiver for r, converting only when r differs from the last
// one it was given. The zero value is ready to use.
type ReceiverOf[R Receiver] struct {
	last R
	conv Receiver
}

// Of returns r as a Receiver. r is compared with the last one bit for bit
// (for an interface type, its method table and data words), never with ==,
// which would panic on a receiver whose dynamic type is not comparable;
// receivers of another size than one or two words are converted every time.
func (o *ReceiverOf[R]) Of(r R) Receiver {
	if o.conv == nil || !sameWords(&r, &o.last) {
		o.last, o.conv = r, r
	}
	return o.conv
}

// sameWords reports whether *a and *b hold the same bits, for values of one
// or two words; false for other sizes.
func sameWords[R any](a, b *R) bool {
	const word = unsafe.Sizeof(uintptr(0))
	switch unsafe.Sizeof(*a) {
	case word:
		return *(*uintptr)(unsafe.Pointer(a)) == *(*uintptr)(unsafe.Pointer(b))
	case 2 * word:
		return *(*[2]uintptr)(unsafe.Pointer(a)) == *(*[2]uintptr)(unsafe.Pointer(b))
	}
	return false
}

// BurstMax is the most records Take hands over at once from a streaming ring:
// enough that a waiter's loop (its condition, the poll's bookkeeping) runs
// once per window of small messages rather than every few (osu bw over shm
// 8-64 B +6-8 % against 8), few enough that a poll moves on to the other
// peers' rings within a few microseconds.
const BurstMax = 32

// Take hands records of c to r.Deliver(src, rec), in place, advancing past each,
// and returns how many (at most max). When *streak is false (the last look
// found the ring empty) it hands over one and returns: looking again at once
// would read the next record's cache line, which the producer holds (it zeroes
// ahead), and that miss would delay the caller's answer to the record just
// handled (a ping-pong's critical path). When *streak is true (records are
// streaming in) it hands over up to BurstMax, and before handing over each
// record of at least prefetchAfter bytes, or one whose successor starts a
// page, it prefetches the first two lines of the record after it, so that
// their transfer from the producer's core overlaps the handler (osu bw over
// shm at 1/2/4 KiB +9/+10/+28 %; the hardware's stream prefetcher stops at
// page boundaries, and follows a stream of small records within a page).
// It sets *streak to whether its last look found a record. The space of
// records under prefetchAfter bytes goes back to the producer once per
// call (one store to the tail's line, which the producer reads when it
// runs short), that of larger ones after each. When it returns 0,
// Err tells a corrupt ring from an empty one. r is called through its own
// method table: a caller holding another interface type with the same
// method (transport.Receiver) converts it once and keeps the result
// (ReceiverOf), since a conversion between interface types looks the table
// up at run time, and a generic Take would call through a wrapper per record.
func Take(c *Consumer, r Receiver, src int, streak *bool, max int) int {
	n := 0
	streaming := *streak // in a register across the calls to Deliver
	freed := true        // the tail is c.head's
	limit := min(max, BurstMax)
	for n < limit {
		rec := c.peekRecord()
		if rec == nil {
			if c.empty() {
				// A waiter's poll finds the ring empty: told here,
				// without peekSlow's call. (A corrupt ring has its
				// error already, which Err reports.)
				streaming = false
				break
			}
			var ok bool
			if rec, ok = c.peekSlow(); !ok {
				streaming = false
				break
			}
		}
		next := c.head + c.cur
		if streaming && (c.cur >= prefetchAfter || next&(pageLen-1) < 2*lineLen) {
			// Small records stream through lines that the hardware's
			// prefetcher follows within a page: the next record's lines
			// are asked for after a large record and where the next one
			// starts a page.
			prefetch2(uintptr(unsafe.Add(c.base, next&c.mask)), uintptr(unsafe.Add(c.base, (next+lineLen)&c.mask)))
		}
		r.Deliver(src, rec)
		// Advance. A large record's space goes back to the producer at
		// once, so that a stream of them keeps both sides busy; small
		// ones' once for the burst, below.
		freed = c.cur >= prefetchAfter
		c.head, c.cur = next, 0
		if freed {
			release.Store64(tailPtr(c.tailp), next)
		}
		n++
		if !streaming {
			streaming = true
			break
		}
	}
	*streak = streaming
	if !freed {
		release.Store64(tailPtr(c.tailp), c.head)
	}
	return n
}

// prefetchAfter is the record size, in bytes, from which a streaming
// consumer prefetches the next record's first lines (Take); pageLen is the
// page size the hardware's stream prefetcher stops at.
const (
	prefetchAfter = 512
	pageLen       = 4096
)

// Err reports why Peek returned false: nil when the ring was merely empty, an
// error wrapping ErrCorrupt when the producer wrote an impossible record header.
// Once corrupt, a Consumer stays so.
func (c *Consumer) Err() error { return c.err }

// MaxRecord is the largest record the ring carries, in bytes.
func (c *Consumer) MaxRecord() int { return int(c.maxData) }

// Pending reports whether a record (or a pad before one) appears to wait: the
// producer's published position is past the consumer's published tail.
// Unlike Peek it reads only the control block's two words, so it may run on a
// goroutine other than the consumer's, for example one about to sleep; the
// answer may be stale either way and is only a hint. (It used to read the
// header word at the tail, which the producer may already be overwriting with
// a later record's data once the consumer has moved on: a read racing a plain
// write.)
func (c *Consumer) Pending() bool {
	return c.headp.Load() != c.tailp.Load()
}
