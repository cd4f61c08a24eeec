package mpiam

import (
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Blocking Barrier, Bcast, Allreduce and Alltoall between the ranks of one
// node go through the communicator's shared area: back to back in a mixed
// order (the slots' reuse, also after more barriers in a row than there are
// slots), with roots and sizes varying up to the slot's size (Alltoall in
// place and not), a non-commutative operation (rank order), and ranks
// arriving late enough to sleep in their endpoints (the wake-up messages).
// Results are exact; the area was used on one node and not across nodes.
func TestCollectivesThroughSharedMemory(t *testing.T) {
	for _, n := range []int{2, 3, 5, 8} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			eachNetwork(t, n, func(r *rk, c *Comm) {
				me := c.Rank()
				rng := rand.New(rand.NewSource(int64(n*100 + me)))
				calls := 60
				if r.net == "sim" || r.net == "loop+sim" || r.net == "udp" {
					calls = 20
				}
				for i := range calls {
					if rng.Intn(8) == 0 { // late: the others wait past their spin
						time.Sleep(time.Duration(rng.Intn(3)) * time.Millisecond)
					}
					kind := i % 5
					if (i/10)%3 == 1 {
						kind = 0 // a run of barriers longer than the slots: the slots' reuse counts them finished
					}
					switch kind {
					case 0:
						r.NoError(c.Barrier())
					case 1:
						root := i % n
						k := 1 + i*37%(shmCollSlot/8) // up to the slot's size
						b := make([]int64, k)
						if me == root {
							for j := range b {
								b[j] = int64(i*1000 + j)
							}
						}
						r.NoError(Bcast(c, b, root))
						for j := range b {
							r.Equal(int64(i*1000+j), b[j], "call %d element %d", i, j)
						}
					case 2:
						k := 1 + i%9
						send, got := make([]int64, k), make([]int64, k)
						for j := range send {
							send[j] = int64((me+1)*(i+1) + j)
						}
						r.NoError(Allreduce(c, send, got, Sum[int64]()))
						for j := range got {
							r.Equal(int64(n*(n+1)/2*(i+1)+n*j), got[j], "call %d element %d", i, j)
						}
					case 3:
						v := []int64{int64(me + 1)}
						r.NoError(Allreduce(c, nil, v, concatOp()))
						r.Equal(concatOf(n), v[0], "call %d: rank order", i)
					case 4:
						// Blocks of 1 up to the most a slot holds for n
						// ranks; every other call in place.
						k := 1 + i*13%(shmCollSlot/8/n)
						send, got := make([]int64, n*k), make([]int64, n*k)
						for j := range send {
							send[j] = int64(i*1000000 + me*10000 + j)
						}
						if i%2 == 0 {
							copy(got, send)
							r.NoError(Alltoall(c, nil, got))
						} else {
							r.NoError(Alltoall(c, send, got))
						}
						for q := range n {
							for j := range k {
								r.Equal(int64(i*1000000+q*10000+me*k+j), got[q*k+j], "call %d block %d element %d", i, q, j)
							}
						}
					}
				}
				// Counts that do not divide among the ranks: refused alike on
				// every rank, in place or not, before anything is sent.
				bad := make([]int64, 2*n+1)
				r.ErrorIs(Alltoall(c, nil, bad), ErrCount)
				r.ErrorIs(Alltoall(c, bad, make([]int64, 2*n+1)), ErrCount)
				r.NoError(c.Barrier())
				oneNode := true
				for q := range n {
					oneNode = oneNode && c.p.ep.Node(c.world(q)) == c.p.ep.Node(c.world(me))
				}
				r.Equal(oneNode, c.shmState.Load() == shmReady, "the area is used exactly on one node")
			})
		})
	}
}

// concatOp is a non-commutative operation that shows any misordering: a∘b
// is b's digits after a's. Reducing rank r's r+1 over n ranks in rank
// order gives concatOf(n).
func concatOp() Op[int64] {
	return NewOp("concat", func(in, inout []int64) {
		for j := range inout {
			d := int64(1)
			for d <= inout[j] {
				d *= 10
			}
			inout[j] = in[j]*d + inout[j]
		}
	}, false)
}

// concatOf is 12...n, the rank-order reduction of concatOp over n ranks.
func concatOf(n int) int64 {
	v := int64(0)
	for q := range n {
		v = v*10 + int64(q+1)
	}
	return v
}

// Beyond shmCollMax ranks, or with AMGO_COLL_SHM=0, the message algorithms
// run.
func TestCollectivesSharedMemoryOff(t *testing.T) {
	runJob(t, "loop", shmCollMax+1, Config{}, func(r *rk, c *Comm) {
		r.NoError(c.Barrier())
		r.Equal(shmNone, c.shmState.Load())
	})
	t.Setenv(EnvCollShm, "0")
	runJob(t, "shm", 2, Config{}, func(r *rk, c *Comm) {
		r.NoError(c.Barrier())
		r.Equal(shmNone, c.shmState.Load())
	})
}

