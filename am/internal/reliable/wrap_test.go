package reliable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
	_ "github.com/amgo-hpc/amgo/am/transport/udp"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// lossyNet is a small in-memory network without ordering or reliability, as
// UDP: a packet may be lost, duplicated, or handed over out of order (Poll
// picks a random queued packet), and a full inbox drops. Send never blocks.
// Faults come from a seeded generator (shared by all ranks, so runs with
// goroutines are not bit-for-bit repeatable; the engine tests are).
type lossyNet struct {
	mu                 sync.Mutex
	rng                *rand.Rand
	loss, dup, reorder float64
	maxPkt, limit      int
	inbox              [][]lossyPkt // per destination
	free               [][]byte
	blackhole          []bool // per destination: drop everything to it
	sent, dropped      int
}

type lossyPkt struct {
	src int
	b   []byte
}

type lossyTr struct {
	net    *lossyNet
	rank   int
	closed atomic.Bool
}

func newLossyJob(n int, seed uint64, loss, dup, reorder float64) (*lossyNet, []transport.Transport) {
	ln := &lossyNet{rng: rand.New(rand.NewPCG(seed, 77)), loss: loss, dup: dup, reorder: reorder,
		maxPkt: 9000, limit: 4096, inbox: make([][]lossyPkt, n), blackhole: make([]bool, n)}
	ts := make([]transport.Transport, n)
	for r := range ts {
		ts[r] = &lossyTr{net: ln, rank: r}
	}
	return ln, ts
}

func (t *lossyTr) Rank() int { return t.rank }
func (t *lossyTr) Size() int { return len(t.net.inbox) }
func (t *lossyTr) Caps() transport.Caps {
	return transport.Caps{Name: "lossy", MaxPacket: t.net.maxPkt}
}

func (t *lossyTr) Send(dst int, hdr, payload []byte) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	if uint(dst) >= uint(len(t.net.inbox)) {
		return fmt.Errorf("lossy: rank %d: %w", dst, transport.ErrPeer)
	}
	if len(hdr)+len(payload) > t.net.maxPkt {
		return transport.ErrTooLarge
	}
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sent++
	copies := 1
	if n.rng.Float64() < n.dup {
		copies = 2
	}
	for ; copies > 0; copies-- {
		if n.blackhole[dst] || n.rng.Float64() < n.loss || len(n.inbox[dst]) >= n.limit {
			n.dropped++
			continue
		}
		var b []byte
		if k := len(n.free); k > 0 && cap(n.free[k-1]) >= len(hdr)+len(payload) {
			b = n.free[k-1][:0]
			n.free = n.free[:k-1]
		} else {
			b = make([]byte, 0, max(2048, len(hdr)+len(payload)))
		}
		b = append(append(b, hdr...), payload...)
		n.inbox[dst] = append(n.inbox[dst], lossyPkt{t.rank, b})
	}
	return nil
}

func (t *lossyTr) Poll(r transport.Receiver, max int) (int, error) {
	if t.closed.Load() {
		return 0, transport.ErrClosed
	}
	n := t.net
	got := 0
	for ; got < max; got++ {
		n.mu.Lock()
		q := n.inbox[t.rank]
		if len(q) == 0 {
			n.mu.Unlock()
			break
		}
		i := 0
		if len(q) > 1 && n.rng.Float64() < n.reorder {
			i = n.rng.IntN(len(q))
		}
		p := q[i]
		copy(q[i:], q[i+1:])
		q[len(q)-1] = lossyPkt{}
		n.inbox[t.rank] = q[:len(q)-1]
		n.mu.Unlock()
		r.Deliver(p.src, p.b)
		n.mu.Lock()
		n.free = append(n.free, p.b)
		n.mu.Unlock()
	}
	return got, nil
}

func (t *lossyTr) Wait(d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		t.net.mu.Lock()
		k := len(t.net.inbox[t.rank])
		t.net.mu.Unlock()
		if k > 0 {
			return nil
		}
		time.Sleep(min(50*time.Microsecond, time.Until(deadline)))
	}
	return nil
}

func (t *lossyTr) Close() error { t.closed.Store(true); return nil }

// wrapJob opens n ranks of Wrap(lossy).
func wrapJob(t *testing.T, n int, seed uint64, loss, dup, reorder float64, cfg Config) []transport.Transport {
	_, raw := newLossyJob(n, seed, loss, dup, reorder)
	ts := make([]transport.Transport, n)
	for r := range raw {
		w, err := Wrap(raw[r], cfg, nil)
		require.NoError(t, err)
		ts[r] = w
	}
	return ts
}

