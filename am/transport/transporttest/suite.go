package transporttest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// NewJobFunc opens the transports of one job of n ranks, index i being rank i.
// Run closes them at the end of each subtest.
type NewJobFunc func(t *testing.T, n int) []transport.Transport

// Run runs the conformance suite against the network that newJob opens, each
// check as a subtest.
func Run(t *testing.T, newJob NewJobFunc) {
	open := func(t *testing.T, n int) []transport.Transport {
		ts := newJob(t, n)
		require.Len(t, ts, n)
		t.Cleanup(func() {
			for _, tr := range ts {
				tr.Close()
			}
		})
		return ts
	}
	t.Run("Caps", func(t *testing.T) { testCaps(t, open(t, 3)) })
	t.Run("SendPoll", func(t *testing.T) { testSendPoll(t, open(t, 2)) })
	t.Run("Order", func(t *testing.T) { testOrder(t, open(t, 2)) })
	t.Run("SelfSend", func(t *testing.T) { testSelfSend(t, open(t, 2)) })
	t.Run("SingleRank", func(t *testing.T) { testSelfSend(t, open(t, 1)) })
	t.Run("AllToAll", func(t *testing.T) { testAllToAll(t, open(t, 4)) })
	t.Run("WouldBlock", func(t *testing.T) { testWouldBlock(t, open(t, 2)) })
	t.Run("TooLarge", func(t *testing.T) { testTooLarge(t, open(t, 2)) })
	t.Run("BadPeer", func(t *testing.T) { testBadPeer(t, open(t, 2)) })
	t.Run("Put", func(t *testing.T) { testPut(t, open(t, 2)) })
	t.Run("Get", func(t *testing.T) { testGet(t, open(t, 2)) })
	t.Run("SendFill", func(t *testing.T) { testSendFill(t, open(t, 2)) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, open(t, 3)) })
	t.Run("Wait", func(t *testing.T) { testWait(t, open(t, 2)) })
	t.Run("NoAllocs", func(t *testing.T) { testNoAllocs(t, open(t, 2)) })
	t.Run("Close", func(t *testing.T) { testClose(t, open(t, 2)) })
}

// packet is a decoded arrival.
type packet struct {
	src     int
	h       wire.Header
	args    []uint64
	payload []byte
}

// collector is a Receiver that decodes and keeps every packet.
type collector struct {
	t    testing.TB
	mu   sync.Mutex
	pkts []packet
}

func (c *collector) Deliver(src int, pkt []byte) {
	var h wire.Header
	var args [wire.MaxArgs]uint64
	payload, err := wire.Decode(pkt, &h, &args)
	if err != nil {
		c.t.Errorf("packet from rank %d does not decode: %v", src, err)
		return
	}
	c.mu.Lock()
	c.pkts = append(c.pkts, packet{src: src, h: h, args: append([]uint64(nil), args[:h.NArgs]...),
		payload: bytes.Clone(payload)})
	c.mu.Unlock()
}

func (c *collector) take() []packet {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pkts
	c.pkts = nil
	return p
}

// build encodes packet number i from src to dst with nargs arguments and plen
// payload bytes, all derived from (src, dst, i) so that check can verify them.
func build(src, dst, i, nargs, plen int) (hdr, payload []byte) {
	h := wire.Header{Kind: wire.KindRequestShort, Handler: uint8(i), NArgs: uint8(nargs),
		Src: uint32(src), Len: uint32(plen), Off: uint32(i), Reserve: uint32(dst)}
	if plen > 0 {
		h.Kind = wire.KindRequestMedium
	}
	args := make([]uint64, nargs)
	for k := range args {
		args[k] = uint64(src)<<48 | uint64(dst)<<32 | uint64(i)<<8 | uint64(k)
	}
	hdr = make([]byte, h.EncodedLen())
	wire.Encode(hdr, &h, args)
	payload = make([]byte, plen)
	for j := range payload {
		payload[j] = byte(src*31 + dst*7 + i + j*13)
	}
	return hdr, payload
}

