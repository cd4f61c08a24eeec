package loop

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/amgo-hpc/amgo/am/transport"
	settings "github.com/amgo-hpc/amgo/am/transport/internal/opts"
	"github.com/amgo-hpc/amgo/internal/cacheline"
	"github.com/amgo-hpc/amgo/internal/membarrier"
	"github.com/amgo-hpc/amgo/internal/memcopy"
	"github.com/amgo-hpc/amgo/internal/ring"
)

func init() {
	transport.Register("loop", func(b transport.Bootstrap, opts map[string]string) (transport.Transport, error) {
		if b.Size() != 1 {
			return nil, fmt.Errorf("loop: the factory opens only jobs of size 1 (this one has %d ranks); use loop.NewJob for ranks as goroutines", b.Size())
		}
		ts, err := NewJob(1, opts)
		if err != nil {
			return nil, err
		}
		return ts[0], nil
	})
}

// Defaults.
const (
	// DefaultRingBytes is the data area of each directed ring, in bytes.
	DefaultRingBytes = 64 << 10
	// DefaultSpin is how long Wait polls before it parks.
	DefaultSpin = 5 * time.Microsecond
)

// Transport is one rank of an in-process job. It implements
// transport.Transport and transport.Putter.
type Transport struct {
	// Read by this rank's senders and its peers' senders; written rarely.
	rank int
	job  *job
	out  []*ring.Producer // to each rank; nil until the first Send to it
	// The inbound rings, in the order their producers made them (connect):
	// act has a slot per rank, act[:nAct] are immutable once published, and
	// actMu orders the producers that add one.
	act    []inbound
	nAct   atomic.Int32
	actMu  sync.Mutex
	spin   time.Duration
	ready  func() bool
	woken  atomic.Bool // Wake was called: the next look of Wait returns
	bell   bell
	fence  bool // see shm.Transport.fence
	closed atomic.Bool

	// Written by every Poll: on cache lines of its own, so that peers' Sends
	// (which read bell and closed) do not pull the line back and forth.
	_    [128]byte
	next int // Poll's round-robin position
	// streak[src]: the last look at src's ring found a record (see Poll).
	streak []bool
	// recv is Poll's receiver as a ring.Receiver, converted once.
	recv ring.ReceiverOf[transport.Receiver]
	_    [88]byte
}

type job struct {
	ranks     []*Transport
	caps      transport.Caps
	ringBytes int
}

// inbound is a ring into a rank: its source and consumer.
type inbound struct {
	src int
	c   *ring.Consumer
}

// NewJob opens the n ranks of a job in this process; element i is rank i.
// opts: see the package documentation. Errors: n < 1 and bad options.
func NewJob(n int, opts map[string]string) ([]transport.Transport, error) {
	if n < 1 {
		return nil, fmt.Errorf("loop: job of %d ranks", n)
	}
	// Options come from opts only (no environment variables: "" below).
	ringBytes, err := settings.Bytes(opts, "ring_bytes", "", DefaultRingBytes, ring.MinCapacity, 1<<30)
	if err != nil {
		return nil, fmt.Errorf("loop: %w", err)
	}
	spin, err := settings.Duration(opts, "spin", "", DefaultSpin)
	if err != nil {
		return nil, fmt.Errorf("loop: %w", err)
	}
	// Rings are made by their first Send (connect): a job of n ranks in
	// which each talks to a few peers costs a few rings per rank, not n.
	c := ring.MinCapacity // ring_bytes rounded up to a power of two, as ring.Alloc does
	for c < ringBytes {
		c *= 2
	}
	j := &job{ranks: make([]*Transport, n), ringBytes: c}
	for r := range j.ranks {
		t := cacheline.New[Transport]() // ranks are goroutines of one process: no shared lines
		*t = Transport{rank: r, job: j, out: cacheline.Slice[*ring.Producer](n), act: cacheline.Slice[inbound](n),
			streak: cacheline.Slice[bool](n), spin: spin, bell: bell{ch: make(chan struct{}, 1)}, fence: !membarrier.Enabled()}
		t.ready = t.arrived
		j.ranks[r] = t
	}
	j.caps = transport.Caps{Name: "loop", Ordered: true, Reliable: true,
		MaxPacket: ring.MaxRecord(c), QueueBytes: c, Put: true, Get: true, Wakeup: true, Fill: true,
		BufferBytes: c} // as shm: a peer's buffer as large as its ring
	ts := make([]transport.Transport, n)
	for i, t := range j.ranks {
		ts[i] = t
	}
	return ts, nil
}

// Rank is this rank, 0..Size-1.
func (t *Transport) Rank() int { return t.rank }

// Size is the number of ranks in the job.
func (t *Transport) Size() int { return len(t.job.ranks) }

