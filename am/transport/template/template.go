// Package template is the starting point for a new amgo network: the
// simplest transport that passes the conformance suite, written to be copied
// and edited (docs/porting.md walks through it). Its "network" is memory:
// ranks are goroutines of one process, and each rank's inbox is a byte queue
// behind a mutex. Nothing here is fast; everything here is a contract.
//
// To port a network: copy this directory to am/transport/<name>, rename the
// package and the registered name, and replace the four marked places
// ("NETWORK:") with your network's calls: open/attach (New), transmit (Send),
// receive (Poll), sleep until traffic (Wait). Keep the error values, the
// concurrency rules and the zero-allocation Send/Poll.
//
// Registered as "template". Its ranks must live in one process, so open it
// with transport.Open("template", b, nil) from n goroutines that share an
// in-process bootstrap (transporttest.NewBootstraps), as its tests do; a real
// network is opened by job.Open in each process under amrun.
//
// Options: queue_bytes, the most bytes one rank's inbox holds before Send
// returns transport.ErrWouldBlock (default 256 KiB).
package template

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/amgo-hpc/amgo/am/transport"
)

// Name is the network's registered name.
const Name = "template"

func init() {
	// One name per network; job.Open and amrun pick it with AMGO_TRANSPORT.
	transport.Register(Name, New)
}

// DefaultQueueBytes is the default capacity of a rank's inbox.
const DefaultQueueBytes = 256 << 10

// maxPacket is the largest packet Send takes. A real network says what its
// hardware or protocol allows (a UDP datagram, an MTU, a ring slot); am needs
// at least wire.MaxHeaderLen + 512 bytes (GASNet's minimum medium payload).
const maxPacket = 64 << 10

// Transport is one rank's attachment. It implements transport.Transport and
// transport.Putter.
type Transport struct {
	rank   int
	job    *job
	limit  int
	closed atomic.Bool

	// The inbox: senders append records (src, length, packet) under mu;
	// Poll swaps the whole queue out and delivers from it without the lock.
	mu   sync.Mutex
	in   []byte
	bell chan struct{} // capacity 1: "something arrived", for Wait

	// Owned by the polling goroutine (Poll runs on one goroutine at a time).
	cur  []byte
	head int
}

// job is what the ranks of one in-process job share. NETWORK: a real network
// has no such object; each rank finds its peers' addresses through the
// bootstrap instead (see New).
type job struct {
	ranks []*Transport
}

var (
	jobsMu sync.Mutex
	jobs   = map[string]*job{}
)

// New opens this rank's attachment (the transport.Factory). Every rank of the
// job calls it at the same time: it uses the bootstrap's fence.
//
// The address exchange is the pattern every network follows: publish your
// address under a key prefixed with your rank, Fence, read the others'.
// Here the "address" only names the in-process job and rank.
func New(b transport.Bootstrap, opts map[string]string) (transport.Transport, error) {
	limit := DefaultQueueBytes
	if s := opts["queue_bytes"]; s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < maxPacket+8 {
			return nil, fmt.Errorf("template: bad queue_bytes %q: want a byte count of at least %d", s, maxPacket+8)
		}
		limit = v
	}
	rank, size := b.Rank(), b.Size()
	// NETWORK: open your endpoint here (socket, device context, mapping)
	// and learn its address.
	jobsMu.Lock()
	j := jobs[b.JobID()]
	if j == nil {
		j = &job{ranks: make([]*Transport, size)}
		jobs[b.JobID()] = j
	}
	if len(j.ranks) != size || j.ranks[rank] != nil {
		jobsMu.Unlock()
		return nil, fmt.Errorf("template: rank %d of job %q (size %d) opened twice or with another size", rank, b.JobID(), size)
	}
	t := &Transport{rank: rank, job: j, limit: limit, bell: make(chan struct{}, 1)}
	j.ranks[rank] = t
	jobsMu.Unlock()

	addr := fmt.Sprintf("inproc:%s/%d", b.JobID(), rank)
	if err := b.Put(fmt.Sprintf("amgo.%s.%d", Name, rank), addr); err != nil {
		return nil, fmt.Errorf("template: rank %d: publish address: %w", rank, err)
	}
	if err := b.Fence(); err != nil {
		return nil, fmt.Errorf("template: rank %d: fence: %w", rank, err)
	}
	for r := 0; r < size; r++ {
		got, err := b.Get(fmt.Sprintf("amgo.%s.%d", Name, r))
		if err != nil {
			return nil, fmt.Errorf("template: rank %d: address of rank %d: %w", rank, r, err)
		}
		// NETWORK: resolve or connect lazily to got here.
		if want := fmt.Sprintf("inproc:%s/%d", b.JobID(), r); got != want {
			return nil, fmt.Errorf("template: rank %d: rank %d published %q, want %q", rank, r, got, want)
		}
	}
	// After the fence every rank has registered itself in j; forget the job
	// name so that a later job may reuse it.
	jobsMu.Lock()
	if jobs[b.JobID()] == j {
		delete(jobs, b.JobID())
	}
	jobsMu.Unlock()
	return t, nil
}

// Rank is this rank, 0..Size-1.
func (t *Transport) Rank() int { return t.rank }