// check verifies that p is the packet build made for (p.src, dst, p.h.Off):
// build numbers packets in Off and names the destination in Reserve, core
// header fields that no network touches.
func check(t testing.TB, p packet, dst int) {
	t.Helper()
	i := int(p.h.Off)
	require.Equal(t, uint32(p.src), p.h.Src, "source rank in header vs Deliver")
	require.Equal(t, uint32(dst), p.h.Reserve, "packet from %d for rank %d arrived at %d", p.src, p.h.Reserve, dst)
	require.Equal(t, uint8(i), p.h.Handler)
	for k, a := range p.args {
		require.Equal(t, uint64(p.src)<<48|uint64(dst)<<32|uint64(i)<<8|uint64(k), a, "argument %d", k)
	}
	require.Len(t, p.payload, int(p.h.Len))
	for j, b := range p.payload {
		if b != byte(p.src*31+dst*7+i+j*13) {
			require.Failf(t, "payload mismatch", "packet %d from %d to %d: byte %d is %d", i, p.src, dst, j, b)
		}
	}
}

// job drives all ranks from one goroutine.
type job struct {
	t  *testing.T
	ts []transport.Transport
	rx []*collector
}

func newDriver(t *testing.T, ts []transport.Transport) *job {
	j := &job{t: t, ts: ts}
	for range ts {
		j.rx = append(j.rx, &collector{t: t})
	}
	return j
}

// pollAll polls every rank once and returns how many packets arrived.
func (j *job) pollAll() int {
	total := 0
	for r, tr := range j.ts {
		n, err := tr.Poll(j.rx[r], 64)
		require.NoError(j.t, err, "poll rank %d", r)
		total += n
	}
	return total
}

// send sends, polling every rank while the network pushes back.
func (j *job) send(src, dst int, hdr, payload []byte) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := j.ts[src].Send(dst, hdr, payload)
		if err == nil {
			return
		}
		require.ErrorIs(j.t, err, transport.ErrWouldBlock, "send %d -> %d", src, dst)
		if j.pollAll() == 0 {
			runtime.Gosched()
		}
		require.True(j.t, time.Now().Before(deadline), "send %d -> %d blocked for 20 s", src, dst)
	}
}

// await polls until rank r has received want packets in total, and returns them.
func (j *job) await(r, want int) []packet {
	deadline := time.Now().Add(20 * time.Second)
	var got []packet
	for len(got) < want {
		if j.pollAll() == 0 {
			runtime.Gosched()
		}
		got = append(got, j.rx[r].take()...)
		require.True(j.t, time.Now().Before(deadline), "rank %d: %d of %d packets after 20 s", r, len(got), want)
	}
	require.Len(j.t, got, want, "rank %d got more packets than sent", r)
	return got
}

func testCaps(t *testing.T, ts []transport.Transport) {
	c0 := ts[0].Caps()
	require.NotEmpty(t, c0.Name)
	require.GreaterOrEqual(t, c0.MaxPacket, wire.MaxHeaderLen, "MaxPacket must hold the largest header")
	require.GreaterOrEqual(t, c0.PutMin, 0)
	for r, tr := range ts {
		require.Equal(t, r, tr.Rank())
		require.Equal(t, len(ts), tr.Size())
		require.Equal(t, c0, tr.Caps(), "rank %d's caps differ from rank 0's", r)
		if c0.Put {
			_, ok := tr.(transport.Putter)
			require.True(t, ok, "Caps().Put but no Putter")
		}
		if c0.Get {
			_, ok := tr.(transport.Getter)
			require.True(t, ok, "Caps().Get but no Getter")
		}
	}
}

func testSendPoll(t *testing.T, ts []transport.Transport) {
	j := newDriver(t, ts)
	maxPayload := ts[0].Caps().MaxPacket - wire.MaxHeaderLen
	type shape struct{ nargs, plen int }
	shapes := []shape{{0, 0}, {1, 0}, {wire.MaxArgs, 0}, {2, 1}, {0, 7}, {3, 8}, {1, 9}, {0, 100},
		{wire.MaxArgs, 1000}, {4, 4096}, {wire.MaxArgs, maxPayload - 1}, {wire.MaxArgs, maxPayload}}
	for i, s := range shapes {
		if s.plen > maxPayload {
			continue
		}
		hdr, payload := build(0, 1, i, s.nargs, s.plen)
		require.NoError(t, ts[0].Send(1, hdr, payload), "shape %+v", s)
		got := j.await(1, 1)
		require.Equal(t, 0, got[0].src)
		require.Equal(t, uint32(i), got[0].h.Off)
		check(t, got[0], 1)
		require.Len(t, got[0].args, s.nargs)
	}
	require.Empty(t, j.rx[0].take(), "rank 0 received something")
}

