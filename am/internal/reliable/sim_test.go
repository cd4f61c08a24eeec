package reliable

import (
	"container/heap"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/internal/wire"
)

// Replaying a failure: every randomized test names its seed ("seed=N") when it
// fails; run it again with -reliable.seed=N or RELIABLE_SEED=N. RELIABLE_SEEDS=K
// (or -reliable.seeds=K) runs seeds 1..K in the property tests.
var (
	seedFlag  = flag.Uint64("reliable.seed", 0, "run the randomized tests with this seed only")
	seedsFlag = flag.Int("reliable.seeds", 0, "number of seeds (1..N) for the property tests")
)

// raceEnabled is set under -race, which runs the property tests on fewer seeds.
var raceEnabled bool

// seeds returns the seeds a randomized test runs: the one asked for, or 1..n.
func seeds(t *testing.T, n int) []uint64 {
	if *seedFlag != 0 {
		return []uint64{*seedFlag}
	}
	if s := os.Getenv("RELIABLE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "RELIABLE_SEED")
		return []uint64{v}
	}
	if *seedsFlag > 0 {
		n = *seedsFlag
	} else if s := os.Getenv("RELIABLE_SEEDS"); s != "" {
		v, err := strconv.Atoi(s)
		require.NoError(t, err, "RELIABLE_SEEDS")
		n = v
	} else if testing.Short() || raceEnabled {
		n = min(n, 3)
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// reportSeed makes a failing test print how to replay it.
func reportSeed(t *testing.T, seed uint64) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed=%d: replay with RELIABLE_SEED=%d go test -run '%s' ./am/internal/reliable", seed, seed, t.Name())
		}
	})
}

// epoch is the fake clock's zero.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// netConfig describes the simulated network's faults. Probabilities are per packet.
type netConfig struct {
	Loss, Reorder, Dup float64
	Latency            time.Duration // one-way delay of every packet
	ReorderDelay       time.Duration // a reordered packet is held up to this much longer
}

// inFlight is a packet on the simulated wire.
type inFlight struct {
	at       time.Time
	order    uint64 // tie-break: deterministic
	src, dst int
	data     []byte
}

type flightHeap []inFlight