// A sub-communicator gets an area of its own, freed with it.
func TestCollectivesSharedMemorySubComm(t *testing.T) {
	runJob(t, "shm", 4, Config{}, func(r *rk, c *Comm) {
		half, err := c.Split(c.Rank()%2, 0)
		r.NoError(err)
		v := []int{c.Rank()}
		r.NoError(Allreduce(half, nil, v, Sum[int]()))
		r.Equal(c.Rank()%2*2+2, v[0]) // ranks 0+2 or 1+3
		r.Equal(shmReady, half.shmState.Load())
		r.NoError(half.Free())
		r.Equal(shmNone, half.shmState.Load())
		r.NoError(c.Barrier())
	})
}

// Ibcast, Iallreduce, Ialltoall and Ibarrier between the ranks of one node
// go through the nonblocking section of the shared area once it exists
// (a barrier completes only once every rank has entered it): many more in
// flight than there are slots (the slots' reuse waits for every rank to
// finish), completed in a shuffled order of Waits and interleaved with
// blocking collectives, which use the other section meanwhile; in place and
// not, a non-commutative operation (rank order), ranks late enough to sleep
// in their endpoints. Results are exact, and the section was used exactly
// on one node. A communicator freed with collectives under way in its area
// keeps it mapped until they finish.
func TestNonblockingCollectivesThroughSharedMemory(t *testing.T) {
	const calls = 3*shmSlots + 5
	var enteredBy sync.Map // by job: how many ranks entered each Ibarrier
	for _, n := range []int{2, 3, 5} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			eachNetwork(t, n, func(r *rk, c *Comm) {
				me := c.Rank()
				rng := rand.New(rand.NewSource(int64(n*100 + me)))
				e, _ := enteredBy.LoadOrStore(fmt.Sprint(n, r.net), new([calls]atomic.Int32))
				entered := e.(*[calls]atomic.Int32)
				r.NoError(c.Barrier()) // makes the area, where the node allows
				cat, catWant := concatOp(), concatOf(n)
				reqs := make([]Request, calls)
				checks := make([]func(), calls)
				for i := range calls {
					if rng.Intn(10) == 0 {
						time.Sleep(time.Duration(rng.Intn(2)) * time.Millisecond)
					}
					var err error
					switch i % 5 {
					case 4:
						entered[i].Add(1)
						reqs[i], err = c.Ibarrier()
						checks[i] = func() { r.EqualValues(n, entered[i].Load(), "Ibarrier %d done before every rank entered", i) }
					case 0:
						root := i % n
						b := make([]int64, 1+i*37%(shmCollSlot/8))
						if me == root {
							for j := range b {
								b[j] = int64(i*1000 + j)
							}
						}
						reqs[i], err = Ibcast(c, b, root)
						checks[i] = func() {
							for j := range b {
								r.Equal(int64(i*1000+j), b[j], "Ibcast %d element %d", i, j)
							}
						}
					case 1:
						k := 1 + i%9
						send, got := make([]int64, k), make([]int64, k)
						for j := range send {
							send[j] = int64((me+1)*(i+1) + j)
						}
						reqs[i], err = Iallreduce(c, send, got, Sum[int64]())
						checks[i] = func() {
							for j := range got {
								r.Equal(int64(n*(n+1)/2*(i+1)+n*j), got[j], "Iallreduce %d element %d", i, j)
							}
						}
					case 2:
						v := []int64{int64(me + 1)}
						reqs[i], err = Iallreduce(c, nil, v, cat)
						checks[i] = func() { r.Equal(catWant, v[0], "Iallreduce %d: rank order", i) }
					case 3:
						blk := 1 + i%5
						send, got := make([]int32, n*blk), make([]int32, n*blk)
						for j := range send {
							send[j] = int32(me*100000 + i*100 + j)
						}
						if i%8 == 7 {
							copy(got, send)
							send = nil // in place
						}
						reqs[i], err = Ialltoall(c, send, got)
						checks[i] = func() {
							for q := range n {
								for j := range blk {
									r.Equal(int32(q*100000+i*100+me*blk+j), got[q*blk+j], "Ialltoall %d from %d", i, q)
								}
							}
						}
					}
					r.NoError(err)
					if i%7 == 3 {
						v := []int{me}
						r.NoError(Allreduce(c, nil, v, Sum[int]())) // the blocking section, meanwhile
						r.Equal(n*(n-1)/2, v[0])
					}
				}
				for _, i := range rng.Perm(calls) {
					_, err := reqs[i].Wait()
					r.NoError(err)
					checks[i]()
				}
				oneNode := true
				for q := range n {
					oneNode = oneNode && c.p.ep.Node(c.world(q)) == c.p.ep.Node(c.world(me))
				}
				r.Equal(oneNode, c.shmState.Load() == shmReady, "the area is used exactly on one node")
				if oneNode {
					r.Equal(uint64(calls), c.shmc.nb.seq, "every call went through the area")
				}

				d, err := c.Dup()
				r.NoError(err)
				r.NoError(d.Barrier())
				v := []int{me + 1}
				req, err := Iallreduce(d, nil, v, Sum[int]())
				r.NoError(err)
				r.NoError(d.Free())
				_, err = req.Wait()
				r.NoError(err)
				r.Equal(n*(n+1)/2, v[0])
				r.NoError(c.Barrier())
			})
		})
	}
}

