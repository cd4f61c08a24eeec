package sim

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/internal/reliable"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
	"github.com/amgo-hpc/amgo/internal/wire"
)

var seedFlag = flag.Int64("sim.seed", 0, "seed of the randomized tests (default: "+EnvSeed+", else a fixed seed per test)")

// testSeed returns the seed a randomized test runs with, and makes the test
// print it (and how to replay it) when it fails.
func testSeed(t testing.TB, def int64) int64 {
	seed := def
	if *seedFlag != 0 {
		seed = *seedFlag
	} else if s := os.Getenv(EnvSeed); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		require.NoError(t, err, EnvSeed)
		seed = v
	}
	t.Logf("seed=%d", seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed=%d: replay with %s=%d go test -run '%s' ./am/transport/sim", seed, EnvSeed, seed, t.Name())
		}
	})
	return seed
}

// wrapCfg are timers for an in-process network: round trips of microseconds.
var wrapCfg = reliable.Config{RTOMin: time.Millisecond, RTOInit: 2 * time.Millisecond, RTOMax: 50 * time.Millisecond,
	AckDelay: 100 * time.Microsecond}

func wrapJob(t *testing.T, n int, cfg Config) []transport.Transport {
	raw, err := NewJob(n, cfg)
	require.NoError(t, err)
	ts := make([]transport.Transport, n)
	for r := range raw {
		w, err := reliable.Wrap(raw[r], wrapCfg, nil)
		require.NoError(t, err)
		ts[r] = w
	}
	return ts
}

// TestConformance runs the transport conformance suite over reliable.Wrap of
// sim with 10% loss, 30% reordering and 1% duplication. NoAllocs runs without
// faults: it requires every Send to be handed over by the receiver's very next
// Poll, which no lossy network can do (a loss comes back only after a
// retransmission timeout).
func TestConformance(t *testing.T) {
	seed := testSeed(t, 11)
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		cfg := Config{Seed: seed, Loss: 0.1, Reorder: 0.3, Duplicate: 0.01}
		if strings.HasSuffix(t.Name(), "/NoAllocs") {
			cfg = Config{Seed: seed}
		}
		return wrapJob(t, n, cfg)
	})
}

// TestConformanceDelayed: the same with 50 us of latency on every packet.
func TestConformanceDelayed(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	seed := testSeed(t, 12)
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		cfg := Config{Seed: seed, Loss: 0.05, Reorder: 0.3, Duplicate: 0.01, Delay: 50 * time.Microsecond}
		if strings.HasSuffix(t.Name(), "/NoAllocs") {
			cfg = Config{Seed: seed}
		}
		return wrapJob(t, n, cfg)
	})
}

type rec struct {
	src  []int
	seqs []uint32
}

func (r *rec) Deliver(src int, pkt []byte) {
	r.src = append(r.src, src)
	if len(pkt) >= 4 {
		r.seqs = append(r.seqs, binary.LittleEndian.Uint32(pkt))
	}
}

// runPattern sends k numbered packets from 0 to 1 on one goroutine, with
// reordering delays long enough to matter only through the sequence of
// faults, and returns what arrived and the receiver's stats.
func runPattern(t *testing.T, seed int64, k int) (rec, Stats) {
	ts, err := NewJob(2, Config{Seed: seed, Loss: 0.2, Reorder: 0.3, Duplicate: 0.1, ReorderWindow: time.Hour})
	require.NoError(t, err)
	var b [4]byte
	for i := 0; i < k; i++ {
		binary.LittleEndian.PutUint32(b[:], uint32(i))
		require.NoError(t, ts[0].Send(1, b[:], nil))
	}
	var r rec
	_, err = ts[1].Poll(&r, 1<<20)
	require.NoError(t, err)
	return r, ts[1].(*Transport).Stats()
}

// The fate of every packet (lost, duplicated, held back) depends only on the
// seed and its position on the link.
func TestDeterministic(t *testing.T) {
	seed := testSeed(t, 5)
	a, sa := runPattern(t, seed, 2000)
	b, sb := runPattern(t, seed, 2000)
	require.Equal(t, a, b, "seed=%d: two runs differ", seed)
	require.Equal(t, sa, sb)
	c, _ := runPattern(t, seed+1, 2000)
	require.NotEqual(t, a, c, "another seed, the same faults?")
	// Rates near the configured probabilities.
	require.InDelta(t, 0.1*2000, float64(sa.Duplicated), 60)
	require.InDelta(t, 0.2*2200, float64(sa.Lost), 90)
	require.Greater(t, sa.Reordered, uint64(0))
	// Held-back packets (an hour) are not delivered yet; all others in order.
	for i := 1; i < len(a.seqs); i++ {
		require.LessOrEqual(t, a.seqs[i-1], a.seqs[i])
	}
	require.Equal(t, sa.Delivered, uint64(len(a.seqs)))
	require.Equal(t, uint64(2000)+sa.Duplicated, sa.Lost+sa.Reordered+sa.Delivered)
}

