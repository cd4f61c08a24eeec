package mpiam

import (
	"fmt"
	"testing"
)

// strided is every other float64 of a buffer: n instances of Float64,
// stride 2 (the element at index 2j is element j).
func strided(r *rk, n int) *Datatype {
	d, err := TypeVector(n, 1, 2, Float64)
	r.NoError(err)
	r.NoError(d.Commit())
	return d
}

// typedCollectives runs each typed collective, blocking (nb false) or
// nonblocking, with strided buffers on one side and contiguous ones on the
// other, and checks every element, including that the gaps stay as they were.
func typedCollectives(r *rk, w *Comm, nb bool, n int) {
	p, me := w.Size(), w.Rank()
	vec := strided(r, n)
	run := func(name string, blocking func() error, start func() (Request, error)) {
		runForm(r, nb, name, blocking, start)
	}
	const gap = -1.0
	gapped := func(m int) []float64 { // 2m-1 slots, all gaps
		b := make([]float64, max(2*m-1, 0))
		for i := range b {
			b[i] = gap
		}
		return b
	}
	val := func(rank, j int) float64 { return float64(rank*1000 + j) }

	// Bcast: strided everywhere.
	root := p - 1
	buf := gapped(n)
	if me == root {
		for j := range n {
			buf[2*j] = val(root, j)
		}
	}
	run("BcastTyped", func() error { return BcastTyped(w, buf, 1, vec, root) },
		func() (Request, error) { return IbcastTyped(w, buf, 1, vec, root) })
	for j := range n {
		r.Equal(val(root, j), buf[2*j], "BcastTyped element %d", j)
		if j < n-1 {
			r.Equal(gap, buf[2*j+1], "BcastTyped gap %d", j)
		}
	}

	// Allreduce and Reduce: strided send and receive, an Op[float64].
	send := gapped(n)
	for j := range n {
		send[2*j] = val(me, j)
	}
	sum := func(j int) float64 {
		s := 0.0
		for k := range p {
			s += val(k, j)
		}
		return s
	}
	out := gapped(n)
	run("AllreduceTyped", func() error { return AllreduceTyped(w, send, out, 1, vec, Sum[float64]()) },
		func() (Request, error) { return IallreduceTyped(w, send, out, 1, vec, Sum[float64]()) })
	for j := range n {
		r.Equal(sum(j), out[2*j], "AllreduceTyped element %d", j)
	}
	out = gapped(n)
	run("ReduceTyped", func() error { return ReduceTyped(w, send, out, 1, vec, Sum[float64](), 0) },
		func() (Request, error) { return IreduceTyped(w, send, out, 1, vec, Sum[float64](), 0) })
	if me == 0 {
		for j := range n {
			r.Equal(sum(j), out[2*j], "ReduceTyped element %d", j)
		}
	}
	// In place: the contribution in recv.
	inpl := append([]float64(nil), send...)
	run("AllreduceTyped in place", func() error { return AllreduceTyped(w, nil, inpl, 1, vec, Sum[float64]()) },
		func() (Request, error) { return IallreduceTyped(w, nil, inpl, 1, vec, Sum[float64]()) })
	for j := range n {
		r.Equal(sum(j), inpl[2*j], "AllreduceTyped in place element %d", j)
	}

	// Gather: strided send, contiguous receive at root.
	all := make([]float64, p*n)
	run("GatherTyped", func() error { return GatherTyped(w, send, 1, vec, all, n, Float64, root) },
		func() (Request, error) { return IgatherTyped(w, send, 1, vec, all, n, Float64, root) })
	if me == root {
		for i := range p {
			for j := range n {
				r.Equal(val(i, j), all[i*n+j], "GatherTyped block %d element %d", i, j)
			}
		}
	}

	// Scatter: contiguous send at root, strided receive.
	for i := range all {
		all[i] = float64(i)
	}
	got := gapped(n)
	run("ScatterTyped", func() error { return ScatterTyped(w, all, n, Float64, got, 1, vec, root) },
		func() (Request, error) { return IscatterTyped(w, all, n, Float64, got, 1, vec, root) })
	for j := range n {
		r.Equal(float64(me*n+j), got[2*j], "ScatterTyped element %d", j)
	}

	// Allgather: contiguous send, strided receive blocks (block i starts i
	// extents of vec in: 2n-1 slots).
	mine := make([]float64, n)
	for j := range mine {
		mine[j] = val(me, j)
	}
	ext := 2*n - 1
	ag := make([]float64, p*ext)
	run("AllgatherTyped", func() error { return AllgatherTyped(w, mine, n, Float64, ag, 1, vec) },
		func() (Request, error) { return IallgatherTyped(w, mine, n, Float64, ag, 1, vec) })
	for i := range p {
		for j := range n {
			r.Equal(val(i, j), ag[i*ext+2*j], "AllgatherTyped block %d element %d", i, j)
		}
	}

	// Alltoall: strided blocks both ways (block j of send goes to rank j).
	a2s, a2r := make([]float64, p*ext), make([]float64, p*ext)
	for i := range a2s {
		a2s[i] = float64(me*100000 + i)
	}
	run("AlltoallTyped", func() error { return AlltoallTyped(w, a2s, 1, vec, a2r, 1, vec) },
		func() (Request, error) { return IalltoallTyped(w, a2s, 1, vec, a2r, 1, vec) })
	for i := range p {
		for j := range n {
			r.Equal(float64(i*100000+me*ext+2*j), a2r[i*ext+2*j], "AlltoallTyped from %d element %d", i, j)
		}
	}

	// Alltoallw: to rank j, j+1 contiguous float64s from byte 8·j²; from
	// rank i, me+1 of them into a stride-2 vector at byte 16·i.
	types := func(k int, f func(i int) *Datatype) []*Datatype {
		t := make([]*Datatype, k)
		for i := range t {
			t[i] = f(i)
		}
		return t
	}
	ws := make([]float64, p*p+p)
	for i := range ws {
		ws[i] = float64(me*1000 + i)
	}
	sc, sdp, rc, rdp := make([]int, p), make([]int, p), make([]int, p), make([]int, p)
	for j := range p {
		sc[j], sdp[j] = j+1, 8*j*j
		rc[j], rdp[j] = 1, 16*j*(me+2)
	}
	wr := make([]float64, 2*p*(me+2)+2*(me+1))
	stypes := types(p, func(int) *Datatype { return Float64 })
	rvec := strided(r, me+1)
	rtypes := types(p, func(int) *Datatype { return rvec })
	run("Alltoallw", func() error { return Alltoallw(w, ws, sc, sdp, stypes, wr, rc, rdp, rtypes) },
		func() (Request, error) { return Ialltoallw(w, ws, sc, sdp, stypes, wr, rc, rdp, rtypes) })
	for i := range p {
		for k := range me + 1 {
			// Rank i sent me+1 values from its float64 index me².
			r.Equal(float64(i*1000+me*me+k), wr[2*i*(me+2)+2*k], "Alltoallw from %d value %d", i, k)
		}
	}
}

