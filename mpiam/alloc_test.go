package mpiam

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// The eager path allocates nothing in steady state: a blocking Send+Recv
// ping-pong of 8 bytes, measured on rank 0 with testing.AllocsPerRun (which
// counts the whole process: both ranks and their polling).
func TestEagerPingPongZeroAllocs(t *testing.T) {
	testPingPongZeroAllocs(t, 8, 200, 2000)
}

// The rendezvous path allocates nothing in steady state either: a blocking
// ping-pong of 16 KiB (past every network's eager limit; a single-copy get on
// loop and shm, a clear-to-send and a store elsewhere). Before the
// deferred-work queue kept its array, every rendezvous receive allocated it
// anew.
func TestRendezvousPingPongZeroAllocs(t *testing.T) {
	testPingPongZeroAllocs(t, 16<<10, 200, 1000)
}

// testPingPongZeroAllocs checks, on every network, that a blocking ping-pong
// of n bytes allocates nothing after warm round trips, over runs round trips
// (a tenth of each on sim, whose simulated losses make a round trip wait for a
// retransmission timeout now and then).
func testPingPongZeroAllocs(t *testing.T, n, warm, runs int) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, nw := range networks {
		warm, runs := warm, runs
		if strings.Contains(nw, "sim") { // sim, or sim between nodes
			warm, runs = warm/10, runs/10
		}
		t.Run(nw, func(t *testing.T) {
			runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) {
				buf := make([]byte, n)
				pingpong := func() {
					if err := Send(w, buf, 1, 1); err != nil {
						panic(err)
					}
					if _, err := Recv(w, buf, 1, 2); err != nil {
						panic(err)
					}
				}
				if w.Rank() == 1 {
					for range warm + runs + 1 { // AllocsPerRun runs once more to warm up
						_, err := Recv(w, buf, 0, 1)
						r.NoError(err)
						r.NoError(Send(w, buf, 0, 2))
					}
					return
				}
				for range warm {
					pingpong()
				}
				allocs := testing.AllocsPerRun(runs, pingpong)
				r.Zero(allocs, "allocations per %d-byte round trip", n)
			})
		})
	}
}

// An eager message that arrives before its receive (a collective root's,
// a flood) allocates nothing in steady state either, whether it reuses one
// tag or brings a tag new to its context, as each nonblocking collective
// call's do: a rank sends 8 bytes to itself, probes until the message waits
// as unexpected, then receives it. The payload is copied into the message
// record; records, tag buckets and the matching nodes are recycled.
func TestUnexpectedZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, nw := range networks {
		for _, fresh := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fresh=%v", nw, fresh), func(t *testing.T) {
				runJob(t, nw, 1, Config{}, func(r *rk, w *Comm) {
					buf := make([]byte, 8)
					tag := 1
					one := func() {
						if fresh {
							tag = (tag + 1) % TagUB
						}
						if err := Send(w, buf, 0, tag); err != nil {
							panic(err)
						}
						for {
							ok, _, err := w.Iprobe(0, tag)
							if err != nil {
								panic(err)
							}
							if ok {
								break
							}
						}
						if _, err := Recv(w, buf, 0, tag); err != nil {
							panic(err)
						}
					}
					// Warm past the matching engine's 256 idle buckets; fewer
					// on sim, whose losses make a message wait for a
					// retransmission now and then.
					warm, runs := 2048, 500
					if strings.Contains(nw, "sim") { // sim, or sim between nodes
						warm, runs = 300, 100
					}
					for range warm {
						one()
					}
					allocs := testing.AllocsPerRun(runs, one)
					r.Zero(allocs, "allocations per unexpected message")
				})
			})
		}
	}
}

// Nonblocking operations allocate nothing in steady state: a window of 64
// Irecv and 64 Isend of 8 bytes from a rank to itself, completed with
// Waitall, reuses the operation states (Request.recycle) and the handles
// are values in the caller's slices. Before the handles, each operation
// allocated its whole state; before handles were values, 8 bytes each.
func TestNonblockingWindowAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const window = 64
	for _, nw := range networks {
		t.Run(nw, func(t *testing.T) {
			runJob(t, nw, 1, Config{}, func(r *rk, w *Comm) {
				sbuf := make([]byte, 8)
				rbuf := make([]byte, 8*window)
				sreqs := make([]Request, window)
				rreqs := make([]Request, window)
				round := func() {
					postWindow(r, w, rbuf, rreqs)
					for j := range sreqs {
						var err error
						sreqs[j], err = Isend(w, sbuf, 0, 1)
						r.NoError(err)
					}
					r.NoError(Waitall(rreqs, nil))
					r.NoError(Waitall(sreqs, nil))
				}
				allocs, bytes := windowAllocs(round, window)
				// The fault-injecting sim network copies every packet into
				// a 2 KiB buffer of its own, and its pool grows whenever a
				// burst of reordered and duplicated packets sets a new high
				// in some runs): its bounds
				// leave room for a few such buffers per measurement. The
				// others' byte bound of 1 leaves room for the runtime's own
				// few bytes over the measurement (statistics, timers), far
				// below the 8 that one allocation per message would cost.
				maxAllocs, limit := 0.0, 1.0
				switch {
				case strings.Contains(nw, "sim"): // sim, or sim between nodes
					maxAllocs, limit = 1, 40
				case strings.Contains(nw, "udp"):
					// udp's reliability layer runs its protocol from a
					// goroutine of its own when the rank has not called
					// for an interval (a loaded machine: it failed at 1.3
					// bytes a message beside other test binaries), which
					// may grow its buffers during the measurement; 4 bytes
					// is still half of one allocation per message.
					limit = 4
				}
				r.LessOrEqual(allocs, maxAllocs, "allocations per window of %d messages", window)
				r.LessOrEqual(bytes, limit, "bytes allocated per message")
			})
		})
	}
}