// Different links have independent generators: traffic on one does not
// change the faults on another.
func TestLinksIndependent(t *testing.T) {
	seed := testSeed(t, 6)
	fates := func(noise bool) []uint32 {
		ts, err := NewJob(3, Config{Seed: seed, Loss: 0.3})
		require.NoError(t, err)
		var b [4]byte
		for i := 0; i < 500; i++ {
			binary.LittleEndian.PutUint32(b[:], uint32(i))
			require.NoError(t, ts[0].Send(1, b[:], nil))
			if noise {
				require.NoError(t, ts[2].Send(1, b[:], nil))
				require.NoError(t, ts[0].Send(2, b[:], nil))
			}
		}
		var r rec
		_, err = ts[1].Poll(&r, 1<<20)
		require.NoError(t, err)
		var from0 []uint32
		for i, s := range r.src {
			if s == 0 {
				from0 = append(from0, r.seqs[i])
			}
		}
		return from0
	}
	require.Equal(t, fates(false), fates(true), "seed=%d", seed)
}

func TestDelay(t *testing.T) {
	ts, err := NewJob(2, Config{Delay: 20 * time.Millisecond})
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, ts[0].Send(1, []byte("abcd"), nil))
	var r rec
	n, err := ts[1].Poll(&r, 10)
	require.NoError(t, err)
	require.Zero(t, n, "delivered before its delay")
	for n == 0 {
		require.NoError(t, ts[1].Wait(time.Second))
		n, err = ts[1].Poll(&r, 10)
		require.NoError(t, err)
	}
	el := time.Since(start)
	require.GreaterOrEqual(t, el, 20*time.Millisecond)
	require.Less(t, el, 2*time.Second)
}