// runForm runs the blocking form of a collective, or with nb starts the
// nonblocking one and waits for it.
func runForm(r *rk, nb bool, name string, blocking func() error, start func() (Request, error)) {
	if !nb {
		r.NoError(blocking(), name)
		return
	}
	req, err := start()
	r.NoError(err, name)
	_, err = req.Wait()
	r.NoError(err, name)
}

func TestTypedCollectives(t *testing.T) {
	for _, p := range []int{1, 2, 3, 5} {
		for _, nb := range []bool{false, true} {
			t.Run(fmt.Sprintf("p%d/nb=%v", p, nb), func(t *testing.T) {
				runJob(t, "loop", p, Config{}, func(r *rk, w *Comm) {
					for _, n := range []int{1, 9, 2000} {
						typedCollectives(r, w, nb, n)
					}
				})
			})
		}
	}
}

func TestTypedCollectivesEveryNetwork(t *testing.T) {
	eachNetwork(t, 3, func(r *rk, w *Comm) {
		typedCollectives(r, w, false, 700)
		typedCollectives(r, w, true, 700)
	})
}

// TestTypedReductionNeedsElements: a reduction's datatype must be a
// sequence of the operation's elements.
func TestTypedReductionNeedsElements(t *testing.T) {
	runJob(t, "loop", 2, Config{}, func(r *rk, w *Comm) {
		buf := make([]int64, 8)
		vec := strided(r, 4) // float64 elements
		r.ErrorIs(AllreduceTyped(w, buf, buf, 1, vec, Sum[int64]()), ErrType)
		_, err := IreduceTyped(w, buf, buf, 1, vec, Sum[int64](), 0)
		r.ErrorIs(err, ErrType)
		// A struct of two int64s is a sequence of affine elements.
		st, err := DatatypeOf[affine]()
		r.NoError(err)
		as := []affine{{2, 1}, {3, 1}}
		ar := make([]affine, 2)
		r.NoError(AllreduceTyped(w, as, ar, 2, st, affineOp))
		r.Equal(affine{4, 3}, ar[0])
		r.ErrorIs(BcastTyped(w, buf, 3, vec, 0), ErrBuffer) // three vectors do not fit
		r.ErrorIs(BcastTyped(w, buf, 1, vec, 2), ErrRoot)
	})
}