// Nonblocking collectives through the area go directly (startAreaNB: no
// schedule) when no collective on the schedule engine is under way on the
// communicator; one on the engine started after direct ones completes after
// them, and ranks that went different ways (one had an engine collective
// under way, the other not) still agree on the tags of later collectives.
func TestNonblockingCollectivesDirectAndScheduled(t *testing.T) {
	for _, level := range []ThreadLevel{ThreadSingle, ThreadMultiple} {
		t.Run(level.String(), func(t *testing.T) {
			runJob(t, "shm", 2, Config{Thread: level}, func(r *rk, c *Comm) {
				me := c.Rank()
				r.NoError(c.Barrier()) // makes the area
				r.Equal(shmReady, c.shmState.Load())

				// Direct: nothing joins the engine's queue.
				v := []int64{int64(me + 1)}
				req, err := Iallreduce(c, nil, v, Sum[int64]())
				r.NoError(err)
				r.Equal(c.nbcHead, len(c.nbcq), "a direct Iallreduce is not on the schedule engine")
				_, err = req.Wait()
				r.NoError(err)
				r.EqualValues(3, v[0])

				// An engine collective after a direct one that cannot finish
				// yet (rank 1 joins 20 ms late) completes after it: rank 0's
				// Ibcast of a large buffer, whose sends would otherwise
				// complete at once, waits for the Iallreduce.
				if me == 1 {
					time.Sleep(20 * time.Millisecond)
				}
				a := []int64{int64(me + 1)}
				ra, err := Iallreduce(c, nil, a, Sum[int64]())
				r.NoError(err)
				big := make([]byte, 2*shmCollSlot)
				if me == 0 {
					for i := range big {
						big[i] = byte(i * 7)
					}
				}
				rb, err := Ibcast(c, big, 0)
				r.NoError(err)
				if me == 0 {
					for deadline := time.Now().Add(5 * time.Millisecond); time.Now().Before(deadline); {
						doneA, _, err := ra.Test()
						r.NoError(err)
						r.False(doneA, "the Iallreduce finished before rank 1 joined")
						doneB, _, err := rb.Test()
						r.NoError(err)
						r.False(doneB, "the Ibcast completed before the Iallreduce started before it")
					}
					var diag strings.Builder
					c.p.writePending(&diag)
					r.Contains(diag.String(), "1 nonblocking collective(s) through a shared area, the last started: Iallreduce on communicator")
					r.Contains(diag.String(), "Ibcast on communicator")
				}
				_, err = rb.Wait()
				r.NoError(err)
				_, err = ra.Wait()
				r.NoError(err)
				r.EqualValues(3, a[0])
				for i := range big {
					r.Equal(byte(i*7), big[i], "Ibcast byte %d", i)
				}

				// Rank 0's Ireduce waits for rank 1's late data, so rank 0's
				// Iallreduce goes on the engine while rank 1's goes directly;
				// a message collective afterwards still matches.
				if me == 1 {
					time.Sleep(10 * time.Millisecond)
				}
				s, sum := []int64{int64(me + 10)}, []int64{0}
				rr, err := Ireduce(c, s, sum, Sum[int64](), 0)
				r.NoError(err)
				if me == 1 {
					_, err = rr.Wait() // an eager send: complete at once
					r.NoError(err)
				}
				x := []int64{int64(me + 1)}
				rx, err := Iallreduce(c, nil, x, Sum[int64]())
				r.NoError(err)
				if me == 0 {
					r.NotEqual(c.nbcHead, len(c.nbcq), "rank 0's Iallreduce went on the engine")
				}
				g := make([]int64, 2)
				rg, err := Iallgather(c, []int64{int64(me + 100)}, g)
				r.NoError(err)
				r.NoError(Waitall([]Request{rr, rx, rg}, nil))
				if me == 0 {
					r.EqualValues(21, sum[0])
				}
				r.EqualValues(3, x[0])
				r.Equal([]int64{100, 101}, g)
			})
		})
	}
}
