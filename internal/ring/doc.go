// Package ring is a single-producer single-consumer queue of variable-size
// records over a caller-supplied []byte region: ordinary heap memory (ranks as
// goroutines) or a MAP_SHARED mapping that two processes share (package shm).
//
// It is designed for latency first. The consumer polls the header of the
// next record itself, not a head index that the producer writes elsewhere,
// so a small message moves one cache line from the producer's core to the
// consumer's, and a stream of the smallest ones half a line each. The consumer's freed position (the tail) sits on a cache
// line of its own and is read by the producer only when its cached copy says
// the ring is full.
//
// # Use
//
//	mem, err := ring.Alloc(64 << 10)     // a heap region, already initialized; or, for
//	err = ring.Init(region)              // a region of a shared mapping: once, before either side attaches
//	p, err := ring.NewProducer(mem)      // in the sending process
//	c, err := ring.NewConsumer(mem)      // in the receiving process
//
//	p.Push(hdr, payload)                 // false: full, try again after the consumer advances
//	p.Fence()                            // only before checking whether the consumer sleeps, and only
//	                                     // where the consumer's sleep path has no membarrier.Heavy
//
//	for {
//		rec, ok := c.Peek()              // rec points into mem: zero copy
//		if !ok {
//			if err := c.Err(); err != nil { ... } // the producer corrupted the ring
//			break
//		}
//		handle(rec)
//		c.Advance()                      // rec is invalid from here on
//	}
//
// Exactly one goroutine pushes and exactly one goroutine peeks and advances
// (they may be the same one); Consumer.Pending, a hint for a goroutine about to
// sleep, may run anywhere. A producer must start on a freshly initialized
// ring; its position lives in the Producer value, and it also publishes it
// (the head word) after every record for Pending, which thus reads the
// control block alone, never the data area the producer may be writing.
//
// # Layout
//
// The region starts with a 256-byte control block: bytes 0..63 hold the magic
// word and the capacity (written by Init, read-only afterwards); bytes 64..71
// the producer's published position (head), alone on line 1; bytes 128..255
// hold the consumer's tail, a free-running byte position, alone on its cache
// line pair (adjacent-line prefetch pulls lines in pairs). The data area of
// Capacity bytes, a power of two, follows at byte 256.
//
// Producer and consumer positions are free-running uint64 byte counts; a
// position's offset in the data area is pos & (Capacity-1). Space goes in
// slots of 32 bytes. A record at position pos is a 4-byte little-endian
// header followed by its data, which starts 4 bytes in, or 8 when the
// header part the producer copies first (Push's hdr) has a length of 0 to 3
// mod 8; so the payload after a header part of a multiple of 4 bytes is
// always 8-byte aligned. The record is padded to whole slots:
//
//	header: bits 0..28  data length in bytes (for a pad: the bytes it covers)
//	        bit  29     wide: the data starts 8 bytes in (bytes 4..7 are zero)
//	        bit  30     valid (so that an empty record is not the zero word)
//	        bit  31     pad: skip the bytes it covers; the next record follows
//
// A record of up to 28 data bytes (4 in) takes one slot, half a cache line:
// two such records, an 8-byte MPI message each, cross from the producer's
// cache to the consumer's in one transfer. A record of an even number of
// slots starts a line (after a pad of one slot when the position is
// mid-line), so that no record spans more lines than its size needs: one of
// up to 60 bytes is one line and one transfer, not two. Records are
// contiguous: a record that would cross the end of the data area is
// preceded by a pad to the end and starts at offset 0 instead.
//
// A producer with a short lap (Producer.SetLap) wraps so earlier for small
// records: one of at most a quarter of the lap that would end past it goes
// to offset 0 after a pad to the end, when the consumer is at most half a
// lap behind, so that a stream of them keeps to a few KiB of lines that stay
// in both cores' first-level caches. The frontier of zeroed words (below)
// then stops at the lap's end and goes on at the next lap's start. The
// consumer cannot tell such a pad from the usual one and needs none of it.
//
// # Why the consumer never sees a stale header
//
// The consumer polls the word at its position; it must read either zero
// (nothing yet) or a header published for this lap, never an old header or old
// payload bytes from an earlier lap. The producer therefore makes sure, before
// it publishes a record, that the 8 bytes right after it, where the next
// record's header goes, are zero (and so are bytes 4..7 of a wide record).
// Usually they already are: the producer keeps every word from its position
// up to a frontier zeroed, the frontier within free space (at most
// tail+Capacity); where the frontier does not reach that far, it writes
// those words itself before the header (zeroNext). Push writes the record's
// data, then publishes its header with an atomic store; the consumer reads
// the next word only after it has seen this header, so it reads zero or a
// newer header.
//
// The frontier is a matter of speed, not of correctness. It is pushed ahead
// after publishing (a few hundred bytes at a time), not before: an atomic
// store on amd64 waits for every earlier store, and taking the next cache
// line away from the consumer, which it may have read or prefetched, would
// otherwise delay the message. After a record of more than 4 KiB the
// frontier goes at least twice that record's size ahead, so that the next
// such record finds its lines already this core's rather than waiting for
// each to come back from the consumer's cache as it is written. Zeroing
// ahead is a second pass of stores over the ring, paid for in idle time
// between messages but not in a stream, where the producer bounds the rate:
// when its caller says records go back to back (Producer.Streaming),
// records of more than 256 bytes and at most 4 KiB skip it, and the
// producer instead asks for the lines of the record four ahead for writing
// (a prefetch, PREFETCHW on amd64, no stores), within the space it knows
// free so that no line the consumer may still read is taken. The producer
// keeps 8 bytes of slack so that the next header never lands on unconsumed
// data.
//
// # Memory ordering
//
// Headers and the tail are accessed with sync/atomic, which the Go
// memory model makes sequentially consistent: a store synchronizes with the
// load that observes it. Data and zeroed words are plain stores. So:
//
//   - The producer's plain writes of a record's data (and of the zeroes after
//     it) happen before its atomic store of the header; the consumer's atomic
//     load that sees that header happens before its plain reads of the data and
//     its load of the next header (publish/acquire).
//   - The consumer's reads of a record happen before its atomic store of the
//     tail past it; the producer's atomic load of that tail happens before it
//     writes or zeroes the space again (release/acquire in the other direction).
//
// Between processes the same instructions carry the same guarantees on the
// hardware (on amd64 an atomic store is XCHG, a full fence, and loads are
// ordered by TSO; the Go compiler does not move memory operations across
// atomic operations). The race detector does not track mmap'd memory, so it
// checks this reasoning only for rings on the heap, where the tests run it.
//
// # Corruption
//
// In shared memory the other side may be buggy. The consumer checks every
// header (valid bit, length against the largest record, record within the
// data area, a pad of one slot mid-line or to the end exactly) and the producer checks the tail it loads against its
// own position; a bad value makes the side stop with ErrCorrupt (see Err)
// rather than read out of bounds or panic.
package ring