// TestNeighborAlltoallw exchanges the faces of a 2-D block on a periodic
// 1-D ring of ranks, columns described by vectors, as a halo exchange does.
func TestNeighborAlltoallw(t *testing.T) {
	for _, c := range []struct {
		nb, periodic bool
		p            int
	}{{false, true, 3}, {true, true, 3}, {false, false, 3}, {true, false, 3},
		// One or two ranks along a periodic dimension: both neighbors are one
		// rank, and the faces must still land on the right sides.
		{false, true, 1}, {true, true, 1}, {false, true, 2}, {true, true, 2}} {
		nb := c.nb
		runJob(t, "loop", c.p, Config{}, func(r *rk, w *Comm) {
			cart, err := w.CartCreate([]int{w.Size()}, []bool{c.periodic}, false)
			r.NoError(err)
			const rows, cols = 4, 6 // local block with one ghost column each side
			const ghost = -7.0      // what a ghost without a neighbor keeps
			grid := make([]float64, rows*cols)
			for i := range grid {
				grid[i] = ghost
			}
			me := cart.Rank()
			for i := range rows {
				for j := 1; j < cols-1; j++ {
					grid[i*cols+j] = float64(me*100 + i*10 + j)
				}
			}
			col, err := TypeVector(rows, 1, cols, Float64)
			r.NoError(err)
			r.NoError(col.Commit())
			// Neighbors: below (left), above (right). Send the first and last
			// interior columns, receive into the left and right ghosts.
			types := []*Datatype{col, col}
			counts := []int{1, 1}
			sdispls := []int{8 * 1, 8 * (cols - 2)}
			rdispls := []int{0, 8 * (cols - 1)}
			if nb {
				req, err := IneighborAlltoallw(cart, grid, counts, sdispls, types, grid, counts, rdispls, types)
				r.NoError(err)
				_, err = req.Wait()
				r.NoError(err)
			} else {
				r.NoError(NeighborAlltoallw(cart, grid, counts, sdispls, types, grid, counts, rdispls, types))
			}
			p := cart.Size()
			left, right := (me-1+p)%p, (me+1)%p
			wantLeft, wantRight := func(i int) float64 { return float64(left*100 + i*10 + cols - 2) }, func(i int) float64 { return float64(right*100 + i*10 + 1) }
			if !c.periodic && me == 0 {
				wantLeft = func(int) float64 { return ghost }
			}
			if !c.periodic && me == p-1 {
				wantRight = func(int) float64 { return ghost }
			}
			for i := range rows {
				r.Equal(wantLeft(i), grid[i*cols], "left ghost row %d (periodic %v)", i, c.periodic)
				r.Equal(wantRight(i), grid[i*cols+cols-1], "right ghost row %d (periodic %v)", i, c.periodic)
			}
		})
	}
}

