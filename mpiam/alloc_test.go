package mpiam

import (
	"fmt"
	"testing"
)

// The eager path allocates nothing in steady state: a blocking Send+Recv
// ping-pong of 8 bytes, measured on rank 0 with testing.AllocsPerRun (which
// counts the whole process: both ranks and their polling).
func TestEagerPingPongZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const warm, runs = 200, 2000
	for _, nw := range networks {
		t.Run(nw, func(t *testing.T) {
			runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) {
				buf := make([]byte, 8)
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
				r.Zero(allocs, "allocations per 8-byte round trip")
			})
		})
	}
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