// wrapCfg are timers for an in-process network: round trips of microseconds.
var wrapCfg = Config{RTOMin: time.Millisecond, RTOInit: 2 * time.Millisecond, RTOMax: 50 * time.Millisecond,
	AckDelay: 100 * time.Microsecond}

// TestConformanceUnorderedDuplicating runs the transport conformance suite,
// unchanged, over Wrap of a network that reorders (30%) and duplicates (1%).
func TestConformanceUnorderedDuplicating(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		return wrapJob(t, n, 1, 0, 0.01, 0.3, wrapCfg)
	})
}

// TestConformanceLossy runs the suite over Wrap of a network that also loses
// 5% of packets. One subtest gets the same network without loss, because it
// cannot hold on any lossy network whatever the layer above it does: NoAllocs
// requires that every Send be handed over by the very next Poll of the
// receiver, and a lost packet comes back only after a retransmission timeout.
// (Wait, whose sender never calls its transport again after one Send, passes
// under loss thanks to Wrap's progress goroutine.)
func TestConformanceLossy(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		loss := 0.05
		if strings.HasSuffix(t.Name(), "/NoAllocs") {
			loss = 0
		}
		return wrapJob(t, n, 2, loss, 0.01, 0.3, wrapCfg)
	})
}

func TestWrapCaps(t *testing.T) {
	_, raw := newLossyJob(3, 1, 0, 0, 0)
	w, err := Wrap(raw[2], Config{}, nil)
	require.NoError(t, err)
	require.Equal(t, transport.Caps{Name: "lossy+reliable", Ordered: true, Reliable: true, MaxPacket: 9000 - wire.SeqExtLen}, w.Caps())
	require.Equal(t, 2, w.Rank())
	require.Equal(t, 3, w.Size())
	_, err = Wrap(raw[0], Config{Window: MaxWindow + 1}, nil)
	require.Error(t, err)
}

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type countRx struct{ n int }

func (c *countRx) Deliver(int, []byte) { c.n++ }

// TestWrapDeadPeerReportedAfterDeadAfter: a rank whose packets vanish is
// reported through Poll (once) and Send (every time), with errors that wrap
// transport.ErrPeer and ErrPeerDead and name the rank, after DeadAfter (default
// 3 s) and not before.
func TestWrapDeadPeerReportedAfterDeadAfter(t *testing.T) {
	ln, raw := newLossyJob(3, 1, 0, 0, 0)
	clk := &fakeClock{now: epoch}
	ws := make([]transport.Transport, 3)
	for r := range raw {
		w, err := Wrap(raw[r], Config{}, clk.Now)
		require.NoError(t, err)
		ws[r] = w
	}
	ln.blackhole[2] = true
	hdr := testPacket(0, 2, 0, 0)
	require.NoError(t, ws[0].Send(2, hdr, nil))
	require.NoError(t, ws[0].Send(1, testPacket(0, 1, 0, 0), nil))
	rx := &countRx{}
	for elapsed := time.Duration(0); elapsed < DefaultDeadAfter; elapsed += 100 * time.Millisecond {
		_, err := ws[0].Poll(rx, 10)
		require.NoError(t, err, "at %v", elapsed)
		_, err = ws[1].Poll(rx, 10)
		require.NoError(t, err)
		clk.Add(100 * time.Millisecond)
	}
	_, err := ws[0].Poll(rx, 10)
	require.Error(t, err)
	require.ErrorIs(t, err, transport.ErrPeer)
	require.ErrorIs(t, err, ErrPeerDead)
	require.Contains(t, err.Error(), "rank 2")
	_, err = ws[0].Poll(rx, 10)
	require.NoError(t, err, "Poll reports a death once")
	err = ws[0].Send(2, hdr, nil)
	require.ErrorIs(t, err, transport.ErrPeer)
	require.ErrorIs(t, err, ErrPeerDead)
	require.NoError(t, ws[0].Send(1, testPacket(0, 1, 1, 0), nil), "other peers are unaffected")
	_, err = ws[1].Poll(rx, 10)
	require.NoError(t, err)
	require.Equal(t, 2, rx.n)
}