// Caps: ordered, reliable, with wake-up, Put and Get; MaxPacket is about half of
// ring_bytes.
func (t *Transport) Caps() transport.Caps { return t.job.caps }

// Send copies hdr and payload into the ring to dst and wakes dst if it is
// parked in Wait. It does not allocate. Errors: transport.ErrTooLarge,
// transport.ErrWouldBlock (ring full: poll and retry), transport.ErrPeer (dst
// out of range or closed), transport.ErrClosed.
func (t *Transport) Send(dst int, hdr, payload []byte) error {
	if uint(dst) < uint(len(t.out)) {
		// outTo's and pushed's common case in this frame: a connected,
		// open peer whose ring takes the record.
		if out := t.out[dst]; out != nil && !t.closed.Load() && len(hdr)+len(payload) <= t.job.caps.MaxPacket {
			if d := t.job.ranks[dst]; !d.closed.Load() && out.Push(hdr, payload) {
				if t.fence {
					out.Fence() // the record visible before the sleep check (ring.Producer.Fence)
				}
				d.bell.ring()
				return nil
			}
		}
	}
	// Everything else, a full ring included, which this push tries again
	// and reports.
	d, out, err := t.outTo(dst, len(hdr)+len(payload))
	if err != nil {
		return err
	}
	return t.pushed(d, out, out.Push(hdr, payload))
}

// SendFill implements transport.FillSender: Send with the payload of n
// bytes written by f straight into the ring's record. Errors as Send's.
func (t *Transport) SendFill(dst int, hdr []byte, n int, f transport.Filler) error {
	if n < 0 || f == nil {
		return fmt.Errorf("loop: SendFill of %d bytes with filler %v", n, f)
	}
	d, out, err := t.outTo(dst, len(hdr)+n)
	if err != nil {
		return err
	}
	return t.pushed(d, out, out.PushFill(hdr, n, f))
}

// outTo checks a packet of n bytes to dst and returns dst's transport and
// the ring to it (connect). Errors as Send's.
func (t *Transport) outTo(dst, n int) (*Transport, *ring.Producer, error) {
	if t.closed.Load() {
		return nil, nil, transport.ErrClosed
	}
	if uint(dst) >= uint(len(t.out)) {
		return nil, nil, transport.PeerErrorf(dst, "loop: send from rank %d to rank %d of %d", t.rank, dst, len(t.out))
	}
	if n > t.job.caps.MaxPacket {
		return nil, nil, fmt.Errorf("loop: send %d bytes to rank %d, max %d: %w", n, dst, t.job.caps.MaxPacket, transport.ErrTooLarge)
	}
	d := t.job.ranks[dst]
	if d.closed.Load() {
		return nil, nil, transport.PeerErrorf(dst, "loop: send from rank %d to rank %d, which has closed", t.rank, dst)
	}
	out := t.out[dst]
	if out == nil {
		var err error
		if out, err = t.connect(d); err != nil {
			return nil, nil, err
		}
	}
	return d, out, nil
}

// pushed finishes a send to d whose push to out returned ok.
func (t *Transport) pushed(d *Transport, out *ring.Producer, ok bool) error {
	if !ok {
		return transport.ErrWouldBlock
	}
	if t.fence {
		out.Fence() // the record visible before the sleep check (ring.Producer.Fence)
	}
	d.bell.ring()
	return nil
}

// connect makes the ring from this rank to d and adds it to d's inbound
// rings; called by the first Send to d (Sends to one destination run one at
// a time). Errors: ring allocation failures.
func (t *Transport) connect(d *Transport) (*ring.Producer, error) {
	mem, err := ring.Alloc(t.job.ringBytes)
	if err != nil {
		return nil, fmt.Errorf("loop: ring %d -> %d: %w", t.rank, d.rank, err)
	}
	out, err := ring.NewProducer(mem)
	if err != nil {
		return nil, err
	}
	in, err := ring.NewConsumer(mem)
	if err != nil {
		return nil, err
	}
	d.actMu.Lock()
	k := d.nAct.Load()
	d.act[k] = inbound{src: t.rank, c: in}
	d.nAct.Store(k + 1)
	d.actMu.Unlock()
	t.out[d.rank] = out
	return out, nil
}

// Poll hands up to max arrived packets to r, in place, visiting the inbound
// rings round-robin: one packet from a ring whose last look found nothing, up
// to ring.BurstMax from one that is streaming (ring.Consumer.Take). Only the
// rings that exist are visited (a peer's first Send makes its ring). It does
// not allocate. Errors: transport.ErrClosed.
func (t *Transport) Poll(r transport.Receiver, max int) (int, error) {
	if t.closed.Load() {
		return 0, transport.ErrClosed
	}
	n, nact := 0, int(t.nAct.Load())
	rr := t.recv.Of(r)
	for k := 0; k < nact && n < max; k++ {
		in := t.act[t.next]
		if t.next++; t.next >= nact {
			t.next = 0
		}
		n += ring.Take(in.c, rr, in.src, &t.streak[in.src], max-n)
	}
	return n, nil
}