// postWindow posts an 8-byte Irecv from rank 0 with tag 1 into each
// 8-byte piece of rbuf, its handle into reqs.
func postWindow(r *rk, w *Comm, rbuf []byte, reqs []Request) {
	for j := range reqs {
		var err error
		reqs[j], err = Irecv(w, rbuf[8*j:8*j+8], 0, 1)
		r.NoError(err)
	}
}

// windowAllocs runs round, a window of window messages, 20 times to warm
// up and then 50 times measured: the allocations per round
// (testing.AllocsPerRun) and the bytes allocated per message.
func windowAllocs(round func(), window int) (allocs, bytes float64) {
	for range 20 {
		round()
	}
	const rounds = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	allocs = testing.AllocsPerRun(rounds, round)
	runtime.ReadMemStats(&after)
	return allocs, float64(after.TotalAlloc-before.TotalAlloc) / float64((rounds+1)*window)
}

// An eager Isend freed rather than waited (MPI_Request_free on a send that
// completed in its call) gives its state back to the cache: a stream of
// them allocates nothing, as a window completed with Waitall does, not a
// 384-byte state per message for the collector.
func TestFreedEagerSendRecycled(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const window = 64
	runJob(t, "loop", 1, Config{}, func(r *rk, w *Comm) {
		sbuf := make([]byte, 8)
		rbuf := make([]byte, 8*window)
		rreqs := make([]Request, window)
		round := func() {
			postWindow(r, w, rbuf, rreqs)
			for range window {
				h, err := Isend(w, sbuf, 0, 1)
				r.NoError(err)
				r.NoError(h.Free())
				r.True(h.null())
			}
			r.NoError(Waitall(rreqs, nil))
		}
		_, bytes := windowAllocs(round, window)
		r.LessOrEqual(bytes, 1.0, "bytes allocated per message (see TestNonblockingWindowAllocs)")
	})
}

// BenchmarkPingPong measures a blocking Send+Recv round trip between two
// goroutine ranks, over loop and over shm, at 8 B (eager), 16 KiB (just past
// the eager limit: rendezvous, packets on shm) and 1 MiB (rendezvous,
// single-copy put), and reports ns per round trip.
func BenchmarkPingPong(b *testing.B) {
	// The lossy networks (udp, sim) run through retransmission timeouts: a
	// ping-pong there measures the timeouts, not the path.
	for _, nw := range []string{"loop", "shm", "tcp"} {
		for _, n := range []int{8, 16 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%s/%d", nw, n), func(b *testing.B) {
				benchPingPong(b, nw, n)
			})
		}
	}
}

func benchPingPong(b *testing.B, nw string, n int) {
	b.SetBytes(int64(2 * n))
	b.ReportAllocs()
	err := runBench(b, nw, 2, func(w *Comm) error {
		buf := make([]byte, n)
		peer := 1 - w.Rank()
		if err := w.Barrier(); err != nil {
			return err
		}
		if w.Rank() == 0 {
			b.ResetTimer()
		}
		for range b.N {
			if w.Rank() == 0 {
				if err := Send(w, buf, peer, 1); err != nil {
					return err
				}
				if _, err := Recv(w, buf, peer, 1); err != nil {
					return err
				}
			} else {
				if _, err := Recv(w, buf, peer, 1); err != nil {
					return err
				}
				if err := Send(w, buf, peer, 1); err != nil {
					return err
				}
			}
		}
		if w.Rank() == 0 {
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/roundtrip")
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// runBench runs fn on n ranks over network nw for a benchmark.
func runBench(b *testing.B, nw string, n int, fn func(w *Comm) error) error {
	return runJobErr(b, nw, n, Config{}, func(r *rk, w *Comm) { r.NoError(fn(w)) })
}

// A blocking neighborhood collective allocates nothing in steady state, as
// a halo exchange repeated every step needs: on a periodic ring of 2 ranks
// (both neighbors the other rank) each step runs NeighborAlltoallw with a
// strided block and a contiguous one, NeighborAlltoall, NeighborAlltoallv,
// NeighborAllgather and NeighborAllgatherv. Each call used to allocate its
// blocks, their receive order and the list of its receives.
func TestNeighborCollectivesZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, nw := range []string{"loop", "shm"} {
		t.Run(nw, func(t *testing.T) {
			runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) {
				cart, err := w.CartCreate([]int{2}, []bool{true}, false)
				r.NoError(err)
				col, err := TypeVector(4, 1, 2, Float64)
				r.NoError(err)
				r.NoError(col.Commit())
				grid := make([]float64, 32)
				types := []*Datatype{col, Float64}
				counts, sdispls, rdispls := []int{1, 4}, []int{0, 64}, []int{128, 192}
				send, recv := make([]int64, 8), make([]int64, 8)
				vcounts, vdispls := []int{4, 4}, []int{0, 4}
				step := func() {
					r.NoError(NeighborAlltoallw(cart, grid, counts, sdispls, types, grid, counts, rdispls, types))
					r.NoError(NeighborAlltoall(cart, send, recv))
					r.NoError(NeighborAlltoallv(cart, send, vcounts, vdispls, recv, vcounts, vdispls))
					r.NoError(NeighborAllgather(cart, send[:4], recv))
					r.NoError(NeighborAllgatherv(cart, send[:4], recv, vcounts, vdispls))
				}
				const warm, runs = 50, 200
				if cart.Rank() == 1 {
					for range warm + runs + 1 { // AllocsPerRun runs once more to warm up
						step()
					}
					return
				}
				for range warm {
					step()
				}
				allocs := testing.AllocsPerRun(runs, step)
				r.Zero(allocs, "allocations per step of five neighborhood collectives")
			})
		})
	}
}