// TestWrapHandlerMaySend: Poll hands packets up without holding its lock, so a
// handler can reply at once (am's Reply from a request handler).
func TestWrapHandlerMaySend(t *testing.T) {
	ts := wrapJob(t, 2, 3, 0.1, 0.01, 0.3, wrapCfg)
	replies := 0
	echo := receiverFunc(func(src int, pkt []byte) {
		h, _ := decodeT(pkt)
		if h.Addr == 1 { // a request: reply with Addr 0
			b := append([]byte(nil), pkt...)
			binary.LittleEndian.PutUint64(b[32:], 0)
			binary.LittleEndian.PutUint32(b[8:], 1) // Src
			if err := ts[1].Send(src, b, nil); err != nil && !errors.Is(err, transport.ErrWouldBlock) {
				t.Errorf("reply: %v", err)
			}
			return
		}
		replies++
	})
	const n = 50
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < n; {
		h := wire.Header{Kind: wire.KindRequestShort, Src: 0, Addr: 1}
		b := make([]byte, wire.HeaderLen)
		wire.Encode(b, &h, nil)
		if err := ts[0].Send(1, b, nil); err == nil {
			i++
		}
		ts[1].Poll(echo, 8)
		ts[0].Poll(echo, 8)
		require.True(t, time.Now().Before(deadline))
	}
	for replies < n {
		ts[1].Poll(echo, 8)
		ts[0].Poll(echo, 8)
		require.True(t, time.Now().Before(deadline), "%d replies", replies)
	}
}

type receiverFunc func(src int, pkt []byte)

func (f receiverFunc) Deliver(src int, pkt []byte) { f(src, pkt) }

func decodeT(pkt []byte) (wire.Header, error) {
	var h wire.Header
	var args [wire.MaxArgs]uint64
	_, err := wire.Decode(pkt, &h, &args)
	return h, err
}

// BenchmarkWrapSendPoll: one packet through Wrap over the in-memory network
// without faults (the layer's overhead over a raw transport, lock and copies
// included), Send plus the receiver's Poll.
func BenchmarkWrapSendPoll(b *testing.B) {
	_, raw := newLossyJob(2, 1, 0, 0, 0)
	var ws [2]transport.Transport
	for r := range ws {
		w, err := Wrap(raw[r], Config{}, nil)
		require.NoError(b, err)
		ws[r] = w
	}
	p := testPacket(0, 1, 0, 64)
	rx := &countRx{}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		for ws[0].Send(1, p, nil) != nil {
			ws[0].Poll(rx, 16)
		}
		ws[1].Poll(rx, 16)
	}
}

// Wrap over a transport.Waker is one (Wake ends the wrapper's Wait, which
// sleeps in the underlying transport's); over a transport that has no Wake
// it is not one.
func TestWrapWake(t *testing.T) {
	_, raw := newLossyJob(2, 1, 0, 0, 0)
	w, err := Wrap(raw[0], Config{}, nil)
	require.NoError(t, err)
	_, ok := w.(transport.Waker)
	require.False(t, ok, "a wrapper over a network without Wake")
	require.NoError(t, w.Close())

	bs := transporttest.NewBootstraps(2, "reliable-wake")
	ts := make([]transport.Transport, 2)
	errs := make(chan error, 2)
	for r := range bs {
		go func() {
			u, err := transport.Open("udp", bs[r], map[string]string{"iface": "127.0.0.1", "spin": "0s"})
			if err == nil {
				ts[r], err = Wrap(u, wrapCfg, nil)
			}
			errs <- err
		}()
	}
	for range bs {
		require.NoError(t, <-errs)
	}
	defer ts[0].Close()
	defer ts[1].Close()
	transporttest.Wake(t, ts)

	// The wrapper's Wait sleeps in slices of ProgressInterval (1 ms): a
	// Wake at any point of a slice, its end included, ends the Wait.
	rng := rand.New(rand.NewPCG(7, 1))
	for i := range 100 {
		delay := time.Duration(rng.IntN(3000)) * time.Microsecond
		done := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			_ = ts[0].Wait(5 * time.Second)
			done <- time.Since(start)
		}()
		for start := time.Now(); time.Since(start) < delay; {
		}
		ts[0].(transport.Waker).Wake()
		require.Less(t, <-done, time.Second, "round %d: a Wake %v into the Wait was lost", i, delay)
	}
}

// The layer is a transport.Batcher that passes Hold and Flush on to a
// network that batches, and does nothing over one that does not.
func TestWrapPassesBatchingOn(t *testing.T) {
	_, raw := newLossyJob(2, 1, 0, 0, 0)
	bt := &transporttest.Batching{Transport: raw[0]}
	w, err := Wrap(bt, Config{}, nil)
	require.NoError(t, err)
	defer w.Close()
	b, ok := w.(transport.Batcher)
	require.True(t, ok)
	b.Hold()
	require.NoError(t, b.Flush())
	require.EqualValues(t, 1, bt.Holds.Load())
	require.EqualValues(t, 1, bt.Flushes.Load())
	plain, err := Wrap(raw[1], Config{}, nil)
	require.NoError(t, err)
	defer plain.Close()
	plain.(transport.Batcher).Hold()
	require.NoError(t, plain.(transport.Batcher).Flush())
}
