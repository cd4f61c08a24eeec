package mpiam

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// Messages up to 64 MiB arrive whole, in content (MPICH large_message,
// manylmt at a size this machine affords).
func TestLargeMessages_MPI41_3_2(t *testing.T) {
	sizes := []int{1 << 20, 8<<20 + 3, 64 << 20}
	if testing.Short() || raceEnabled {
		sizes = sizes[:2]
	}
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		for i, n := range sizes {
			if w.Rank() == 0 {
				r.NoError(Send(w, patterned(n, i), 1, i))
				continue
			}
			buf := make([]byte, n)
			st, err := Recv(w, buf, 0, i)
			r.NoError(err)
			r.Equal(n, st.Bytes)
			r.NoError(checkPattern(buf, i))
		}
	})
}

// Ten thousand nonblocking receives and sends outstanding at once between
// two ranks, completed by Waitall (MPICH many_isend, sendflood, isendirecv).
func TestManyOutstandingRequests_MPI41_3_7(t *testing.T) {
	n := 10_000
	if testing.Short() || raceEnabled {
		n = 2_000
	}
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		peer := 1 - w.Rank()
		in := make([]int64, n)
		reqs := make([]Request, 0, 2*n)
		for i := range n {
			req, err := Irecv(w, in[i:i+1], peer, i%7)
			r.NoError(err)
			reqs = append(reqs, req)
		}
		out := make([]int64, n)
		for i := range n {
			out[i] = int64(w.Rank()*n + i)
			req, err := Isend(w, out[i:i+1], peer, i%7)
			r.NoError(err)
			reqs = append(reqs, req)
		}
		sts := make([]Status, len(reqs))
		r.NoError(Waitall(reqs, sts))
		for i := range n {
			r.Equal(int64(peer*n+i), in[i])
			r.Equal(i%7, sts[i].Tag)
		}
	})
}

// Goroutines of one rank communicate at the same time (MPI_THREAD_MULTIPLE,
// MPI-4.1 §11.6): 8 goroutines on each of 3 ranks exchange messages of mixed
// sizes with every other rank, each goroutine pair on its own tag; in the
// wildcard variant receives take AnySource and AnyTag and the messages are
// counted instead.
func TestConcurrentGoroutines_MPI41_11_6(t *testing.T) {
	const workers = 8
	const ranks = 3
	iters := 30
	if testing.Short() || raceEnabled {
		iters = 8
	}
	for _, wildcard := range []bool{false, true} {
		t.Run(fmt.Sprintf("wildcard=%v", wildcard), func(t *testing.T) {
			eachNetworkMT(t, ranks, func(r *rk, w *Comm) {
				e := r.eagerLimit(w)
				sizes := []int{8, 1000, e + 1, 3 * e}
				if wildcard {
					// With wildcard receives a rendezvous send may find every
					// receive taken by later eager messages while every rank's
					// goroutines wait for their own rendezvous sends: an unsafe
					// program in any MPI (it hung about 1 run in 10). Sends up
					// to the stream limit are always eager and complete
					// without a receive (above it, a send to a peer with a
					// single-copy read goes by rendezvous while others are
					// in flight), so the wildcard half stays within what MPI
					// promises.
					s := w.p.streamLimit
					sizes = []int{8, 1000, s / 2, s}
				}
				var wg sync.WaitGroup
				counts := make([]int, ranks*workers) // wildcard: by sender goroutine
				var countMu sync.Mutex
				var failed atomic.Bool
				for g := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						// A failed assertion panics (failNow) and is reported
						// on the rank's goroutine; left alone it would end the
						// test binary before the message is printed.
						defer func() {
							if x := recover(); x != nil {
								if _, ok := x.(failNow); !ok {
									panic(x)
								}
								failed.Store(true)
							}
						}()
						var reqs []Request
						var bufs [][]byte
						for it := range iters {
							for peer := range ranks {
								if peer == w.Rank() {
									continue
								}
								n := sizes[(it+g)%len(sizes)]
								out := patterned(n, it)
								binary.LittleEndian.PutUint32(out, uint32(w.Rank()*workers+g))
								sreq, err := Isend(w, out, peer, g)
								r.NoError(err)
								buf := make([]byte, 3*e)
								var rreq Request
								if wildcard {
									rreq, err = Irecv(w, buf, AnySource, AnyTag)
								} else {
									rreq, err = Irecv(w, buf, peer, g)
								}
								r.NoError(err)
								reqs = append(reqs, sreq, rreq)
								bufs = append(bufs, nil, buf)
							}
							sts := make([]Status, len(reqs))
							r.NoError(Waitall(reqs, sts))
							for k := 1; k < len(reqs); k += 2 {
								st, buf := sts[k], bufs[k]
								from := int(binary.LittleEndian.Uint32(buf))
								if wildcard {
									countMu.Lock()
									counts[from]++
									countMu.Unlock()
									continue
								}
								r.Equal(g, st.Tag)
								r.Equal(st.Source*workers+g, from)
								n := sizes[(it+g)%len(sizes)]
								r.Equal(n, st.Bytes)
								want := patterned(n, it)
								binary.LittleEndian.PutUint32(want, uint32(from))
								r.Equal(-1, firstDiff(buf[:n], want))
							}
							reqs, bufs = reqs[:0], bufs[:0]
						}
					}()
				}
				wg.Wait()
				r.False(failed.Load(), "a goroutine failed its assertions")
				if wildcard {
					for from, c := range counts {
						if from/workers == w.Rank() {
							r.Equal(0, c)
						} else {
							r.Equal(iters, c, "messages from rank %d goroutine %d", from/workers, from%workers)
						}
					}
				}
			})
		})
	}
}

// More ranks than cores still progress: 6 goroutine ranks on this machine
// pass tokens round a ring and exchange all-to-all (MPICH sendall).
func TestMoreRanksThanCores(t *testing.T) {
	const n = 6
	t.Logf("%d ranks on %d cores", n, runtime.NumCPU())
	eachNetwork(t, n, func(r *rk, w *Comm) {
		me := w.Rank()
		next, prev := (me+1)%n, (me+n-1)%n
		tok := []int64{0}
		for lap := range 20 {
			if me == 0 {
				tok[0] = int64(lap * n)
				r.NoError(Send(w, tok, next, 1))
				_, err := Recv(w, tok, prev, 1)
				r.NoError(err)
				r.Equal(int64(lap*n+n-1), tok[0])
			} else {
				_, err := Recv(w, tok, prev, 1)
				r.NoError(err)
				tok[0]++
				r.NoError(Send(w, tok, next, 1))
			}
		}
		e := r.eagerLimit(w)
		var reqs []Request
		in := make([][]byte, n)
		for p := range n {
			in[p] = make([]byte, e+p)
			req, err := Irecv(w, in[p], p, 2)
			r.NoError(err)
			reqs = append(reqs, req)
		}
		for p := range n {
			req, err := Isend(w, patterned(e+me, me), p, 2)
			r.NoError(err)
			reqs = append(reqs, req)
		}
		r.NoError(Waitall(reqs, nil))
		for p := range n {
			r.NoError(checkPattern(in[p], p))
		}
		r.NoError(w.Barrier())
	})
}
