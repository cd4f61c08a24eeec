package sched

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// memNet is an in-memory network for p ranks: messages queue per (source,
// destination, tag) in order, receives match in the order they were posted
// (MPI's non-overtaking rule), and a send completes once a receive has
// taken it when sync is set (rendezvous-like), at once otherwise.
type memNet struct {
	p     int
	sync  bool
	queue map[[3]int][]*memMsg // (src, dst, tag) -> messages in flight
	ranks []*memRank
	rng   *rand.Rand
}

type memMsg struct {
	data  []byte
	taken bool
}

type memRank struct {
	net    *memNet
	me     int
	run    Run
	posted []int           // receives posted, not matched, in order
	got    map[int]error   // completed receives (step index -> error)
	sent   map[int]*memMsg // sends posted (step index -> message)
	ops    []Op
}

func newMemNet(p int, seed uint64, sync bool) *memNet {
	n := &memNet{p: p, sync: sync, queue: map[[3]int][]*memMsg{}, rng: rand.New(rand.NewPCG(seed, 1))}
	for i := range p {
		n.ranks = append(n.ranks, &memRank{net: n, me: i})
	}
	return n
}

func (r *memRank) Post(i int, op *Op) error {
	if op.Peer < 0 || op.Peer >= r.net.p || op.Peer == r.me {
		return fmt.Errorf("rank %d step %d: bad peer %d", r.me, i, op.Peer)
	}
	if op.Tag < 0 || op.Tag > 255 {
		return fmt.Errorf("rank %d step %d: tag %d out of range", r.me, i, op.Tag)
	}
	if op.Kind == SendOp {
		m := &memMsg{data: append([]byte(nil), op.Buf...)}
		k := [3]int{r.me, op.Peer, op.Tag}
		r.net.queue[k] = append(r.net.queue[k], m)
		r.sent[i] = m
		return nil
	}
	r.posted = append(r.posted, i)
	return nil
}

// match pairs posted receives with queued messages, in posting order per key.
func (r *memRank) match() {
	keep := r.posted[:0]
	taken := map[[3]int]bool{}
	for _, i := range r.posted {
		op := &r.ops[i]
		k := [3]int{op.Peer, r.me, op.Tag}
		q := r.net.queue[k]
		if len(q) == 0 || taken[k] {
			taken[k] = true // a later receive with the same key must not overtake
			keep = append(keep, i)
			continue
		}
		m := q[0]
		r.net.queue[k] = q[1:]
		m.taken = true
		if len(m.data) != len(op.Buf) {
			r.got[i] = fmt.Errorf("rank %d step %d: %d bytes for a receive of %d", r.me, i, len(m.data), len(op.Buf))
		} else {
			copy(op.Buf, m.data)
			r.got[i] = nil
		}
	}
	r.posted = keep
}

func (r *memRank) Test(i int, op *Op) (bool, error) {
	r.match() // progress, whichever step is tested
	switch op.Kind {
	case SendOp:
		return !r.net.sync || r.sent[i].taken, nil
	case RecvOp:
		err, ok := r.got[i]
		return ok, err
	}
	return op.Cond(), nil
}

func (r *memRank) Cancel(i int, op *Op) {
	for j, k := range r.posted {
		if k == i {
			r.posted = append(r.posted[:j], r.posted[j+1:]...)
			return
		}
	}
}

// run executes one schedule per rank, progressing the ranks in a random order
// until all finish; it fails the test on a deadlock or an error.
func (n *memNet) run(t *testing.T, scheds []*Schedule) {
	t.Helper()
	for i, r := range n.ranks {
		r.ops = scheds[i].Ops()
		r.got, r.sent = map[int]error{}, map[int]*memMsg{}
		r.run.Reset(scheds[i])
	}
	left := n.p
	finished := make([]bool, n.p)
	for stuck := 0; left > 0; {
		i := n.rng.IntN(n.p)
		if finished[i] {
			continue
		}
		r := n.ranks[i]
		before := r.run
		done, err := r.run.Progress(r)
		require.NoError(t, err, "rank %d", i)
		if done {
			finished[i] = true
			left--
			stuck = 0
			continue
		}
		if r.run == before {
			if stuck++; stuck > 100*n.p {
				t.Fatalf("deadlock: %d ranks unfinished", left)
			}
		} else {
			stuck = 0
		}
	}
	for k, q := range n.queue {
		require.Empty(t, q, "messages left over %v", k)
	}
}