func testOrder(t *testing.T, ts []transport.Transport) {
	j := newDriver(t, ts)
	const n = 2000
	r := rand.New(rand.NewPCG(3, 4))
	maxPayload := min(ts[0].Caps().MaxPacket-wire.MaxHeaderLen, 3000)
	for i := 0; i < n; i++ {
		hdr, payload := build(0, 1, i, r.IntN(3), r.IntN(maxPayload+1))
		j.send(0, 1, hdr, payload)
	}
	got := j.await(1, n)
	seen := make([]bool, n)
	for k, p := range got {
		check(t, p, 1)
		if ts[0].Caps().Ordered {
			require.Equal(t, uint32(k), p.h.Off, "packet %d arrived as number %d", p.h.Off, k)
		}
		require.False(t, seen[p.h.Off], "packet %d twice", p.h.Off)
		seen[p.h.Off] = true
	}
}

func testSelfSend(t *testing.T, ts []transport.Transport) {
	j := newDriver(t, ts)
	for r := range ts {
		for i := 0; i < 10; i++ {
			hdr, payload := build(r, r, i, i%3, i*37)
			j.send(r, r, hdr, payload)
		}
		got := j.await(r, 10)
		for k, p := range got {
			require.Equal(t, r, p.src)
			if ts[r].Caps().Ordered {
				require.Equal(t, uint32(k), p.h.Off)
			}
			check(t, p, r)
		}
	}
}

// testAllToAll runs every rank on its own goroutine; each sends k packets to
// every rank, itself included, polling as it goes.
func testAllToAll(t *testing.T, ts []transport.Transport) {
	const k = 300
	n := len(ts)
	maxPayload := min(ts[0].Caps().MaxPacket-wire.MaxHeaderLen, 2000)
	var finished atomic.Int32
	errs := make(chan error, n)
	for r := range ts {
		go func() {
			errs <- func() error {
				rx := &collector{t: t}
				rnd := rand.New(rand.NewPCG(uint64(r), 9))
				next := make([]int, n) // next packet number per destination
				var received []packet
				sentAll := false
				done := false
				deadline := time.Now().Add(30 * time.Second)
				for !done || finished.Load() < int32(n) {
					if time.Now().After(deadline) {
						return fmt.Errorf("rank %d: stuck: sent %v, received %d", r, next, len(received))
					}
					progress := false
					if !sentAll {
						sentAll = true
						for dst := 0; dst < n; dst++ {
							if next[dst] == k {
								continue
							}
							sentAll = false
							hdr, payload := build(r, dst, next[dst], rnd.IntN(4), rnd.IntN(maxPayload+1))
							err := ts[r].Send(dst, hdr, payload)
							if err == nil {
								next[dst]++
								progress = true
							} else if !errors.Is(err, transport.ErrWouldBlock) {
								return fmt.Errorf("rank %d: send to %d: %w", r, dst, err)
							}
						}
					}
					m, err := ts[r].Poll(rx, 32)
					if err != nil {
						return fmt.Errorf("rank %d: poll: %w", r, err)
					}
					received = append(received, rx.take()...)
					if sentAll && len(received) == n*k && !done {
						done = true
						finished.Add(1)
					}
					if m == 0 && !progress {
						runtime.Gosched()
					}
				}
				if len(received) != n*k {
					return fmt.Errorf("rank %d: received %d packets, want %d", r, len(received), n*k)
				}
				last := make([]int, n)
				for i := range last {
					last[i] = -1
				}
				for _, p := range received {
					check(t, p, r)
					if ts[r].Caps().Ordered && int(p.h.Off) != last[p.src]+1 {
						return fmt.Errorf("rank %d: packet %d from %d after %d", r, p.h.Off, p.src, last[p.src])
					}
					last[p.src] = int(p.h.Off)
				}
				return nil
			}()
		}()
	}
	for range ts {
		require.NoError(t, <-errs)
	}
}