func (h flightHeap) Len() int { return len(h) }
func (h flightHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].order < h[j].order
}
func (h flightHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *flightHeap) Push(x any)   { *h = append(*h, x.(inFlight)) }
func (h *flightHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// simNet connects engines through a lossy, reordering, duplicating network
// driven by a seeded generator and a fake clock. No goroutines, no sockets: the
// test calls step until it is done.
type simNet struct {
	t       testing.TB
	seed    uint64
	rng     *rand.Rand
	cfg     netConfig
	now     time.Time
	engines []*Engine
	wire    flightHeap
	order   uint64
	// drop, when set, decides the fate of each transmission before the random faults.
	drop func(src, dst int, pkt []byte) bool
	// onDeliver sees every delivery.
	onDeliver func(dst, src int, pkt []byte)
	// tx counts transmissions by kind.
	dataTx, ackTx int
}

func newSimNet(t testing.TB, seed uint64, nc netConfig, cfg Config, n int) *simNet {
	s := &simNet{t: t, rng: rand.New(rand.NewPCG(seed, 0x5eed)), cfg: nc, now: epoch}
	s.seed = seed
	for r := 0; r < n; r++ {
		c := cfg
		c.Peers, c.Self = n, r
		e, err := New(c)
		require.NoError(t, err)
		s.engines = append(s.engines, e)
	}
	return s
}

// transmit puts a copy of pkt on the wire, applying loss, duplication and delay.
func (s *simNet) transmit(src, dst int, pkt []byte) {
	var h wire.Header
	var args [wire.MaxArgs]uint64
	_, err := wire.Decode(pkt, &h, &args)
	require.NoError(s.t, err, "seed=%d: engine %d transmitted an undecodable packet", s.seed, src)
	if h.Seq == 0 {
		require.Equal(s.t, wire.KindAck, h.Kind, "seed=%d: unsequenced packet that is not an ack", s.seed)
		s.ackTx++
	} else {
		s.dataTx++
	}
	if s.drop != nil && s.drop(src, dst, pkt) {
		return
	}
	copies := 1
	if s.rng.Float64() < s.cfg.Dup {
		copies = 2
	}
	for ; copies > 0; copies-- {
		if s.rng.Float64() < s.cfg.Loss {
			continue
		}
		d := s.cfg.Latency
		if s.cfg.ReorderDelay > 0 && s.rng.Float64() < s.cfg.Reorder {
			d += time.Duration(s.rng.Int64N(int64(s.cfg.ReorderDelay)))
		}
		s.order++
		heap.Push(&s.wire, inFlight{at: s.now.Add(d), order: s.order, src: src, dst: dst, data: append([]byte(nil), pkt...)})
	}
}

// flush carries out every engine's Ready: transmissions go on the wire,
// deliveries go to onDeliver.
func (s *simNet) flush() {
	for r, e := range s.engines {
		rd := e.Ready()
		for _, m := range rd.Messages {
			s.transmit(r, m.To, m.Data)
		}
		for _, d := range rd.Deliveries {
			if s.onDeliver != nil {
				s.onDeliver(r, d.From, d.Data)
			}
		}
		for _, err := range rd.Dead {
			s.t.Fatalf("seed=%d: rank %d: %v", s.seed, r, err)
		}
		e.Advance()
	}
}

// step moves the clock to the next event (an arrival or a timer, at most
// maxStep ahead), delivers what has arrived and runs the timers. It returns
// false when nothing at all is pending.
func (s *simNet) step(maxStep time.Duration) bool {
	next := s.now.Add(maxStep)
	pending := false
	if len(s.wire) > 0 {
		pending = true
		if s.wire[0].at.Before(next) {
			next = s.wire[0].at
		}
	}
	for _, e := range s.engines {
		if d := e.NextDeadline(); !d.IsZero() {
			pending = true
			if d.Before(next) {
				next = d
			}
		}
	}
	if next.After(s.now) {
		s.now = next
	}
	for len(s.wire) > 0 && !s.wire[0].at.After(s.now) {
		p := heap.Pop(&s.wire).(inFlight)
		s.engines[p.dst].Receive(s.now, p.src, p.data)
	}
	for _, e := range s.engines {
		e.Tick(s.now)
	}
	s.flush()
	return pending
}

// testPacket encodes packet k from src to dst: its index in an argument and in
// a payload whose length and bytes derive from (src, dst, k).
func testPacket(src, dst int, k uint64, plen int) []byte {
	h := wire.Header{Kind: wire.KindRequestMedium, Handler: uint8(k), NArgs: 2, Src: uint32(src), Len: uint32(plen)}
	b := make([]byte, h.EncodedLen()+plen)
	n := wire.Encode(b, &h, []uint64{uint64(src)<<48 | uint64(dst)<<32, k})
	for j := range b[n:] {
		b[n+j] = byte(uint64(src*31+dst*7+j) + k*13)
	}
	return b
}

// checkPacket verifies that pkt is packet want from src to dst.
func checkPacket(t testing.TB, seed uint64, src, dst int, want uint64, pkt []byte) {
	var h wire.Header
	var args [wire.MaxArgs]uint64
	payload, err := wire.Decode(pkt, &h, &args)
	require.NoError(t, err, "seed=%d", seed)
	require.Equal(t, uint32(src), h.Src, "seed=%d", seed)
	require.Equal(t, uint64(src)<<48|uint64(dst)<<32, args[0], "seed=%d: packet for %d from %d", seed, dst, src)
	if args[1] != want {
		require.Failf(t, "out of order or duplicate", "seed=%d: rank %d from %d: got packet %d, want %d", seed, dst, src, args[1], want)
	}
	require.Equal(t, uint8(want), h.Handler, "seed=%d", seed)
	for j, c := range payload {
		if c != byte(uint64(src*31+dst*7+j)+want*13) {
			require.Failf(t, "payload corrupted", "seed=%d: packet %d from %d to %d, byte %d", seed, want, src, dst, j)
		}
	}
}

// streamResult summarizes a run of exchange.
type streamResult struct {
	simTime time.Duration
	stats   []Stats
}

// exchange sends n packets from every engine to every other (and, with self,
// to itself) through s, checking that each arrives exactly once, in order,
// intact. It fails when the clock passes limit.
func exchange(t testing.TB, s *simNet, n uint64, self bool, limit time.Duration) streamResult {
	ranks := len(s.engines)
	next := make([][]uint64, ranks) // next packet to send, per src and dst
	got := make([][]uint64, ranks)  // next packet expected, per dst and src
	for r := range next {
		next[r], got[r] = make([]uint64, ranks), make([]uint64, ranks)
	}
	s.onDeliver = func(dst, src int, pkt []byte) {
		checkPacket(t, s.seed, src, dst, got[dst][src], pkt)
		got[dst][src]++
	}
	plen := func(src, dst int, k uint64) int { return int((uint64(src*7+dst*3) + k*37) % 300) }
	done := func() bool {
		for d := range got {
			for sr := range got[d] {
				if (sr != d || self) && got[d][sr] < n {
					return false
				}
			}
		}
		return true
	}
	for !done() {
		for src, e := range s.engines {
			for dst := range s.engines {
				if dst == src && !self {
					continue
				}
				for next[src][dst] < n {
					err := e.Send(s.now, dst, testPacket(src, dst, next[src][dst], plen(src, dst, next[src][dst])))
					if err == ErrWindowFull {
						break
					}
					require.NoError(t, err, "seed=%d", s.seed)
					next[src][dst]++
				}
			}
		}
		s.flush()
		s.step(time.Millisecond)
		if s.now.Sub(epoch) > limit {
			require.Failf(t, "stuck", "seed=%d: after %v of simulated time: sent %v, received %v", s.seed, limit, next, got)
		}
	}
	res := streamResult{simTime: s.now.Sub(epoch)}
	for _, e := range s.engines {
		res.stats = append(res.stats, e.Stats())
	}
	return res
}

// TestExactlyOnceInOrderUnderLossReorderDuplication is the property the layer
// exists for: for every seed, 10^4 packets each direction under 10% loss, 30%
// reordering and 1% duplication arrive exactly once, in order, intact.
func TestExactlyOnceInOrderUnderLossReorderDuplication(t *testing.T) {
	nc := netConfig{Loss: 0.10, Reorder: 0.30, Dup: 0.01, Latency: 50 * time.Microsecond, ReorderDelay: 500 * time.Microsecond}
	for _, seed := range seeds(t, 10) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			reportSeed(t, seed)
			s := newSimNet(t, seed, nc, Config{RTOMin: time.Millisecond, RTOInit: 2 * time.Millisecond, AckDelay: 200 * time.Microsecond}, 2)
			res := exchange(t, s, 10_000, false, 10*time.Minute)
			st := res.stats
			t.Logf("seed=%d: simulated %v; rank 0: %+v", seed, res.simTime, st[0])
			for r := range st {
				require.Equal(t, uint64(10_000), st[r].Delivered, "seed=%d", seed)
				require.Zero(t, st[r].Malformed, "seed=%d", seed)
				require.Zero(t, st[r].DeadPeers, "seed=%d", seed)
				require.NotZero(t, st[r].Retransmits, "seed=%d: 10%% loss without retransmission?", seed)
				require.NotZero(t, st[r].Reordered, "seed=%d", seed)
			}
		})
	}
}