// i64 reads and writes int64 elements.
func i64(b []byte, i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }
func put64(b []byte, i int, v int64) {
	binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
}

var sum = &Reduction{Commutative: true, Elem: 8, Fn: func(in, inout []byte) {
	for i := range len(inout) / 8 {
		put64(inout, i, i64(in, i)+i64(inout, i))
	}
}}

// affine composes maps x -> a·x + b (elements of two int64s): in then
// inout. Associative, not commutative: a result out of rank order shows.
var affine = &Reduction{Commutative: false, Elem: 16, Fn: func(in, inout []byte) {
	for i := range len(inout) / 16 {
		a1, b1 := i64(in, 2*i), i64(in, 2*i+1)
		a2, b2 := i64(inout, 2*i), i64(inout, 2*i+1)
		put64(inout, 2*i, a1*a2)
		put64(inout, 2*i+1, b1*a2+b2)
	}
}}

// contribution is rank r's vector of n elements for red.
func contribution(red *Reduction, r, n int) []byte {
	b := make([]byte, n*red.Elem)
	for i := range len(b) / 8 {
		put64(b, i, int64((r+1)*(i+3)%7+1))
	}
	return b
}

// serial reduces the contributions of ranks lo..hi-1 in rank order.
func serial(red *Reduction, lo, hi, n int) []byte {
	acc := contribution(red, lo, n)
	for r := lo + 1; r < hi; r++ {
		next := contribution(red, r, n)
		red.Fn(acc, next)
		acc = next
	}
	return acc
}

var sizes = []int{1, 2, 3, 4, 5, 7, 8, 9, 13, 16}

func each(t *testing.T, f func(t *testing.T, p int, sync bool, seed uint64)) {
	for _, p := range sizes {
		for _, sync := range []bool{false, true} {
			for seed := range uint64(3) {
				t.Run(fmt.Sprintf("p%d/sync=%v/seed%d", p, sync, seed), func(t *testing.T) { f(t, p, sync, seed) })
			}
		}
	}
}

func TestBcast(t *testing.T) {
	each(t, func(t *testing.T, p int, sync bool, seed uint64) {
		for _, n := range []int{0, 1, 5, 64, 1001} {
			for _, root := range []int{0, p - 1, p / 2} {
				for _, large := range []bool{false, true} {
					want := make([]byte, n)
					for i := range want {
						want[i] = byte(i*7 + root)
					}
					bufs := make([][]byte, p)
					scheds := make([]*Schedule, p)
					for r := range p {
						bufs[r] = make([]byte, n)
						if r == root {
							copy(bufs[r], want)
						}
						var b Builder
						if large {
							BcastScatterAllgather(&b, Flat(r, p), bufs[r], root, 0)
						} else {
							Bcast(&b, Flat(r, p), bufs[r], root, 0)
						}
						scheds[r] = b.Schedule()
					}
					newMemNet(p, seed, sync).run(t, scheds)
					for r := range p {
						require.Equal(t, want, bufs[r], "n=%d root=%d large=%v rank %d", n, root, large, r)
					}
				}
			}
		}
	})
}

func TestReduce(t *testing.T) {
	each(t, func(t *testing.T, p int, sync bool, seed uint64) {
		for _, red := range []*Reduction{sum, affine} {
			for _, n := range []int{0, 1, 6} {
				for _, root := range []int{0, p - 1, p / 2} {
					for _, inPlace := range []bool{false, true} {
						recv := make([]byte, n*red.Elem)
						scheds := make([]*Schedule, p)
						for r := range p {
							var b Builder
							send := contribution(red, r, n)
							var rb []byte
							if r == root {
								rb = recv
								if inPlace {
									copy(recv, send)
									send = recv
								}
							}
							Reduce(&b, Flat(r, p), send, rb, red, root, 0)
							scheds[r] = b.Schedule()
						}
						newMemNet(p, seed, sync).run(t, scheds)
						require.Equal(t, serial(red, 0, p, n), recv, "commutative=%v n=%d root=%d", red.Commutative, n, root)
					}
				}
			}
		}
	})
}