// Size is the number of ranks in the job.
func (t *Transport) Size() int { return len(t.job.ranks) }

// Caps: this network is ordered and reliable (a mutex-protected FIFO loses
// nothing), offers Put (every rank shares the address space) and wakes Wait.
// A network that may lose or reorder sets Ordered or Reliable false and am
// wraps it in its reliability layer.
func (t *Transport) Caps() transport.Caps {
	return transport.Caps{Name: Name, Ordered: true, Reliable: true, MaxPacket: maxPacket, Put: true, Wakeup: true}
}

// Send appends one packet to dst's inbox. It never blocks: a full inbox
// returns transport.ErrWouldBlock and am polls and retries. hdr and payload
// are copied before Send returns (the caller reuses them). Once the queue has
// grown to its working size, Send allocates nothing.
func (t *Transport) Send(dst int, hdr, payload []byte) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if uint(dst) >= uint(len(t.job.ranks)) {
		return transport.PeerErrorf(dst, "template: send from rank %d to rank %d of %d", t.rank, dst, len(t.job.ranks))
	}
	n := len(hdr) + len(payload)
	if n > maxPacket {
		return fmt.Errorf("template: send %d bytes to rank %d, max %d: %w", n, dst, maxPacket, transport.ErrTooLarge)
	}
	d := t.job.ranks[dst]
	if d.closed.Load() {
		// NETWORK: every error about a peer is a *transport.PeerError naming
		// it: package am learns from its Rank which rank failed
		// (docs/porting.md, "Failures").
		return transport.PeerErrorf(dst, "template: rank %d has closed", dst)
	}
	// NETWORK: hand hdr and payload to the network here (gather, no copy
	// into one buffer if the network takes an iovec).
	d.mu.Lock()
	if len(d.in) > 0 && len(d.in)+8+n > d.limit {
		d.mu.Unlock()
		return transport.ErrWouldBlock
	}
	d.in = binary.LittleEndian.AppendUint32(d.in, uint32(t.rank))
	d.in = binary.LittleEndian.AppendUint32(d.in, uint32(n))
	d.in = append(append(d.in, hdr...), payload...)
	d.mu.Unlock()
	select { // wake dst if it sleeps in Wait; never block
	case d.bell <- struct{}{}:
	default:
	}
	return nil
}

// Poll hands up to max packets to r, in place: each pkt slice points into the
// queue and is valid only during Deliver. It never blocks and allocates
// nothing once the queue has grown.
func (t *Transport) Poll(r transport.Receiver, max int) (int, error) {
	if t.closed.Load() {
		return 0, transport.ErrClosed
	}
	if t.head == len(t.cur) {
		// NETWORK: receive here (read a socket, consume a completion queue).
		t.mu.Lock()
		t.cur, t.in = t.in, t.cur[:0]
		t.head = 0
		t.mu.Unlock()
	}
	n := 0
	for n < max && t.head < len(t.cur) {
		src := int(binary.LittleEndian.Uint32(t.cur[t.head:]))
		size := int(binary.LittleEndian.Uint32(t.cur[t.head+4:]))
		pkt := t.cur[t.head+8 : t.head+8+size]
		t.head += 8 + size
		r.Deliver(src, pkt)
		n++
	}
	return n, nil
}

// pending reports whether a packet waits (read by Wait without the poll's state).
func (t *Transport) pending() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.in) > 0
}

// Wait sleeps until a sender rings this rank's bell or d passes. A spurious
// early return is allowed; sleeping through an arrival is not (Caps.Wakeup).
func (t *Transport) Wait(d time.Duration) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if t.pending() {
		return nil
	}
	// NETWORK: block in epoll/ppoll, a futex or the device's event channel.
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-t.bell:
	case <-tm.C:
	}
	return nil
}

// Put copies data to addr in rank dst's memory, which dst registered with am
// and named to this rank (a Store's destination). In one process that is a
// plain copy; a real network does RDMA, process_vm_writev, or streams the data
// for the receiver to place (transport.PutTargeter).
func (t *Transport) Put(dst int, addr uintptr, data []byte) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if uint(dst) >= uint(len(t.job.ranks)) {
		return transport.PeerErrorf(dst, "template: put from rank %d to rank %d of %d", t.rank, dst, len(t.job.ranks))
	}
	if t.job.ranks[dst].closed.Load() {
		// NETWORK: every error about a peer is a *transport.PeerError naming
		// it: package am learns from its Rank which rank failed
		// (docs/porting.md, "Failures").
		return transport.PeerErrorf(dst, "template: rank %d has closed", dst)
	}
	if len(data) == 0 {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr)) // dst keeps the memory alive and pinned
	copy(unsafe.Slice((*byte)(p), len(data)), data)
	return nil
}

// Close detaches the rank: its methods return transport.ErrClosed from now
// on and its peers' Sends return a *transport.PeerError. Closing twice is a no-op.
func (t *Transport) Close() error {
	// NETWORK: tell peers this is a clean close (tcp sends a goodbye) so
	// that they do not take it for a crash, then release resources.
	t.closed.Store(true)
	return nil
}

var _ transport.Putter = (*Transport)(nil)