// TestFourRanksAllToAllWithSelf runs a small job, every rank sending to every
// rank including itself, over the faulty network.
func TestFourRanksAllToAllWithSelf(t *testing.T) {
	nc := netConfig{Loss: 0.05, Reorder: 0.3, Dup: 0.02, Latency: 20 * time.Microsecond, ReorderDelay: 300 * time.Microsecond}
	for _, seed := range seeds(t, 3) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			reportSeed(t, seed)
			s := newSimNet(t, seed, nc, Config{Window: 32, RTOMin: time.Millisecond, AckDelay: 100 * time.Microsecond}, 4)
			exchange(t, s, 1000, true, 10*time.Minute)
		})
	}
}

// TestSequenceNumberWrap starts every stream just below 2^32 so that the
// sequence numbers wrap (skipping 0, which means "not sequenced") while
// packets are lost and reordered.
func TestSequenceNumberWrap(t *testing.T) {
	nc := netConfig{Loss: 0.1, Reorder: 0.3, Dup: 0.01, Latency: 50 * time.Microsecond, ReorderDelay: 500 * time.Microsecond}
	for _, seed := range seeds(t, 3) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			reportSeed(t, seed)
			s := newSimNet(t, seed, nc, Config{Window: 64, RTOMin: time.Millisecond, InitialSeq: 1<<32 - 300}, 2)
			sawWrap := false
			s.drop = func(src, dst int, pkt []byte) bool {
				var h wire.Header
				var args [wire.MaxArgs]uint64
				_, err := wire.Decode(pkt, &h, &args)
				require.NoError(t, err)
				if h.Kind != wire.KindAck || h.Seq != 0 {
					require.NotZero(t, h.Seq, "seed=%d: data packet with Seq 0", seed)
				}
				if h.Seq != 0 && h.Seq < 1000 {
					sawWrap = true
				}
				return false
			}
			exchange(t, s, 2000, false, 10*time.Minute)
			require.True(t, sawWrap, "seed=%d: sequence numbers never wrapped", seed)
		})
	}
}

func TestUnwrapSerialArithmetic(t *testing.T) {
	require.Equal(t, uint32(1), wireSeq(1))
	require.Equal(t, uint32(1<<32-1), wireSeq(1<<32-1))
	require.Equal(t, uint32(1), wireSeq(1<<32), "0 is skipped")
	for _, ref := range []uint64{1, 2, 1000, 1<<32 - 5, 1 << 32, 1<<32 + 7, 5 << 32} {
		for _, d := range []int64{-1000, -1, 0, 1, 1000, 1 << 20} {
			n := int64(ref) + d
			if n < 1 {
				continue
			}
			got, ok := unwrap(wireSeq(uint64(n)), ref)
			require.True(t, ok)
			require.Equal(t, uint64(n), got, "ref %d d %d", ref, d)
		}
	}
	_, ok := unwrap(0, 5)
	require.False(t, ok, "wire value 0 is not a sequence number")
}