// typedVCollectives checks the v collectives and the prefix and
// reduce-scatter reductions with datatypes: every other float64 (a
// float64 resized to an extent of 16 bytes) on one side, contiguous
// float64s on the other.
func typedVCollectives(r *rk, w *Comm, nb bool) {
	p, me := w.Size(), w.Rank()
	ev, err := TypeCreateResized(Float64, 0, 16)
	r.NoError(err)
	r.NoError(ev.Commit())
	run := func(name string, blocking func() error, start func() (Request, error)) {
		runForm(r, nb, name, blocking, start)
	}
	val := func(rank, j int) float64 { return float64(rank*100 + j) }
	counts, displs := make([]int, p), make([]int, p) // in instances / extents of ev
	total := 0
	for i := range p {
		counts[i], displs[i] = i+1, total+1
		total += i + 2
	}
	mine := make([]float64, me+1)
	for j := range mine {
		mine[j] = val(me, j)
	}
	// Gatherv and Allgatherv: contiguous sends, strided receive blocks.
	root := p - 1
	got := make([]float64, 2*total)
	run("GathervTyped", func() error { return GathervTyped(w, mine, me+1, Float64, got, counts, displs, ev, root) },
		func() (Request, error) { return IgathervTyped(w, mine, me+1, Float64, got, counts, displs, ev, root) })
	check := func(name string, got []float64) {
		for i := range p {
			for j := range i + 1 {
				r.Equal(val(i, j), got[2*(displs[i]+j)], "%s block %d element %d", name, i, j)
			}
		}
	}
	if me == root {
		check("GathervTyped", got)
	}
	all := make([]float64, 2*total)
	run("AllgathervTyped", func() error { return AllgathervTyped(w, mine, me+1, Float64, all, counts, displs, ev) },
		func() (Request, error) { return IallgathervTyped(w, mine, me+1, Float64, all, counts, displs, ev) })
	check("AllgathervTyped", all)
	// Scatterv: strided blocks at root, contiguous receives.
	src := make([]float64, 2*total)
	for i := range p {
		for j := range i + 1 {
			src[2*(displs[i]+j)] = val(i, j)
		}
	}
	part := make([]float64, me+1)
	run("ScattervTyped", func() error { return ScattervTyped(w, src, counts, displs, ev, part, me+1, Float64, 0) },
		func() (Request, error) { return IscattervTyped(w, src, counts, displs, ev, part, me+1, Float64, 0) })
	r.Equal(mine, part, "ScattervTyped")
	// Alltoallv: to rank j, j+1 strided values; from rank i, me+1 values
	// received contiguous.
	sc, sd, rc, rd := make([]int, p), make([]int, p), make([]int, p), make([]int, p)
	st, rt := 0, 0
	for j := range p {
		sc[j], sd[j] = j+1, st
		st += j + 1
		rc[j], rd[j] = me+1, rt
		rt += me + 1
	}
	a2s, a2r := make([]float64, 2*st), make([]float64, rt)
	for i := range st {
		a2s[2*i] = float64(me*1000 + i)
	}
	run("AlltoallvTyped", func() error { return AlltoallvTyped(w, a2s, sc, sd, ev, a2r, rc, rd, Float64) },
		func() (Request, error) { return IalltoallvTyped(w, a2s, sc, sd, ev, a2r, rc, rd, Float64) })
	for i := range p {
		for k := range me + 1 {
			// Rank i's block for me starts at instance sum_{j<me}(j+1).
			r.Equal(float64(i*1000+me*(me+1)/2+k), a2r[rd[i]+k], "AlltoallvTyped from %d value %d", i, k)
		}
	}
	// Scan, Exscan: strided vectors of 3.
	ss := make([]float64, 6)
	for j := range 3 {
		ss[2*j] = val(me, j)
	}
	sr, er := make([]float64, 6), []float64{-1, -1, -1, -1, -1, -1}
	run("ScanTyped", func() error { return ScanTyped(w, ss, sr, 3, ev, Sum[float64]()) },
		func() (Request, error) { return IscanTyped(w, ss, sr, 3, ev, Sum[float64]()) })
	run("ExscanTyped", func() error { return ExscanTyped(w, ss, er, 3, ev, Sum[float64]()) },
		func() (Request, error) { return IexscanTyped(w, ss, er, 3, ev, Sum[float64]()) })
	for j := range 3 {
		in, ex := 0.0, 0.0
		for k := range me + 1 {
			in += val(k, j)
			if k < me {
				ex += val(k, j)
			}
		}
		r.Equal(in, sr[2*j], "ScanTyped element %d", j)
		if me > 0 {
			r.Equal(ex, er[2*j], "ExscanTyped element %d", j)
		} else {
			r.Equal(-1.0, er[2*j], "ExscanTyped leaves rank 0's recv")
		}
	}
	// ReduceScatter: rank i gets i%2+1 strided values.
	rcounts := make([]int, p)
	rtotal := 0
	for i := range rcounts {
		rcounts[i] = i%2 + 1
		rtotal += rcounts[i]
	}
	rss := make([]float64, 2*rtotal)
	for i := range rtotal {
		rss[2*i] = val(me, i)
	}
	rsr := make([]float64, 2*rcounts[me])
	run("ReduceScatterTyped", func() error { return ReduceScatterTyped(w, rss, rsr, rcounts, ev, Sum[float64]()) },
		func() (Request, error) { return IreduceScatterTyped(w, rss, rsr, rcounts, ev, Sum[float64]()) })
	at := 0
	for i := range me {
		at += rcounts[i]
	}
	for k := range rcounts[me] {
		want := 0.0
		for q := range p {
			want += val(q, at+k)
		}
		r.Equal(want, rsr[2*k], "ReduceScatterTyped element %d", k)
	}
	if !nb {
		blk := make([]float64, 2)
		r.NoError(ReduceScatterBlockTyped(w, make([]float64, 2*p), blk, 1, ev, Sum[float64]()))
	}
}