func testWouldBlock(t *testing.T, ts []transport.Transport) {
	j := newDriver(t, ts)
	sent := 0
	for ; sent < 1_000_000; sent++ {
		hdr, payload := build(0, 1, sent, 1, 200)
		err := ts[0].Send(1, hdr, payload)
		if errors.Is(err, transport.ErrWouldBlock) {
			break
		}
		require.NoError(t, err)
	}
	if q := peerCaps(ts[0], 1).QueueBytes; q > 0 {
		// A stated queue bound is what bounds immediate requests: it must
		// hold (each packet of 200 bytes plus its framing, at least 8).
		require.Less(t, sent, 1_000_000, "QueueBytes %d stated, but the network never pushed back", q)
		require.LessOrEqual(t, sent*(wire.HeaderLen+8+200+8), q, "QueueBytes %d stated, but the network took %d packets", q, sent)
	}
	if sent == 1_000_000 {
		t.Skip("the network took 10^6 packets without pushing back")
	}
	require.Greater(t, sent, 0)
	got := j.await(1, sent)
	for k, p := range got {
		check(t, p, 1)
		if ts[0].Caps().Ordered {
			require.Equal(t, uint32(k), p.h.Off)
		}
	}
	// Room again: the packet refused before goes through now.
	hdr, payload := build(0, 1, sent, 1, 200)
	j.send(0, 1, hdr, payload)
	got = j.await(1, 1)
	require.Equal(t, uint32(sent), got[0].h.Off)
}

// peerCaps is what tr offers toward peer: its PeerCaps when it reaches
// peers over different networks, else its Caps.
func peerCaps(tr transport.Transport, peer int) transport.Caps {
	if pc, ok := tr.(transport.PeerCapser); ok {
		return pc.PeerCaps(peer)
	}
	return tr.Caps()
}

func testTooLarge(t *testing.T, ts []transport.Transport) {
	for _, dst := range []int{1, 0} {
		max := peerCaps(ts[0], dst).MaxPacket
		hdr, _ := build(0, 1, 0, wire.MaxArgs, 1)
		hdr, payload := build(0, 1, 0, wire.MaxArgs, max-len(hdr)+1) // one byte too many
		require.ErrorIs(t, ts[0].Send(dst, hdr, payload), transport.ErrTooLarge, "to rank %d", dst)
	}
	// Nothing arrived, and the network still works.
	j := newDriver(t, ts)
	require.Zero(t, j.pollAll())
	hdr, payload := build(0, 1, 1, 0, 10)
	j.send(0, 1, hdr, payload)
	got := j.await(1, 1)
	check(t, got[0], 1)
}

func testBadPeer(t *testing.T, ts []transport.Transport) {
	hdr, payload := build(0, 1, 0, 0, 0)
	for _, dst := range []int{-1, len(ts), len(ts) + 100} {
		require.ErrorIs(t, ts[0].Send(dst, hdr, payload), transport.ErrPeer, "dst %d", dst)
		if p, ok := ts[0].(transport.Putter); ok {
			require.ErrorIs(t, p.Put(dst, 0, []byte{1}), transport.ErrPeer, "put dst %d", dst)
		}
		if g, ok := ts[0].(transport.Getter); ok {
			require.ErrorIs(t, g.Get(dst, 0, []byte{1}), transport.ErrPeer, "get src %d", dst)
		}
	}
}

func testPut(t *testing.T, ts []transport.Transport) {
	if !ts[0].Caps().Put {
		t.Skip("network has no Put")
	}
	buf := make([]byte, 1<<20) // "registered" by rank 1: pinned and kept alive
	var pin runtime.Pinner
	pin.Pin(&buf[0])
	defer pin.Unpin()
	base := uintptr(unsafe.Pointer(&buf[0]))
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct{ from, to, off, n int }{
		{0, 1, 0, 1}, {0, 1, 3, 1000}, {0, 1, 4096, 64 << 10}, {0, 1, 0, len(buf)}, {1, 1, 17, 5000}, {0, 1, 100, 0},
	} {
		data := make([]byte, c.n)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		before := bytes.Clone(buf)
		err := ts[c.from].(transport.Putter).Put(c.to, base+uintptr(c.off), data)
		if errors.Is(err, transport.ErrPutUnsupported) {
			t.Skipf("put %d -> %d unsupported here: %v", c.from, c.to, err)
		}
		require.NoError(t, err, "put %+v", c)
		require.Equal(t, data, buf[c.off:c.off+c.n], "put %+v", c)
		require.Equal(t, before[:c.off], buf[:c.off], "put %+v wrote before its range", c)
		require.Equal(t, before[c.off+c.n:], buf[c.off+c.n:], "put %+v wrote past its range", c)
	}
	runtime.KeepAlive(buf)
}