func TestAllreduce(t *testing.T) {
	each(t, func(t *testing.T, p int, sync bool, seed uint64) {
		for _, red := range []*Reduction{sum, affine} {
			for _, n := range []int{0, 1, 6, 37} {
				for _, ring := range []bool{false, true} {
					if ring && (!red.Commutative || n < p) {
						continue
					}
					recvs := make([][]byte, p)
					scheds := make([]*Schedule, p)
					for r := range p {
						var b Builder
						send := contribution(red, r, n)
						recvs[r] = make([]byte, len(send))
						if r%2 == 1 { // in place on odd ranks
							copy(recvs[r], send)
							send = recvs[r]
						}
						if ring {
							AllreduceRing(&b, Flat(r, p), send, recvs[r], red, 0)
						} else {
							Allreduce(&b, Flat(r, p), send, recvs[r], red, 0)
						}
						scheds[r] = b.Schedule()
					}
					newMemNet(p, seed, sync).run(t, scheds)
					want := serial(red, 0, p, n)
					for r := range p {
						require.Equal(t, want, recvs[r], "commutative=%v n=%d ring=%v rank %d", red.Commutative, n, ring, r)
					}
				}
			}
		}
	})
}

// vlayout is p blocks of uneven sizes (block i of (i*5+3)%4 bytes... times
// unit), with gaps between them; it returns counts, displacements and the
// total span.
func vlayout(p, unit int) (counts, displs []int, span int) {
	counts, displs = make([]int, p), make([]int, p)
	for i := range p {
		counts[i] = ((i*5 + 3) % 4) * unit
		displs[i] = span + unit // a gap before each block
		span = displs[i] + counts[i]
	}
	return counts, displs, span
}

func fill(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*31 + i + 1)
	}
	return b
}

func TestGatherScatter(t *testing.T) {
	each(t, func(t *testing.T, p int, sync bool, seed uint64) {
		counts, displs, total := vlayout(p, 3)
		for _, root := range []int{0, p - 1} {
			// Gatherv: root's recv gets each rank's block; the gaps stay.
			recv := make([]byte, total)
			scheds := make([]*Schedule, p)
			for r := range p {
				var b Builder
				if r == root {
					Gatherv(&b, Flat(r, p), fill(counts[r], r), recv, counts, displs, root, 0)
				} else {
					Gatherv(&b, Flat(r, p), fill(counts[r], r), nil, nil, nil, root, 0)
				}
				scheds[r] = b.Schedule()
			}
			newMemNet(p, seed, sync).run(t, scheds)
			want := make([]byte, total)
			for r := range p {
				copy(want[displs[r]:], fill(counts[r], r))
			}
			require.Equal(t, want, recv, "gatherv root %d", root)

			// Scatterv back out.
			outs := make([][]byte, p)
			for r := range p {
				var b Builder
				outs[r] = make([]byte, counts[r])
				if r == root {
					Scatterv(&b, Flat(r, p), want, counts, displs, outs[r], root, 0)
				} else {
					Scatterv(&b, Flat(r, p), nil, nil, nil, outs[r], root, 0)
				}
				scheds[r] = b.Schedule()
			}
			newMemNet(p, seed, sync).run(t, scheds)
			for r := range p {
				require.Equal(t, fill(counts[r], r), outs[r], "scatterv root %d rank %d", root, r)
			}
		}
	})
}

func TestAllgather(t *testing.T) {
	each(t, func(t *testing.T, p int, sync bool, seed uint64) {
		counts, displs, total := vlayout(p, 2)
		recvs := make([][]byte, p)
		scheds := make([]*Schedule, p)
		want := make([]byte, total)
		for r := range p {
			copy(want[displs[r]:], fill(counts[r], r))
		}
		for r := range p {
			var b Builder
			recvs[r] = make([]byte, total)
			send := fill(counts[r], r)
			if r%2 == 0 { // in place on even ranks
				copy(recvs[r][displs[r]:], send)
				send = nil
			}
			AllgatherRing(&b, Flat(r, p), send, recvs[r], counts, displs, 0)
			scheds[r] = b.Schedule()
		}
		newMemNet(p, seed, sync).run(t, scheds)
		for r := range p {
			require.Equal(t, want, recvs[r], "ring rank %d", r)
		}
		if p&(p-1) != 0 {
			return
		}
		const k = 5
		for r := range p {
			var b Builder
			recvs[r] = make([]byte, k*p)
			AllgatherRecursiveDoubling(&b, Flat(r, p), fill(k, r), recvs[r], k, 0)
			scheds[r] = b.Schedule()
		}
		newMemNet(p, seed, sync).run(t, scheds)
		for r := range p {
			for i := range p {
				require.Equal(t, fill(k, i), recvs[r][i*k:(i+1)*k], "recursive doubling rank %d block %d", r, i)
			}
		}
	})
}

