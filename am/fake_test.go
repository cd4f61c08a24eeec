package am

import (
	"fmt"
	"math/rand"
	"sync"
	"time"
	"unsafe"

	"github.com/amgo-hpc/amgo/am/transport"
)

// fakeNet is a minimal in-memory network for testing the endpoint alone: a
// mutex-guarded queue per destination, an optional cap on queued packets per
// (src,dst) pair to exercise ErrWouldBlock, and optional Put.
type fakeNet struct {
	mu      sync.Mutex
	n       int
	q       [][]fakePkt // by destination
	inQ     map[[2]int]int
	limit   int // max packets queued per pair; 0 = unlimited
	put     bool
	putMin  int
	maxPkt  int
	dropPut bool // Put returns ErrPutUnsupported

	// A lossy network (Caps not ordered, not reliable): drops, duplicates and
	// reorders packets from a seeded source, so a failure replays.
	lossy                 bool
	seed                  int64
	rng                   *rand.Rand
	loss, dup, reorderPct float64
}

// newLossyNet returns a fake network that loses, duplicates and reorders.
func newLossyNet(n int, seed int64) *fakeNet {
	f := newFakeNet(n)
	f.lossy, f.seed, f.rng = true, seed, rand.New(rand.NewSource(seed))
	f.loss, f.dup, f.reorderPct = 0.10, 0.01, 0.30
	return f
}

type fakePkt struct {
	src int
	b   []byte
}

type fakeTr struct {
	net  *fakeNet
	rank int
}

func newFakeNet(n int) *fakeNet {
	return &fakeNet{n: n, q: make([][]fakePkt, n), inQ: map[[2]int]int{}, maxPkt: 64 << 10}
}

func (f *fakeNet) transports() []transport.Transport {
	trs := make([]transport.Transport, f.n)
	for i := range trs {
		trs[i] = &fakeTr{net: f, rank: i}
	}
	return trs
}

// inject queues raw bytes for dst as if src had sent them.
func (f *fakeNet) inject(src, dst int, b []byte) {
	f.mu.Lock()
	f.q[dst] = append(f.q[dst], fakePkt{src, append([]byte(nil), b...)})
	f.mu.Unlock()
}

func (t *fakeTr) Rank() int { return t.rank }
func (t *fakeTr) Size() int { return t.net.n }
func (t *fakeTr) Caps() transport.Caps {
	if t.net.lossy {
		return transport.Caps{Name: "fake-lossy", MaxPacket: t.net.maxPkt}
	}
	q := 1 << 20 // nominal: the fake queues without bound unless limit is set
	if t.net.limit > 0 {
		q = t.net.limit * t.net.maxPkt
	}
	return transport.Caps{Name: "fake", Ordered: true, Reliable: true, MaxPacket: t.net.maxPkt, QueueBytes: q, Put: t.net.put, PutMin: t.net.putMin}
}

func (t *fakeTr) Send(dst int, hdr, payload []byte) error {
	f := t.net
	if dst < 0 || dst >= f.n {
		return fmt.Errorf("%w: %d", transport.ErrPeer, dst)
	}
	if len(hdr)+len(payload) > f.maxPkt {
		return transport.ErrTooLarge
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	k := [2]int{t.rank, dst}
	if f.limit > 0 && f.inQ[k] >= f.limit {
		return transport.ErrWouldBlock
	}
	b := append(append([]byte(nil), hdr...), payload...)
	if f.lossy {
		if f.rng.Float64() < f.loss {
			return nil // lost
		}
		copies := 1
		if f.rng.Float64() < f.dup {
			copies = 2
		}
		for i := 0; i < copies; i++ {
			q := f.q[dst]
			at := len(q)
			if len(q) > 0 && f.rng.Float64() < f.reorderPct {
				at = f.rng.Intn(len(q) + 1)
			}
			q = append(q, fakePkt{})
			copy(q[at+1:], q[at:])
			q[at] = fakePkt{t.rank, b}
			f.q[dst] = q
		}
		return nil
	}
	f.inQ[k]++
	f.q[dst] = append(f.q[dst], fakePkt{t.rank, b})
	return nil
}

func (t *fakeTr) Poll(r transport.Receiver, max int) (int, error) {
	f := t.net
	n := 0
	for n < max {
		f.mu.Lock()
		if len(f.q[t.rank]) == 0 {
			f.mu.Unlock()
			break
		}
		p := f.q[t.rank][0]
		f.q[t.rank] = f.q[t.rank][1:]
		if f.inQ[[2]int{p.src, t.rank}] > 0 {
			f.inQ[[2]int{p.src, t.rank}]--
		}
		f.mu.Unlock()
		r.Deliver(p.src, p.b)
		n++
	}
	return n, nil
}

func (t *fakeTr) Wait(d time.Duration) error {
	time.Sleep(min(d, 50*time.Microsecond))
	return nil
}

func (t *fakeTr) Close() error { return nil }

func (t *fakeTr) Put(dst int, addr uintptr, data []byte) error {
	if t.net.dropPut {
		return transport.ErrPutUnsupported
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	copy(unsafe.Slice((*byte)(p), len(data)), data)
	return nil
}
