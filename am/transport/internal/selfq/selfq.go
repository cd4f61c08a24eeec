// Package selfq is the queue of the packets a rank sends to itself, for
// networks that do not carry them over the wire (tcp, xdp): senders append
// to one buffer under a lock; the poller swaps it with a second and hands
// the packets up from that one without the lock, so a packet stays put
// while its handler runs.
package selfq

import (
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/am/transport"
)

// Queue is one rank's self-sends. The zero value is ready.
type Queue struct {
	mu   sync.Mutex
	in   []byte // length-prefixed packets appended by Push
	cur  []byte // the poller's: packets being handed up
	head int    // next packet in cur
	n    atomic.Int64
}

// Push appends a packet (hdr then payload) unless the queue is not empty
// and would then hold more than limit bytes: false then (the caller's
// ErrWouldBlock). Safe for concurrent use.
func (q *Queue) Push(hdr, payload []byte, limit int) bool {
	n := len(hdr) + len(payload)
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.in) > 0 && len(q.in)+4+n > limit {
		return false
	}
	q.in = binary.LittleEndian.AppendUint32(q.in, uint32(n))
	q.in = append(append(q.in, hdr...), payload...)
	q.n.Store(int64(len(q.in)))
	return true
}

// Pending reports whether pushed packets wait that the poller has not
// taken yet (one it took and has not handed up, for want of room in max,
// goes at its next Deliver). Safe for concurrent use.
func (q *Queue) Pending() bool { return q.n.Load() > 0 }

// Deliver hands up to max packets to r as from rank self, in the order
// pushed, and returns how many and their bytes. One goroutine at a time
// (the poller).
func (q *Queue) Deliver(r transport.Receiver, self, max int) (n, bytes int) {
	if q.head == len(q.cur) && q.n.Load() > 0 {
		q.mu.Lock()
		q.cur, q.in = q.in, q.cur[:0]
		q.head = 0
		q.n.Store(0)
		q.mu.Unlock()
	}
	for n < max && q.head < len(q.cur) {
		l := int(binary.LittleEndian.Uint32(q.cur[q.head:]))
		pkt := q.cur[q.head+4 : q.head+4+l]
		q.head += 4 + l
		r.Deliver(self, pkt)
		n, bytes = n+1, bytes+l
	}
	if q.head == len(q.cur) {
		q.cur, q.head = q.cur[:0], 0
	}
	return n, bytes
}