func (t *Transport) arrived() bool {
	for _, in := range t.act[:t.nAct.Load()] {
		if in.c.Pending() {
			return true
		}
	}
	return t.woken.Load()
}

// Wait polls the inbound rings for about the spin time, yielding the processor
// between looks, then parks until a peer sends or d passes. Errors:
// transport.ErrClosed.
func (t *Transport) Wait(d time.Duration) error { return t.wait(t.spin, d) }

// Sleep is Wait without the spin: it parks at once (transport.Sleeper).
func (t *Transport) Sleep(d time.Duration) error { return t.wait(0, d) }

func (t *Transport) wait(spin, d time.Duration) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	t.bell.wait(t.ready, spin, d)
	t.woken.Store(false)
	return nil
}

// Wake makes a Wait in progress return, or else the next one return at once
// (transport.Waker).
func (t *Transport) Wake() {
	t.woken.Store(true)
	t.bell.ring()
}

// Put copies data to addr, which rank dst registered: every rank shares this
// address space. Errors: transport.ErrPeer (dst out of range), transport.ErrClosed.
func (t *Transport) Put(dst int, addr uintptr, data []byte) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if uint(dst) >= uint(len(t.out)) {
		return transport.PeerErrorf(dst, "loop: put from rank %d to rank %d of %d", t.rank, dst, len(t.out))
	}
	if len(data) == 0 {
		return nil
	}
	// Reinterpret the address as a pointer without a uintptr->Pointer
	// conversion: addr names live memory that dst registered and keeps alive.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	memcopy.Copy(unsafe.Slice((*byte)(p), len(data)), data)
	return nil
}

// Get copies len(buf) bytes at addr, which rank src named and keeps alive, into
// buf: every rank shares this address space. Errors: transport.ErrPeer (src
// out of range), transport.ErrClosed.
func (t *Transport) Get(src int, addr uintptr, buf []byte) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if uint(src) >= uint(len(t.out)) {
		return transport.PeerErrorf(src, "loop: get from rank %d by rank %d of %d", src, t.rank, len(t.out))
	}
	if len(buf) == 0 {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	memcopy.Copy(buf, unsafe.Slice((*byte)(p), len(buf)))
	return nil
}

// Close marks the rank closed: its methods return transport.ErrClosed and
// peers' Sends to it transport.ErrPeer. Closing twice is a no-op.
func (t *Transport) Close() error {
	t.closed.Store(true)
	return nil
}

// bell parks a waiting rank until a sender signals it.
type bell struct {
	waiters atomic.Int32
	ch      chan struct{} // capacity 1: a pending signal
	timerMu sync.Mutex    // guards timer: a sleep that finds it taken makes its own
	timer   *time.Timer   // reused by sleeps, so that a sleep allocates nothing
}

// ring signals the waiter, if any, without blocking; one load when none waits.
func (b *bell) ring() {
	if b.waiters.Load() != 0 {
		select {
		case b.ch <- struct{}{}:
		default:
		}
	}
}

// wait returns when ready() does, or after about d. The announce-recheck-park
// sequence is the one of futex.Doorbell, with its heavy barrier for senders
// that skip their fence: a sender that publishes after the recheck sees
// waiters != 0 and signals; a stale signal only causes an early, allowed,
// return.
func (b *bell) wait(ready func() bool, spin, d time.Duration) {
	start := time.Now()
	for i := 0; ; i++ {
		if ready() {
			return
		}
		if i&15 == 15 && time.Since(start) >= min(spin, d) {
			break
		}
		runtime.Gosched()
	}
	left := d - time.Since(start)
	if left <= 0 {
		return
	}
	b.waiters.Add(1)
	defer b.waiters.Add(-1)
	if membarrier.Heavy() != nil || ready() {
		return // without the barrier a fenceless sender's record may not be visible yet: no parking
	}
	if !b.timerMu.TryLock() {
		// Another goroutine sleeps with the timer: take a fresh one.
		tm := time.NewTimer(left)
		select {
		case <-b.ch:
		case <-tm.C:
		}
		tm.Stop()
		return
	}
	defer b.timerMu.Unlock()
	if b.timer == nil {
		b.timer = time.NewTimer(left)
	} else {
		b.timer.Reset(left) // a stopped or fired timer: Go 1.23 timers need no draining
	}
	select {
	case <-b.ch:
	case <-b.timer.C:
	}
	b.timer.Stop()
}

var _ transport.Putter = (*Transport)(nil)