func TestTypedVCollectives(t *testing.T) {
	for _, p := range []int{1, 2, 3, 5} {
		for _, nb := range []bool{false, true} {
			t.Run(fmt.Sprintf("p%d/nb=%v", p, nb), func(t *testing.T) {
				runJob(t, "loop", p, Config{}, func(r *rk, w *Comm) { typedVCollectives(r, w, nb) })
			})
		}
	}
	eachNetwork(t, 3, func(r *rk, w *Comm) {
		typedVCollectives(r, w, false)
		typedVCollectives(r, w, true)
	})
}

// TestPersistentTyped starts persistent collectives with datatypes several
// times with new data, in place too: every start packs and unpacks anew.
func TestPersistentTyped(t *testing.T) {
	for _, p := range []int{1, 2, 3} {
		runJob(t, "loop", p, Config{}, func(r *rk, w *Comm) {
			me := w.Rank()
			ev, err := TypeCreateResized(Float64, 0, 16) // every other float64
			r.NoError(err)
			r.NoError(ev.Commit())
			const n = 3
			bb := make([]float64, 2*n)
			ars, arr := make([]float64, 2*n), make([]float64, 2*n)
			ag := make([]float64, 2*n*p) // in place: this rank's block is in it
			a2s, a2r := make([]float64, 2*n*p), make([]float64, 2*n*p)
			mk := func(q Request, err error) Request { r.NoError(err); return q }
			reqs := []Request{
				mk(BcastInitTyped(w, bb, n, ev, 0)),
				mk(AllreduceInitTyped(w, ars, arr, n, ev, Sum[float64]())),
				mk(AllgatherInitTyped[float64](w, nil, n, ev, ag, n, ev)),
				mk(AlltoallInitTyped(w, a2s, n, ev, a2r, n, ev)),
			}
			for round := range 3 {
				v := func(rank, j int) float64 { return float64(round*1000 + rank*10 + j) }
				for j := range n {
					if me == 0 {
						bb[2*j] = v(0, j)
					}
					ars[2*j] = v(me, j)
					ag[2*(me*n+j)] = v(me, j)
					for q := range p {
						a2s[2*(q*n+j)] = v(me, q*n+j)
					}
				}
				r.NoError(Startall(reqs))
				r.NoError(Waitall(reqs, nil))
				for j := range n {
					r.Equal(v(0, j), bb[2*j], "BcastInitTyped start %d", round)
					sum := 0.0
					for q := range p {
						sum += v(q, j)
						r.Equal(v(q, j), ag[2*(q*n+j)], "AllgatherInitTyped in place start %d block %d", round, q)
						r.Equal(v(q, me*n+j), a2r[2*(q*n+j)], "AlltoallInitTyped start %d from %d", round, q)
					}
					r.Equal(sum, arr[2*j], "AllreduceInitTyped start %d", round)
				}
			}
		})
	}
}