func TestAlltoallv(t *testing.T) {
	each(t, func(t *testing.T, p int, sync bool, seed uint64) {
		// Rank i sends (i+j)%3+1 bytes to rank j.
		cnt := func(i, j int) int { return (i+j)%3 + 1 }
		sends, recvs := make([][]byte, p), make([][]byte, p)
		sc, sd, rc, rd := make([][]int, p), make([][]int, p), make([][]int, p), make([][]int, p)
		scheds := make([]*Schedule, p)
		for r := range p {
			sc[r], sd[r], rc[r], rd[r] = make([]int, p), make([]int, p), make([]int, p), make([]int, p)
			st, rt := 0, 0
			for j := range p {
				sc[r][j], sd[r][j] = cnt(r, j), st
				st += cnt(r, j) + 1
				rc[r][j], rd[r][j] = cnt(j, r), rt
				rt += cnt(j, r)
			}
			sends[r], recvs[r] = fill(st, r), make([]byte, rt)
			var b Builder
			Alltoallv(&b, Flat(r, p), sends[r], sc[r], sd[r], recvs[r], rc[r], rd[r], 0)
			scheds[r] = b.Schedule()
		}
		newMemNet(p, seed, sync).run(t, scheds)
		for r := range p {
			for j := range p {
				require.Equal(t, sends[j][sd[j][r]:sd[j][r]+sc[j][r]], recvs[r][rd[r][j]:rd[r][j]+rc[r][j]], "rank %d from %d", r, j)
			}
		}
	})
}

func TestReduceScatter(t *testing.T) {
	each(t, func(t *testing.T, p int, sync bool, seed uint64) {
		for _, red := range []*Reduction{sum, affine} {
			counts := make([]int, p)
			n := 0
			for i := range p {
				counts[i] = (i % 3) * red.Elem
				n += counts[i] / red.Elem
			}
			recvs := make([][]byte, p)
			scheds := make([]*Schedule, p)
			for r := range p {
				var b Builder
				recvs[r] = make([]byte, counts[r])
				ReduceScatter(&b, Flat(r, p), contribution(red, r, n), recvs[r], counts, red, 0)
				scheds[r] = b.Schedule()
			}
			newMemNet(p, seed, sync).run(t, scheds)
			want := serial(red, 0, p, n)
			at := 0
			for r := range p {
				require.Equal(t, want[at:at+counts[r]], recvs[r], "commutative=%v rank %d", red.Commutative, r)
				at += counts[r]
			}
		}
	})
}

func TestScan(t *testing.T) {
	each(t, func(t *testing.T, p int, sync bool, seed uint64) {
		for _, red := range []*Reduction{sum, affine} {
			for _, exclusive := range []bool{false, true} {
				const n = 3
				recvs := make([][]byte, p)
				scheds := make([]*Schedule, p)
				for r := range p {
					var b Builder
					send := contribution(red, r, n)
					recvs[r] = make([]byte, len(send))
					if !exclusive && r%2 == 1 {
						copy(recvs[r], send)
						send = recvs[r]
					}
					Scan(&b, Flat(r, p), send, recvs[r], red, exclusive, 0)
					scheds[r] = b.Schedule()
				}
				newMemNet(p, seed, sync).run(t, scheds)
				for r := range p {
					hi := r + 1
					if exclusive {
						hi = r
					}
					if hi == 0 {
						require.Equal(t, make([]byte, n*red.Elem), recvs[r], "exclusive rank 0 untouched")
						continue
					}
					require.Equal(t, serial(red, 0, hi, n), recvs[r], "commutative=%v exclusive=%v rank %d", red.Commutative, exclusive, r)
				}
			}
		}
	})
}