// copyFiller fills a payload with a copy of b and counts its calls.
type copyFiller struct {
	b     []byte
	calls int
}

func (f *copyFiller) Fill(p []byte) { f.calls++; copy(p, f.b) }

// A FillSender's packets with payloads written in place arrive as Send's
// would, to another rank and to itself, up to the largest packet; a packet
// one byte too large, or to a peer whose network takes no payload in place
// (PeerCaps), is refused without calling the filler.
func testSendFill(t *testing.T, ts []transport.Transport) {
	fs, ok := ts[0].(transport.FillSender)
	if !ok || !ts[0].Caps().Fill {
		t.Skip("network takes no payload in place")
	}
	j := newDriver(t, ts)
	for i, dst := range []int{1, 0, 1} {
		hdr, _ := build(0, dst, i, 2, 1)
		n := []int{1, 1000, peerCaps(ts[0], dst).MaxPacket - len(hdr)}[i]
		hdr, payload := build(0, dst, i, 2, n)
		f := &copyFiller{b: payload}
		if !peerCaps(ts[0], dst).Fill {
			// Another network reaches dst (package route): refused, unfilled.
			require.ErrorIs(t, fs.SendFill(dst, hdr, n, f), transport.ErrFillUnsupported)
			require.Zero(t, f.calls)
			continue
		}
		err := fs.SendFill(dst, hdr, n, f)
		for errors.Is(err, transport.ErrWouldBlock) {
			j.pollAll()
			err = fs.SendFill(dst, hdr, n, f)
		}
		require.NoError(t, err)
		require.Equal(t, 1, f.calls)
		got := j.await(dst, 1)
		check(t, got[0], dst)
		hdr, _ = build(0, dst, i, 2, n+1)
		big := &copyFiller{}
		require.ErrorIs(t, fs.SendFill(dst, hdr, peerCaps(ts[0], dst).MaxPacket-len(hdr)+1, big), transport.ErrTooLarge)
		require.Zero(t, big.calls)
	}
}

func testGet(t *testing.T, ts []transport.Transport) {
	if !ts[0].Caps().Get {
		t.Skip("network has no Get")
	}
	src := make([]byte, 1<<20) // named by rank 0: pinned and kept alive
	var pin runtime.Pinner
	pin.Pin(&src[0])
	defer pin.Unpin()
	r := rand.New(rand.NewPCG(7, 8))
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	base := uintptr(unsafe.Pointer(&src[0]))
	for _, c := range []struct{ by, from, off, n int }{
		{1, 0, 0, 1}, {1, 0, 3, 1000}, {1, 0, 4096, 64 << 10}, {1, 0, 0, len(src)}, {0, 0, 17, 5000}, {1, 0, 100, 0},
	} {
		buf := make([]byte, c.n+16)
		err := ts[c.by].(transport.Getter).Get(c.from, base+uintptr(c.off), buf[8:8+c.n])
		if errors.Is(err, transport.ErrGetUnsupported) {
			t.Skipf("get %d <- %d unsupported here: %v", c.by, c.from, err)
		}
		require.NoError(t, err, "get %+v", c)
		require.Equal(t, src[c.off:c.off+c.n], buf[8:8+c.n], "get %+v", c)
		require.Equal(t, make([]byte, 8), buf[:8], "get %+v wrote before its buffer", c)
		require.Equal(t, make([]byte, 8), buf[8+c.n:], "get %+v wrote past its buffer", c)
	}
	runtime.KeepAlive(src)
}