// TestPersistentTypedV starts the persistent typed v, prefix and
// reduce-scatter collectives several times, in place where MPI allows.
func TestPersistentTypedV(t *testing.T) {
	for _, p := range []int{1, 3} {
		runJob(t, "loop", p, Config{}, func(r *rk, w *Comm) {
			me := w.Rank()
			ev, err := TypeCreateResized(Float64, 0, 16)
			r.NoError(err)
			r.NoError(ev.Commit())
			counts, displs := make([]int, p), make([]int, p)
			total := 0
			for i := range p {
				counts[i], displs[i] = i+1, total
				total += i + 1
			}
			ag := make([]float64, 2*total) // Allgatherv in place
			sc, sr := make([]float64, 2), make([]float64, 2)
			rcounts := make([]int, p)
			for i := range rcounts {
				rcounts[i] = 1
			}
			rss, rsr := make([]float64, 2*p), make([]float64, 2)
			mk := func(q Request, err error) Request { r.NoError(err); return q }
			reqs := []Request{
				mk(AllgathervInitTyped[float64](w, nil, 0, nil, ag, counts, displs, ev)),
				mk(ScanInitTyped(w, sc, sr, 1, ev, Sum[float64]())),
				mk(ReduceScatterInitTyped(w, rss, rsr, rcounts, ev, Sum[float64]())),
			}
			for round := range 3 {
				v := func(rank, j int) float64 { return float64(round*1000 + rank*10 + j) }
				for j := range me + 1 {
					ag[2*(displs[me]+j)] = v(me, j)
				}
				sc[0] = v(me, 0)
				for i := range p {
					rss[2*i] = v(me, i)
				}
				r.NoError(Startall(reqs))
				r.NoError(Waitall(reqs, nil))
				scan, rs := 0.0, 0.0
				for q := range p {
					for j := range q + 1 {
						r.Equal(v(q, j), ag[2*(displs[q]+j)], "AllgathervInitTyped start %d", round)
					}
					if q <= me {
						scan += v(q, 0)
					}
					rs += v(q, me)
				}
				r.Equal(scan, sr[0], "ScanInitTyped start %d", round)
				r.Equal(rs, rsr[0], "ReduceScatterInitTyped start %d", round)
			}
		})
	}
}