// TestGroupMapsRanks runs Allreduce over a group of every other rank of a
// larger communicator: the steps name communicator ranks.
func TestGroupMapsRanks(t *testing.T) {
	const p = 10
	ranks := []int{1, 3, 5, 7, 9}
	recvs := make([][]byte, p)
	scheds := make([]*Schedule, p)
	for r := range p {
		var b Builder
		if r%2 == 1 {
			recvs[r] = make([]byte, 8)
			Allreduce(&b, Group{Ranks: ranks, Me: r / 2, Size: len(ranks)}, contribution(sum, r/2, 1), recvs[r], sum, 0)
		}
		scheds[r] = b.Schedule()
	}
	newMemNet(p, 1, true).run(t, scheds)
	for r := 1; r < p; r += 2 {
		require.Equal(t, serial(sum, 0, len(ranks), 1), recvs[r])
	}
}

// failNet fails the post or the test of one step.
type failNet struct {
	failPost, failTest int
	cancelled          []int
}

var errBoom = errors.New("boom")

func (f *failNet) Post(i int, op *Op) error {
	if i == f.failPost {
		return errBoom
	}
	return nil
}

func (f *failNet) Test(i int, op *Op) (bool, error) {
	if i == f.failTest {
		return false, errBoom
	}
	return false, nil
}

func (f *failNet) Cancel(i int, op *Op) { f.cancelled = append(f.cancelled, i) }

func TestRunFailure(t *testing.T) {
	var b Builder
	buf := make([]byte, 4)
	b.Recv(1, 0, buf) // 0
	b.Recv(2, 0, buf) // 1
	b.Send(3, 0, buf) // 2
	b.Fence()
	b.Send(1, 1, buf) // 3
	s := b.Schedule()
	require.Equal(t, 2, s.Rounds())
	require.Equal(t, 4, s.Messages())

	// A post that fails cancels the steps posted before it in the round.
	var r Run
	r.Reset(s)
	f := &failNet{failPost: 2, failTest: -1}
	done, err := r.Progress(f)
	require.True(t, done)
	require.ErrorIs(t, err, errBoom)
	require.Equal(t, []int{0, 1}, f.cancelled)
	done, err = r.Finished()
	require.True(t, done)
	require.ErrorIs(t, err, errBoom)

	// A failed completion cancels the round's later steps.
	r.Reset(s)
	f = &failNet{failPost: -1, failTest: 0}
	done, err = r.Progress(f)
	require.True(t, done)
	require.ErrorIs(t, err, errBoom)
	require.Equal(t, []int{1, 2}, f.cancelled)

	// Abort cancels what is posted.
	r.Reset(s)
	f = &failNet{failPost: -1, failTest: -1}
	done, err = r.Progress(f)
	require.False(t, done)
	require.NoError(t, err)
	r.Abort(f, nil)
	require.Equal(t, []int{0, 1, 2}, f.cancelled)
	_, err = r.Finished()
	require.ErrorIs(t, err, ErrUnfinished)
}

func TestRunLocalStepsAndUntil(t *testing.T) {
	var b Builder
	var order []string
	flag := false
	b.Call(func() error { order = append(order, "a"); return nil })
	b.Until(func() bool { return flag })
	b.Fence()
	b.Call(func() error { order = append(order, "b"); return nil })
	b.Fence()
	b.Call(func() error { return errBoom })
	s := b.Schedule()
	var r Run
	r.Reset(s)
	n := newMemNet(1, 0, false).ranks[0]
	done, err := r.Progress(n)
	require.False(t, done)
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, order)
	done, _ = r.Progress(n)
	require.False(t, done, "Until holds the round")
	flag = true
	done, err = r.Progress(n)
	require.True(t, done)
	require.ErrorIs(t, err, errBoom)
	require.Equal(t, []string{"a", "b"}, order)

	// An empty schedule is finished at once; a zero Run is finished.
	var empty Builder
	r.Reset(empty.Schedule())
	done, err = r.Progress(n)
	require.True(t, done)
	require.NoError(t, err)
	var zero Run
	done, _ = zero.Finished()
	require.True(t, done)
}

