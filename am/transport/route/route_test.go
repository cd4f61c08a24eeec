package route_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/loop"
	"github.com/amgo-hpc/amgo/am/transport/route"
	"github.com/amgo-hpc/amgo/am/transport/sim"
	_ "github.com/amgo-hpc/amgo/am/transport/tcp"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
	_ "github.com/amgo-hpc/amgo/am/transport/udp"
	"github.com/amgo-hpc/amgo/internal/wire"
)

func loopJob(n int) ([]transport.Transport, error) { return loop.NewJob(n, nil) }

// layouts place the ranks of an n-rank job on nodes.
var layouts = map[string]func(r int) int{
	"alternate": func(r int) int { return r % 2 }, // neighbours on different nodes
	"pairs":     func(r int) int { return r / 2 }, // 0,1 share a node; 2,3 the next
}

func build(t *testing.T, n int, place func(int) int, between func(int) ([]transport.Transport, error)) []transport.Transport {
	nodes := make([]int, n)
	for r := range nodes {
		nodes[r] = place(r)
	}
	ts, err := route.Build(nodes, loopJob, between)
	require.NoError(t, err)
	return ts
}

// The conformance suite on mixed jobs: loop within a node, and between
// nodes loop or sim with loss, reordering and duplication (which route wraps
// in the reliability layer for those peers only).
func TestConformance(t *testing.T) {
	for name, place := range layouts {
		t.Run(name+"/loop+loop", func(t *testing.T) {
			transporttest.Run(t, func(t *testing.T, n int) []transport.Transport { return build(t, n, place, loopJob) })
		})
		t.Run(name+"/loop+sim", func(t *testing.T) {
			transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
				cfg := sim.Config{Seed: 5, Loss: 0.05, Reorder: 0.2, Duplicate: 0.01}
				if strings.HasSuffix(t.Name(), "/NoAllocs") {
					cfg = sim.Config{Seed: 5} // a loss comes back only after a retransmission timeout
				}
				return build(t, n, place, func(n int) ([]transport.Transport, error) { return sim.NewJob(n, cfg) })
			})
		})
	}
}

// Each peer goes by its own network, with that network's capabilities.
func TestRoutesByPeer(t *testing.T) {
	ts := build(t, 4, layouts["pairs"], func(n int) ([]transport.Transport, error) { return sim.NewJob(n, sim.Config{Seed: 1}) })
	defer func() {
		for _, tr := range ts {
			tr.Close()
		}
	}()
	rt := ts[0].(*route.Transport)
	require.Equal(t, "loop", rt.Network(0))
	require.Equal(t, "loop", rt.Network(1))
	require.Equal(t, "sim+reliable", rt.Network(2))
	require.Equal(t, "", rt.Network(4))
	require.True(t, rt.PeerCaps(1).Get)
	require.False(t, rt.PeerCaps(3).Get, "no single copy across nodes")
	require.True(t, rt.Caps().Ordered && rt.Caps().Reliable)
	err := rt.Get(2, 0, make([]byte, 8))
	require.ErrorIs(t, err, transport.ErrGetUnsupported)
	err = rt.Put(3, 0, make([]byte, 8))
	require.ErrorIs(t, err, transport.ErrPutUnsupported)
	err = rt.Send(7, []byte{1}, nil)
	var pe *transport.PeerError
	require.True(t, errors.As(err, &pe))
	require.Equal(t, 7, pe.Rank)
}

// A rank asleep in Wait wakes for a packet from either network: from a
// rank of its node (rank 1 from 2) and from another node (1 from 0, 0 from 1).
func TestWaitWakesForEitherNetwork(t *testing.T) {
	ts := build(t, 3, func(r int) int { return min(r, 1) }, loopJob) // 0 alone; 1 and 2 together
	defer func() {
		for _, tr := range ts {
			tr.Close()
		}
	}()
	var buf [wire.MaxHeaderLen]byte
	hdr := buf[:wire.Encode(buf[:], &wire.Header{Kind: wire.KindRequestShort, Handler: 1, NArgs: 1}, []uint64{7})]
	for _, c := range []struct{ waiter, sender int }{{1, 2}, {1, 0}, {0, 1}} {
		done := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			_ = ts[c.waiter].Wait(5 * time.Second)
			done <- time.Since(start)
		}()
		time.Sleep(20 * time.Millisecond) // let it fall asleep
		require.NoError(t, ts[c.sender].Send(c.waiter, hdr, nil))
		select {
		case d := <-done:
			require.Less(t, d, 4*time.Second, "rank %d woke for rank %d's packet", c.waiter, c.sender)
		case <-time.After(5 * time.Second):
			t.Fatalf("rank %d did not wake for rank %d's packet", c.waiter, c.sender)
		}
		var got transporttest.Last
		require.NoError(t, transporttest.RecvOne(ts[c.waiter], &got, false))
		require.Equal(t, c.sender, got.Src)
	}
}