// testConcurrent has every rank send to each peer from its own goroutine while
// one more goroutine per rank polls. A rank that has received everything
// keeps polling until every rank has: over a network wrapped in a
// reliability layer, its lost packets are sent again only from its polls.
func testConcurrent(t *testing.T, ts []transport.Transport) {
	const k = 2000
	n := len(ts)
	var received atomic.Int32 // ranks that have received every packet
	var wg sync.WaitGroup
	errs := make(chan error, n*n)
	for r := range ts {
		for dst := range ts {
			if dst == r {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				deadline := time.Now().Add(20 * time.Second)
				for i := 0; i < k; i++ {
					hdr, payload := build(r, dst, i, i%3, (i*61)%500)
					for {
						err := ts[r].Send(dst, hdr, payload)
						if err == nil {
							break
						}
						if !errors.Is(err, transport.ErrWouldBlock) || time.Now().After(deadline) {
							errs <- fmt.Errorf("send %d -> %d packet %d: %w", r, dst, i, err)
							return
						}
						runtime.Gosched()
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rx := &collector{t: t}
			next := make([]int, n)
			deadline := time.Now().Add(20 * time.Second)
			for got := 0; got < (n-1)*k || received.Load() < int32(n); {
				m, err := ts[r].Poll(rx, 16)
				if err != nil {
					errs <- fmt.Errorf("rank %d: poll: %w", r, err)
					return
				}
				for _, p := range rx.take() {
					check(t, p, r)
					if ts[r].Caps().Ordered && int(p.h.Off) != next[p.src] {
						errs <- fmt.Errorf("rank %d: packet %d from %d, want %d", r, p.h.Off, p.src, next[p.src])
						return
					}
					next[p.src] = int(p.h.Off) + 1
					got++
					if got == (n-1)*k {
						received.Add(1)
					}
				}
				if m == 0 {
					if time.Now().After(deadline) {
						if got == (n-1)*k {
							return // the others report what they lack
						}
						errs <- fmt.Errorf("rank %d: received %v after 20 s", r, next)
						return
					}
					runtime.Gosched()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func testWait(t *testing.T, ts []transport.Transport) {
	// Nothing arrives: Wait returns after about the timeout (or earlier).
	start := time.Now()
	require.NoError(t, ts[1].Wait(30*time.Millisecond))
	require.Less(t, time.Since(start), 3*time.Second)

	// Traffic arrives while rank 1 waits.
	j := newDriver(t, ts)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		time.Sleep(20 * time.Millisecond)
		hdr, payload := build(0, 1, 0, 0, 10)
		if err := ts[0].Send(1, hdr, payload); err != nil {
			t.Errorf("send: %v", err)
		}
	}()
	defer func() { <-sent }() // Send returned before the transports close
	start = time.Now()
	j.waitArrival(1, 5*time.Second, 10*time.Second)
	if ts[1].Caps().Wakeup {
		require.Less(t, time.Since(start), 3*time.Second, "Wait slept through the arrival")
	}
	check(t, j.rx[1].take()[0], 1)
}

// waitArrival has rank r Wait (each call for at most wait) and Poll until a
// packet arrives, failing after limit.
func (j *job) waitArrival(r int, wait, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for {
		require.NoError(j.t, j.ts[r].Wait(wait))
		n, err := j.ts[r].Poll(j.rx[r], 10)
		require.NoError(j.t, err)
		if n > 0 {
			return
		}
		require.True(j.t, time.Now().Before(deadline), "rank %d: nothing arrived in %v", r, limit)
	}
}

type discard struct{ n int }

func (d *discard) Deliver(src int, pkt []byte) { d.n += len(pkt) }

func testNoAllocs(t *testing.T, ts []transport.Transport) {
	hdr, payload := build(0, 1, 0, 2, 100)
	rx := &discard{}
	for _, dst := range []int{1, 0} {
		// Open the connection first (a network that connects lazily may
		// take several polls for its handshake): the steady state is measured.
		require.NoError(t, ts[0].Send(dst, hdr, payload))
		for deadline := time.Now().Add(10 * time.Second); ; {
			n, err := ts[dst].Poll(rx, 10)
			require.NoError(t, err)
			if n > 0 {
				break
			}
			if dst != 0 {
				_, err = ts[0].Poll(rx, 10)
				require.NoError(t, err)
			}
			require.True(t, time.Now().Before(deadline), "first packet to rank %d did not arrive", dst)
		}
		allocs := testing.AllocsPerRun(500, func() {
			if err := ts[0].Send(dst, hdr, payload); err != nil {
				t.Fatal(err)
			}
			if n, err := ts[dst].Poll(rx, 10); err != nil || n != 1 {
				t.Fatalf("poll: %d, %v", n, err)
			}
		})
		require.Zero(t, allocs, "Send+Poll to rank %d allocate", dst)
	}
}

func testClose(t *testing.T, ts []transport.Transport) {
	require.NoError(t, ts[0].Close())
	hdr, payload := build(0, 1, 0, 0, 0)
	require.ErrorIs(t, ts[0].Send(1, hdr, payload), transport.ErrClosed)
	_, err := ts[0].Poll(&discard{}, 1)
	require.ErrorIs(t, err, transport.ErrClosed)
	require.NoError(t, ts[0].Close(), "second Close")
}