// A partition loses everything between its pairs, in both directions, for
// its interval only.
func TestPartition(t *testing.T) {
	ts, err := NewJob(3, Config{Partitions: []Partition{{Pairs: [][2]int{{0, 1}}, Until: 100 * time.Millisecond}}})
	require.NoError(t, err)
	var r1, r0, r2 rec
	require.NoError(t, ts[0].Send(1, []byte("lost"), nil))
	require.NoError(t, ts[1].Send(0, []byte("lost"), nil))
	require.NoError(t, ts[0].Send(2, []byte("kept"), nil))
	for _, c := range []struct {
		tr transport.Transport
		r  *rec
		n  int
	}{{ts[1], &r1, 0}, {ts[0], &r0, 0}, {ts[2], &r2, 1}} {
		n, err := c.tr.Poll(c.r, 10)
		require.NoError(t, err)
		require.Equal(t, c.n, n)
	}
	require.Equal(t, uint64(1), ts[1].(*Transport).Stats().Partitioned)
	time.Sleep(110 * time.Millisecond)
	require.NoError(t, ts[0].Send(1, []byte("heal"), nil))
	n, err := ts[1].Poll(&r1, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// A partition that heals is invisible above the reliability layer: packets
// sent during it arrive afterwards, in order.
func TestPartitionHealsUnderWrap(t *testing.T) {
	raw, err := NewJob(2, Config{Seed: testSeed(t, 7), Partitions: []Partition{{Pairs: [][2]int{{0, 1}}, Until: 300 * time.Millisecond}}})
	require.NoError(t, err)
	var ws [2]transport.Transport
	for i := range ws {
		ws[i], err = reliable.Wrap(raw[i], wrapCfg, nil)
		require.NoError(t, err)
		defer ws[i].Close()
	}
	var r rec
	var b [wire.HeaderLen]byte
	const k = 20
	for i := 0; i < k; i++ {
		h := wire.Header{Kind: wire.KindRequestShort, Src: 0, Off: uint32(i)} // numbered in a core field
		wire.Encode(b[:], &h, nil)
		require.NoError(t, ws[0].Send(1, b[:], nil))
	}
	deadline := time.Now().Add(10 * time.Second)
	fr := &fragRec{}
	for len(fr.frags) < k {
		_, err := ws[1].Poll(fr, 64)
		require.NoError(t, err)
		_, err = ws[0].Poll(&r, 64)
		require.NoError(t, err)
		require.NoError(t, ws[1].Wait(time.Millisecond))
		require.True(t, time.Now().Before(deadline), "got %v", fr.frags)
	}
	for i, f := range fr.frags {
		require.Equal(t, uint32(i), f)
	}
	require.Greater(t, raw[1].(*Transport).Stats().Partitioned, uint64(0))
}

type fragRec struct{ frags []uint32 }

func (f *fragRec) Deliver(src int, pkt []byte) {
	var h wire.Header
	var args [wire.MaxArgs]uint64
	if _, err := wire.Decode(pkt, &h, &args); err == nil {
		f.frags = append(f.frags, h.Off)
	}
}

// A rank that dies (after its 3rd Send) stops sending and receiving; above
// the reliability layer its peer reports it dead (transport.ErrPeer naming it).
func TestDeathDetectedAboveWrap(t *testing.T) {
	raw, err := NewJob(2, Config{Deaths: []Death{{Rank: 1, AfterSends: 3}}})
	require.NoError(t, err)
	cfg := wrapCfg
	cfg.DeadAfter = 200 * time.Millisecond
	var ws [2]transport.Transport
	for i := range ws {
		ws[i], err = reliable.Wrap(raw[i], cfg, nil)
		require.NoError(t, err)
		defer ws[i].Close()
	}
	var b [wire.HeaderLen]byte
	h := wire.Header{Kind: wire.KindRequestShort, Src: 0}
	wire.Encode(b[:], &h, nil)
	deadline := time.Now().Add(10 * time.Second)
	var perr error
	for perr == nil {
		if err := ws[0].Send(1, b[:], nil); err != nil && !errors.Is(err, transport.ErrWouldBlock) {
			perr = err
			break
		}
		_, perr = ws[0].Poll(&rec{}, 64)
		_, _ = ws[1].Poll(&fragRec{}, 64)
		require.True(t, time.Now().Before(deadline), "the death was never reported")
		time.Sleep(time.Millisecond)
	}
	require.ErrorIs(t, perr, transport.ErrPeer)
	require.ErrorIs(t, perr, reliable.ErrPeerDead)
	require.Contains(t, perr.Error(), "rank 1")
	require.Greater(t, raw[1].(*Transport).Stats().Dead, uint64(0))

	// Kill does the same on demand.
	raw2, err := NewJob(2, Config{})
	require.NoError(t, err)
	raw2[1].(*Transport).Kill()
	require.NoError(t, raw2[0].Send(1, b[:], nil))
	n, err := raw2[1].Poll(&rec{}, 10)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestQueueLimit(t *testing.T) {
	ts, err := NewJob(2, Config{QueueLimit: 10})
	require.NoError(t, err)
	for i := 0; i < 15; i++ {
		require.NoError(t, ts[0].Send(1, []byte("x"), nil))
	}
	require.Equal(t, uint64(5), ts[1].(*Transport).Stats().Overflowed)
	n, err := ts[1].Poll(&rec{}, 100)
	require.NoError(t, err)
	require.Equal(t, 10, n)
}

func TestNewJobErrors(t *testing.T) {
	for _, c := range []Config{{Loss: -0.1}, {Reorder: 1.5}, {Duplicate: 2}, {Delay: -1}, {MaxPacket: 100},
		{Partitions: []Partition{{Pairs: [][2]int{{0, 5}}}}}, {Deaths: []Death{{Rank: 9}}}} {
		_, err := NewJob(2, c)
		require.Error(t, err, "%+v", c)
	}
	_, err := NewJob(0, Config{})
	require.Error(t, err)
	ts, err := NewJob(2, Config{})
	require.NoError(t, err)
	require.ErrorIs(t, ts[0].Send(2, nil, nil), transport.ErrPeer)
	require.ErrorIs(t, ts[0].Send(1, make([]byte, DefaultMaxPacket+1), nil), transport.ErrTooLarge)
	c := ts[0].Caps()
	require.Equal(t, transport.Caps{Name: "sim", MaxPacket: DefaultMaxPacket, Wakeup: true}, c)
}

func TestParseOptions(t *testing.T) {
	cfg, err := ParseOptions(map[string]string{"seed": "42", "loss": "10%", "reorder": "0.3", "dup": "0.01",
		"delay": "5us", "reorder_window": "1ms", "max_packet": "9000", "queue": "100"})
	require.NoError(t, err)
	require.Equal(t, Config{Seed: 42, Loss: 0.1, Reorder: 0.3, Duplicate: 0.01, Delay: 5 * time.Microsecond,
		ReorderWindow: time.Millisecond, MaxPacket: 9000, QueueLimit: 100}, cfg)
	t.Setenv("AMGO_SIM_LOSS", "0.25")
	t.Setenv(EnvSeed, "7")
	cfg, err = ParseOptions(nil)
	require.NoError(t, err)
	require.Equal(t, Config{Seed: 7, Loss: 0.25}, cfg)
	for _, o := range []map[string]string{{"seed": "x"}, {"loss": "2"}, {"delay": "soon"}, {"queue": "-1"}} {
		_, err := ParseOptions(o)
		require.Error(t, err, "%v", o)
	}
}

func TestFactory(t *testing.T) {
	tr, err := transport.Open("sim", transporttest.NewBootstraps(1, "one")[0], map[string]string{"loss": "0"})
	require.NoError(t, err)
	require.Equal(t, "sim", tr.Caps().Name)
	require.NoError(t, tr.Close())
	require.NoError(t, tr.Close())
	_, err = tr.Poll(&rec{}, 1)
	require.ErrorIs(t, err, transport.ErrClosed)
	_, err = transport.Open("sim", transporttest.NewBootstraps(2, "two")[0], nil)
	require.ErrorContains(t, err, "NewJob")
}

func ExampleNewJob() {
	ts, _ := NewJob(2, Config{Seed: 1, Loss: 0.1, Reorder: 0.3, Duplicate: 0.01})
	fmt.Println(len(ts), ts[0].Caps().Ordered, ts[0].Caps().Reliable)
	// Output: 2 false false
}