// countPolls is a network that counts its Polls and delivers nothing.
type countPolls struct {
	transport.Transport
	polls int
}

func (c *countPolls) Wake() { c.Transport.(transport.Waker).Wake() }

func (c *countPolls) Poll(r transport.Receiver, max int) (int, error) {
	c.polls++
	return c.Transport.Poll(r, max)
}

// twoNodes is rank 0 of a 3-rank job on two nodes: ranks 0 and 1 share a
// node-local loop network, and a second loop network reaches rank 2 (alone
// on its node). wrap may wrap rank 0's end of each network before route.New
// takes them. It returns rank 0's route and rank 2's end of the network
// between the nodes; everything is closed when the test ends.
func twoNodes(t *testing.T, wrap func(local, between transport.Transport) (transport.Transport, transport.Transport)) (rt *route.Transport, far transport.Transport) {
	t.Helper()
	locals, err := loop.NewJob(2, nil)
	require.NoError(t, err)
	alls, err := loop.NewJob(3, nil)
	require.NoError(t, err)
	others, err := loop.NewJob(1, nil) // rank 2's node
	require.NoError(t, err)
	local, between := wrap(locals[0], alls[0])
	rt, err = route.New(0, 3, []route.Net{{T: local, Ranks: []int{0, 1}, Peers: []int{0, 1}}, {T: between, Peers: []int{2}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		rt.Close()
		for _, tr := range []transport.Transport{locals[1], alls[1], alls[2], others[0]} {
			tr.Close()
		}
	})
	return rt, alls[2]
}

// A network between nodes that has been quiet is polled only every so
// often, and becomes hot again when something is sent over it or it
// delivers; the node-local network is polled every time.
func TestColdNetworkIsPolledSeldom(t *testing.T) {
	var local, between *countPolls
	rt, far := twoNodes(t, func(l, b transport.Transport) (transport.Transport, transport.Transport) {
		local, between = &countPolls{Transport: l}, &countPolls{Transport: b}
		return local, between
	})
	var rx transporttest.Last
	poll := func(k int) {
		for range k {
			_, err := rt.Poll(&rx, 8)
			require.NoError(t, err)
		}
	}
	poll(300) // 256 quiet polls make it cold
	require.Equal(t, 300, local.polls)
	require.Equal(t, 256, between.polls)
	poll(4096)
	require.Equal(t, 4396, local.polls)
	require.InDelta(t, 256+2, between.polls, 1, "cold: every 2048th Poll")

	// A send over it makes it hot.
	var buf [wire.MaxHeaderLen]byte
	hdr := buf[:wire.Encode(buf[:], &wire.Header{Kind: wire.KindRequestShort, Handler: 1}, nil)]
	require.NoError(t, rt.Send(2, hdr, nil))
	before := between.polls
	poll(10)
	require.Equal(t, before+10, between.polls, "hot after a send")

	// A packet from another node keeps it hot while it arrives.
	poll(300)
	require.NoError(t, transporttest.SendRetry(far, 0, hdr, nil, nil))
	for i := 0; rx.N == 0; i++ {
		require.Less(t, i, 2048, "the cold turn finds the packet")
		poll(1)
	}
	require.Equal(t, 2, rx.Src)
	before = between.polls
	poll(10)
	require.Equal(t, before+10, between.polls, "hot after it delivered")
}

// Networks that do not make one job are refused: a rank nobody reaches, a
// network whose size does not match its ranks, a first network that cannot
// be woken by the others' waiters.
func TestNewRefusesBadLayouts(t *testing.T) {
	loops, err := loop.NewJob(2, nil)
	require.NoError(t, err)
	sims, err := sim.NewJob(2, sim.Config{Seed: 1})
	require.NoError(t, err)
	defer func() {
		for _, tr := range append(loops, sims...) {
			tr.Close()
		}
	}()
	for name, nets := range map[string][]route.Net{
		"unreached":  {{T: loops[0], Peers: []int{0}}},
		"size":       {{T: loops[0], Ranks: []int{0, 1, 2}, Peers: []int{0, 1}}},
		"not waker":  {{T: sims[0], Peers: []int{0}}, {T: loops[0], Peers: []int{1}}},
		"no network": nil,
	} {
		_, err := route.New(0, 2, nets)
		require.ErrorIs(t, err, route.ErrLayout, name)
	}
}

// openSockets opens an n-rank job over a socket network (tcp or udp) on
// loopback, its Wait without spin, each rank on its own goroutine (the
// networks fence while they open).
func openSockets(t *testing.T, network, jobID string, n int) []transport.Transport {
	bs := transporttest.NewBootstraps(n, jobID)
	ts := make([]transport.Transport, n)
	errs := make(chan error, n)
	for r := range bs {
		go func() {
			var err error
			ts[r], err = transport.Open(network, bs[r], map[string]string{"iface": "127.0.0.1", "spin": "0s"})
			errs <- err
		}()
	}
	for range bs {
		require.NoError(t, <-errs)
	}
	return ts
}

// A Wait sleeps on the network that delivered last, so that a rank whose
// traffic comes from other nodes sleeps in the socket network's own Wait
// (woken by the kernel directly), and still wakes for a packet of its node
// through that network's Wake. Ranks 0 and 1 share a node (loop), rank 2 is
// on another, tcp or udp between nodes; a sender of the same rank as the waiter is
// another goroutine of that rank.
func TestWaitSleepsWhereTrafficComesFrom(t *testing.T) {
	// udp is wrapped in the reliability layer, which has a Wake over a
	// network that has one.
	for _, between := range []string{"tcp", "udp"} {
		t.Run(between, func(t *testing.T) { waitSleepsWhereTrafficComesFrom(t, between) })
	}
}

func waitSleepsWhereTrafficComesFrom(t *testing.T, between string) {
	tcps := openSockets(t, between, "routetest-primary-"+between, 3)
	locals, err := loop.NewJob(2, nil)
	require.NoError(t, err)
	alone, err := loop.NewJob(1, nil)
	require.NoError(t, err)
	var ts [3]*route.Transport
	for r := range 3 {
		nets := []route.Net{{T: alone[0], Ranks: []int{2}, Peers: []int{2}}, {T: tcps[2], Peers: []int{0, 1}}}
		if r < 2 {
			nets = []route.Net{{T: locals[r], Ranks: []int{0, 1}, Peers: []int{0, 1}}, {T: tcps[r], Peers: []int{2}}}
		}
		ts[r], err = route.New(r, 3, nets)
		require.NoError(t, err)
	}
	defer func() {
		for _, tr := range ts {
			tr.Close()
		}
	}()
	// The header names its sender: the reliability layer over udp drops a
	// packet whose header names another rank than the one it came from.
	var bufs [3][wire.MaxHeaderLen]byte
	var hdrs [3][]byte
	for r := range hdrs {
		hdrs[r] = bufs[r][:wire.Encode(bufs[r][:], &wire.Header{Kind: wire.KindRequestShort, Handler: 1, NArgs: 1, Src: uint32(r)}, []uint64{7})]
	}
	// Each round: the waiter sleeps, the sender's packet must wake it, and
	// the Wait after it sleeps on the network that packet came by.
	for i, c := range []struct{ waiter, sender, primary int }{
		{1, 2, 1}, {1, 0, 0}, {1, 2, 1}, {1, 2, 1}, {1, 0, 0}, {1, 0, 0}, {2, 1, 1}, {2, 0, 1},
		// Rank 2 is alone on its node: its node-local network has no
		// waiter, and a send to itself from another goroutine wakes it
		// while it sleeps on tcp.
		{2, 2, 0}, {2, 1, 1}, {2, 2, 0}, {2, 0, 1},
	} {
		var got transporttest.Last
		wait := func() time.Duration {
			done := make(chan time.Duration, 1)
			go func() {
				start := time.Now()
				for got.N == 0 {
					_ = ts[c.waiter].Wait(5 * time.Second)
					if _, err := ts[c.waiter].Poll(&got, 1); err != nil {
						break
					}
				}
				done <- time.Since(start)
			}()
			time.Sleep(20 * time.Millisecond) // let it fall asleep
			require.NoError(t, transporttest.SendRetry(ts[c.sender], c.waiter, hdrs[c.sender], nil, nil))
			select {
			case d := <-done:
				return d
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: rank %d did not wake for rank %d's packet", i, c.waiter, c.sender)
				return 0
			}
		}
		d := wait()
		// A lost wake shows as a sleep until something else ends it
		// (seconds): the waiter's Wait is for 5 s.
		require.Less(t, d, time.Second, "round %d: rank %d woke for rank %d's packet", i, c.waiter, c.sender)
		require.Equal(t, c.sender, got.Src)
		// Sleep once more, briefly, to see which network it picks now. The
		// network that delivered is passed over while its waiter goroutine
		// has not yet left that network's Wait (it may still be on its way
		// out after waking this rank), so brief sleeps are allowed for up
		// to two seconds (a loaded machine, as under go test ./..., may
		// not run that goroutine for tens of milliseconds): with no more
		// traffic the choice must settle on it.
		for settle := time.Now(); time.Since(settle) < 2*time.Second; {
			require.NoError(t, ts[c.waiter].Wait(time.Millisecond))
			if ts[c.waiter].Primary() == c.primary {
				break
			}
		}
		require.Equal(t, c.primary, ts[c.waiter].Primary(), "round %d: rank %d after a packet from rank %d", i, c.waiter, c.sender)
	}
}

// recordWaits is a network whose Waits are recorded: how long each was
// asked to sleep.
type recordWaits struct {
	transport.Transport
	mu    sync.Mutex
	waits []time.Duration
}

func (r *recordWaits) Wait(d time.Duration) error {
	r.mu.Lock()
	r.waits = append(r.waits, d)
	r.mu.Unlock()
	return r.Transport.Wait(d)
}

func (r *recordWaits) Wake() { r.Transport.(transport.Waker).Wake() }

func (r *recordWaits) Sleep(d time.Duration) error { return r.Transport.(transport.Sleeper).Sleep(d) }

// A rank that sleeps on its node's network while the network between nodes
// is cold hands the whole wait to it, with the other network watched from
// the start: a shorter timed sleep on the node's network alone first would
// end up to the thread's timer slack late (a millisecond in ranks amrun
// starts), and a packet from another node would wait that long.
func TestWaitIsNeverATimedSliceOnOneNetwork(t *testing.T) {
	tcps := openSockets(t, "tcp", "routetest-slice", 3)
	// Ranks 0 and 1 share a node; rank 2 is on another.
	locals, err := loop.NewJob(2, nil)
	require.NoError(t, err)
	alone, err := loop.NewJob(1, nil)
	require.NoError(t, err)
	rec := &recordWaits{Transport: locals[0]}
	var ts [3]*route.Transport
	for r, nets := range [][]route.Net{
		{{T: rec, Ranks: []int{0, 1}, Peers: []int{0, 1}}, {T: tcps[0], Peers: []int{2}}},
		{{T: locals[1], Ranks: []int{0, 1}, Peers: []int{0, 1}}, {T: tcps[1], Peers: []int{2}}},
		{{T: alone[0], Ranks: []int{2}, Peers: []int{2}}, {T: tcps[2], Peers: []int{0, 1}}},
	} {
		ts[r], err = route.New(r, 3, nets)
		require.NoError(t, err)
		defer ts[r].Close()
	}
	me := ts[0]

	var buf [wire.MaxHeaderLen]byte
	hdr := buf[:wire.Encode(buf[:], &wire.Header{Kind: wire.KindRequestShort, Handler: 1, NArgs: 1}, []uint64{7})]
	// A packet from its node makes the node's network the one that
	// delivered last; polls with nothing more let the network between nodes
	// go cold.
	require.NoError(t, transporttest.SendRetry(ts[1], 0, hdr, nil, nil))
	var got transporttest.Last
	for range 4096 {
		_, err := me.Poll(&got, 1)
		require.NoError(t, err)
	}
	require.Equal(t, 1, got.Src)
	rec.mu.Lock()
	rec.waits = nil
	rec.mu.Unlock()
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = transporttest.SendRetry(ts[2], 0, hdr, nil, nil)
	}()
	got = transporttest.Last{}
	for got.N == 0 {
		require.NoError(t, me.Wait(10*time.Second))
		_, err := me.Poll(&got, 1)
		require.NoError(t, err)
	}
	require.Equal(t, 2, got.Src)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.NotEmpty(t, rec.waits)
	require.Equal(t, 10*time.Second, rec.waits[0], "the node's network was asked to sleep %v first", rec.waits)
}

// Hold and Flush reach every network that is a transport.Batcher, and only
// those.
func TestBatcherPassedOn(t *testing.T) {
	var between *transporttest.Batching
	rt, _ := twoNodes(t, func(l, b transport.Transport) (transport.Transport, transport.Transport) {
		between = &transporttest.Batching{Transport: b}
		return l, between
	})
	var b transport.Batcher = rt
	b.Hold()
	b.Hold()
	require.NoError(t, b.Flush())
	require.EqualValues(t, 2, between.Holds.Load())
	require.EqualValues(t, 1, between.Flushes.Load())
}