// TestRerun runs one schedule several times (a persistent collective): each
// run gives the same result.
func TestRerun(t *testing.T) {
	const p = 4
	net := newMemNet(p, 7, false)
	scheds := make([]*Schedule, p)
	recvs := make([][]byte, p)
	sends := make([][]byte, p)
	for r := range p {
		var b Builder
		sends[r] = contribution(sum, r, 4)
		recvs[r] = make([]byte, len(sends[r]))
		Allreduce(&b, Flat(r, p), sends[r], recvs[r], sum, 0)
		scheds[r] = b.Schedule()
	}
	for range 3 {
		for r := range p {
			clear(recvs[r])
		}
		net.run(t, scheds)
		for r := range p {
			require.Equal(t, serial(sum, 0, p, 4), recvs[r])
		}
	}
}

// FuzzAllreduce runs Allreduce (both algorithms) and Scan on fuzzed sizes,
// vector lengths, progress orders and send completion, against the serial
// result.
func FuzzAllreduce(f *testing.F) {
	f.Add(uint8(3), uint8(5), uint64(1), false, false)
	f.Add(uint8(7), uint8(1), uint64(9), true, true)
	f.Add(uint8(16), uint8(40), uint64(3), true, false)
	f.Fuzz(func(t *testing.T, pp, nn uint8, seed uint64, sync, ring bool) {
		p, n := int(pp%17)+1, int(nn%64)
		red := sum
		if seed%2 == 0 {
			red = affine
		}
		if ring && (!red.Commutative || n < p) {
			ring = false
		}
		recvs := make([][]byte, p)
		scans := make([][]byte, p)
		scheds := make([]*Schedule, p)
		for r := range p {
			var b Builder
			recvs[r] = make([]byte, n*red.Elem)
			scans[r] = make([]byte, n*red.Elem)
			if ring {
				AllreduceRing(&b, Flat(r, p), contribution(red, r, n), recvs[r], red, 0)
			} else {
				Allreduce(&b, Flat(r, p), contribution(red, r, n), recvs[r], red, 0)
			}
			Scan(&b, Flat(r, p), contribution(red, r, n), scans[r], red, false, 4)
			scheds[r] = b.Schedule()
		}
		newMemNet(p, seed, sync).run(t, scheds)
		want := serial(red, 0, p, n)
		for r := range p {
			require.Equal(t, want, recvs[r], "allreduce rank %d", r)
			require.Equal(t, serial(red, 0, r+1, n), scans[r], "scan rank %d", r)
		}
	})
}

// eventNet posts events and completes them when told; messages it refuses.
type eventNet struct {
	posted map[int]any
	done   map[int]bool
}

func (e *eventNet) Post(i int, op *Op) error {
	if op.Kind != EventOp {
		return errBoom
	}
	e.posted[i] = op.Ext
	return nil
}

func (e *eventNet) Test(i int, op *Op) (bool, error) { return e.done[i], nil }

func (e *eventNet) Cancel(int, *Op) {}

// An event step is posted with the round that holds it, after the calls
// before it in the round, and holds the round until the Net completes it.
func TestRunEvent(t *testing.T) {
	var b Builder
	var order []string
	b.Call(func() error { order = append(order, "number"); return nil })
	b.Event("the area's")
	b.Fence()
	b.Call(func() error { order = append(order, "after"); return nil })
	s := b.Schedule()
	require.Equal(t, "event", s.Ops()[1].Kind.String())
	require.Zero(t, s.Messages(), "an event is not a message")
	var r Run
	r.Reset(s)
	n := &eventNet{posted: map[int]any{}, done: map[int]bool{}}
	done, err := r.Progress(n)
	require.NoError(t, err)
	require.False(t, done, "the event holds the round")
	require.Equal(t, map[int]any{1: "the area's"}, n.posted)
	require.Equal(t, []string{"number"}, order)
	done, _ = r.Progress(n)
	require.False(t, done)
	n.done[1] = true
	done, err = r.Progress(n)
	require.True(t, done)
	require.NoError(t, err)
	require.Equal(t, []string{"number", "after"}, order)
}
