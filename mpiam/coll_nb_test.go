package mpiam

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// affineOp composes maps x -> a·x + b stored as pairs: associative and not
// commutative, so a result combined out of rank order shows.
type affine struct{ A, B int64 }

var affineOp = NewOp("affine", func(in, inout []affine) {
	for i := range inout {
		inout[i] = affine{in[i].A * inout[i].A, in[i].B*inout[i].A + inout[i].B}
	}
}, false)

func affineOf(r, i int) affine { return affine{int64((r+i)%3 + 1), int64(r*7 + i)} }

// nbCase is one collective in its blocking form and its nonblocking form,
// each writing its result into the slice it returns; both are called on
// every rank with the same arguments.
type nbCase struct {
	name string
	run  func(w *Comm, nb bool) (result func() any, req Request, err error)
}

// nbCases are every nonblocking collective of MPI-4.1 §6.12 against its
// blocking form, with in-place variants, for a vector length m.
func nbCases(m int) []nbCase {
	vecN := func(w *Comm, salt, n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64((w.Rank()+1)*(i+salt)%17) + 0.25
		}
		return v
	}
	vec := func(w *Comm, salt int) []float64 { return vecN(w, salt, m) }
	aff := func(w *Comm) []affine {
		v := make([]affine, m)
		for i := range v {
			v[i] = affineOf(w.Rank(), i)
		}
		return v
	}
	done := func(out any) func() any { return func() any { return out } }
	return []nbCase{
		{"Barrier", func(w *Comm, nb bool) (func() any, Request, error) {
			if nb {
				r, err := w.Ibarrier()
				return done(nil), r, err
			}
			return done(nil), Request{}, w.Barrier()
		}},
		{"Bcast", func(w *Comm, nb bool) (func() any, Request, error) {
			buf := make([]float64, m)
			root := w.Size() / 2
			if w.Rank() == root {
				buf = vec(w, 1)
			}
			if nb {
				r, err := Ibcast(w, buf, root)
				return done(buf), r, err
			}
			return done(buf), Request{}, Bcast(w, buf, root)
		}},
		{"Reduce/sum", func(w *Comm, nb bool) (func() any, Request, error) {
			out := make([]float64, m)
			if nb {
				r, err := Ireduce(w, vec(w, 2), out, Sum[float64](), w.Size()-1)
				return done(out), r, err
			}
			return done(out), Request{}, Reduce(w, vec(w, 2), out, Sum[float64](), w.Size()-1)
		}},
		{"Reduce/affine/inplace", func(w *Comm, nb bool) (func() any, Request, error) {
			root := w.Size() / 2
			out := aff(w)
			send := aff(w)
			if w.Rank() == root {
				send = nil
			}
			if nb {
				r, err := Ireduce(w, send, out, affineOp, root)
				return done(out), r, err
			}
			return done(out), Request{}, Reduce(w, send, out, affineOp, root)
		}},
		{"Allreduce/sum", func(w *Comm, nb bool) (func() any, Request, error) {
			out := make([]float64, m)
			if nb {
				r, err := Iallreduce(w, vec(w, 3), out, Sum[float64]())
				return done(out), r, err
			}
			return done(out), Request{}, Allreduce(w, vec(w, 3), out, Sum[float64]())
		}},
		{"Allreduce/affine/inplace", func(w *Comm, nb bool) (func() any, Request, error) {
			out := aff(w)
			if nb {
				r, err := Iallreduce(w, nil, out, affineOp)
				return done(out), r, err
			}
			return done(out), Request{}, Allreduce(w, nil, out, affineOp)
		}},
		{"Gather", func(w *Comm, nb bool) (func() any, Request, error) {
			out := make([]float64, m*w.Size())
			if nb {
				r, err := Igather(w, vec(w, 4), out, 0)
				return done(out), r, err
			}
			return done(out), Request{}, Gather(w, vec(w, 4), out, 0)
		}},
		{"Gatherv", func(w *Comm, nb bool) (func() any, Request, error) {
			counts, displs := vCounts(w.Size(), m)
			out := make([]float64, displs[w.Size()-1]+counts[w.Size()-1]+1)
			send := vecN(w, 5, counts[w.Rank()])
			if nb {
				r, err := Igatherv(w, send, out, counts, displs, w.Size()-1)
				return done(out), r, err
			}
			return done(out), Request{}, Gatherv(w, send, out, counts, displs, w.Size()-1)
		}},
		{"Scatter", func(w *Comm, nb bool) (func() any, Request, error) {
			out := make([]float64, m)
			send := make([]float64, m*w.Size())
			for i := range send {
				send[i] = float64(i)
			}
			if nb {
				r, err := Iscatter(w, send, out, 0)
				return done(out), r, err
			}
			return done(out), Request{}, Scatter(w, send, out, 0)
		}},
		{"Scatterv", func(w *Comm, nb bool) (func() any, Request, error) {
			counts, displs := vCounts(w.Size(), m)
			send := make([]float64, displs[w.Size()-1]+counts[w.Size()-1])
			for i := range send {
				send[i] = float64(i)
			}
			out := make([]float64, counts[w.Rank()])
			if nb {
				r, err := Iscatterv(w, send, counts, displs, out, 1%w.Size())
				return done(out), r, err
			}
			return done(out), Request{}, Scatterv(w, send, counts, displs, out, 1%w.Size())
		}},
		{"Allgather", func(w *Comm, nb bool) (func() any, Request, error) {
			out := make([]float64, m*w.Size())
			if nb {
				r, err := Iallgather(w, vec(w, 6), out)
				return done(out), r, err
			}
			return done(out), Request{}, Allgather(w, vec(w, 6), out)
		}},
		{"Allgatherv/inplace", func(w *Comm, nb bool) (func() any, Request, error) {
			counts, displs := vCounts(w.Size(), m)
			out := make([]float64, displs[w.Size()-1]+counts[w.Size()-1])
			copy(out[displs[w.Rank()]:], vecN(w, 7, counts[w.Rank()]))
			if nb {
				r, err := Iallgatherv(w, nil, out, counts, displs)
				return done(out), r, err
			}
			return done(out), Request{}, Allgatherv(w, nil, out, counts, displs)
		}},
		{"Alltoall", func(w *Comm, nb bool) (func() any, Request, error) {
			send := vec(w, 8)
			send = slices.Repeat(send, w.Size())
			for i := range send {
				send[i] += float64(i)
			}
			out := make([]float64, len(send))
			if nb {
				r, err := Ialltoall(w, send, out)
				return done(out), r, err
			}
			return done(out), Request{}, Alltoall(w, send, out)
		}},
		{"Alltoall/inplace", func(w *Comm, nb bool) (func() any, Request, error) {
			out := slices.Repeat(vec(w, 9), w.Size())
			for i := range out {
				out[i] += float64(i * w.Rank())
			}
			if nb {
				r, err := Ialltoall(w, nil, out)
				return done(out), r, err
			}
			return done(out), Request{}, Alltoall(w, nil, out)
		}},
		{"Alltoallv", func(w *Comm, nb bool) (func() any, Request, error) {
			p, me := w.Size(), w.Rank()
			sc, sd, rc, rd := make([]int, p), make([]int, p), make([]int, p), make([]int, p)
			st, rt := 0, 0
			for j := range p {
				sc[j], sd[j] = (me+j)%3+m%2, st
				st += sc[j] + 1
				rc[j], rd[j] = (j+me)%3+m%2, rt
				rt += rc[j]
			}
			send := make([]float64, st)
			for i := range send {
				send[i] = float64(me*1000 + i)
			}
			out := make([]float64, rt)
			if nb {
				r, err := Ialltoallv(w, send, sc, sd, out, rc, rd)
				return done(out), r, err
			}
			return done(out), Request{}, Alltoallv(w, send, sc, sd, out, rc, rd)
		}},
		{"ReduceScatterBlock", func(w *Comm, nb bool) (func() any, Request, error) {
			out := make([]float64, m)
			send := slices.Repeat(vec(w, 10), w.Size())
			if nb {
				r, err := IreduceScatterBlock(w, send, out, Sum[float64]())
				return done(out), r, err
			}
			return done(out), Request{}, ReduceScatterBlock(w, send, out, Sum[float64]())
		}},
		{"ReduceScatterBlock/affine", func(w *Comm, nb bool) (func() any, Request, error) {
			out := make([]affine, m)
			send := slices.Repeat(aff(w), w.Size())
			if nb {
				r, err := IreduceScatterBlock(w, send, out, affineOp)
				return done(out), r, err
			}
			return done(out), Request{}, ReduceScatterBlock(w, send, out, affineOp)
		}},
		{"Scan/affine", func(w *Comm, nb bool) (func() any, Request, error) {
			out := make([]affine, m)
			if nb {
				r, err := Iscan(w, aff(w), out, affineOp)
				return done(out), r, err
			}
			return done(out), Request{}, Scan(w, aff(w), out, affineOp)
		}},
		{"Exscan/sum", func(w *Comm, nb bool) (func() any, Request, error) {
			out := make([]float64, m)
			if nb {
				r, err := Iexscan(w, vec(w, 11), out, Sum[float64]())
				return done(out), r, err
			}
			return done(out), Request{}, Exscan(w, vec(w, 11), out, Sum[float64]())
		}},
	}
}

// vCounts is uneven blocks around m elements: rank i gets (i*3+m)%5 + m/2.
func vCounts(p, m int) (counts, displs []int) {
	counts, displs = make([]int, p), make([]int, p)
	at := 0
	for i := range p {
		counts[i] = (i*3+m)%5 + m/2
		displs[i] = at
		at += counts[i] + i%2 // a gap after odd blocks
	}
	return counts, displs
}

// TestNonblockingAgainstBlocking runs every nonblocking collective against
// its blocking result on 1-16 ranks, all of them in flight at once with
// point-to-point traffic between, completed in a scrambled order.
func TestNonblockingAgainstBlocking(t *testing.T) {
	for _, n := range collSizes {
		for _, m := range []int{1, 5, 3000} {
			t.Run(fmt.Sprintf("n%d/m%d", n, m), func(t *testing.T) {
				runColl(t, n, func(w *Comm) error {
					cases := nbCases(m)
					want := make([]any, len(cases))
					for i, c := range cases {
						res, _, err := c.run(w, false)
						if err != nil {
							return fmt.Errorf("blocking %s: %w", c.name, err)
						}
						want[i] = res()
					}
					got := make([]func() any, len(cases))
					reqs := make([]Request, 0, 2*len(cases))
					me := w.Rank()
					ring := make([]int, len(cases))
					for i, c := range cases {
						res, r, err := c.run(w, true)
						if err != nil {
							return fmt.Errorf("nonblocking %s: %w", c.name, err)
						}
						got[i] = res
						reqs = append(reqs, r)
						// Point-to-point traffic around the ring between the calls.
						s, err := Isend(w, []int{i}, (me+1)%n, i)
						if err != nil {
							return err
						}
						rr, err := Irecv(w, ring[i:i+1], (me-1+n)%n, i)
						if err != nil {
							return err
						}
						reqs = append(reqs, s, rr)
					}
					// Complete the collectives last first, then the rest.
					for i := len(cases) - 1; i >= 0; i-- {
						if _, err := reqs[3*i].Wait(); err != nil {
							return fmt.Errorf("%s: %w", cases[i].name, err)
						}
					}
					if err := Waitall(reqs, nil); err != nil {
						return err
					}
					for i, c := range cases {
						if !assertEqualResult(want[i], got[i]()) {
							return fmt.Errorf("%s on rank %d: nonblocking %v, blocking %v", c.name, me, got[i](), want[i])
						}
						if ring[i] != i {
							return fmt.Errorf("ring message %d carried %d", i, ring[i])
						}
					}
					return nil
				})
			})
		}
	}
}

func assertEqualResult(a, b any) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// TestNonblockingEveryNetwork runs the nonblocking collectives against the
// blocking ones on every network, eager and rendezvous sizes.
func TestNonblockingEveryNetwork(t *testing.T) {
	eachNetwork(t, 3, func(r *rk, w *Comm) {
		for _, m := range []int{3, 2100} {
			for _, c := range nbCases(m) {
				res, _, err := c.run(w, false)
				r.NoError(err, c.name)
				want := res()
				res, req, err := c.run(w, true)
				r.NoError(err, c.name)
				_, err = req.Wait()
				r.NoError(err, c.name)
				r.Equal(fmt.Sprint(want), fmt.Sprint(res()), "%s m=%d", c.name, m)
			}
		}
	})
}

// TestManyIallreducesInFlight keeps 10^4 Iallreduce calls in flight on one
// communicator: they complete, with the right sums, in the order they were
// started (when one has completed, all earlier ones have).
func TestManyIallreducesInFlight(t *testing.T) {
	const k = 10000
	for _, area := range []bool{false, true} {
		t.Run(fmt.Sprintf("area=%v", area), func(t *testing.T) { manyIallreduces(t, k, area) })
	}
}

// manyIallreduces is TestManyIallreducesInFlight with or without the
// communicator's shared area made first (coll_shm_nb.go).
func manyIallreduces(t *testing.T, k int, area bool) {
	runColl(t, 4, func(w *Comm) error {
		if area {
			if err := w.Barrier(); err != nil {
				return err
			}
		}
		reqs := make([]Request, k)
		out := make([]int, k)
		for i := range k {
			var err error
			if reqs[i], err = Iallreduce(w, []int{i + w.Rank()}, out[i:i+1], Sum[int]()); err != nil {
				return err
			}
		}
		for i := k - 1; i >= 0; i -= 997 {
			for !reqs[i].completed() {
				w.p.progress()
			}
			for j := range i {
				if !reqs[j].completed() {
					return fmt.Errorf("Iallreduce %d complete before %d", i, j)
				}
			}
		}
		if err := Waitall(reqs, nil); err != nil {
			return err
		}
		for i, v := range out {
			if v != 4*i+6 {
				return fmt.Errorf("Iallreduce %d: %d", i, v)
			}
		}
		return nil
	})
}

// TestReduceScatter checks the blocking ReduceScatter against a Reduce and
// the counts, in place and not, commutative and not.
func TestReduceScatter(t *testing.T) {
	for _, n := range collSizes {
		runColl(t, n, func(w *Comm) error {
			counts := make([]int, n)
			total := 0
			for i := range counts {
				counts[i] = (i*5 + 2) % 4
				total += counts[i]
			}
			send := make([]affine, total)
			for i := range send {
				send[i] = affineOf(w.Rank(), i)
			}
			all := make([]affine, total)
			if err := Allreduce(w, send, all, affineOp); err != nil {
				return err
			}
			at := 0
			for i := range w.Rank() {
				at += counts[i]
			}
			want := all[at : at+counts[w.Rank()]]
			out := make([]affine, counts[w.Rank()])
			if err := ReduceScatter(w, send, out, counts, affineOp); err != nil {
				return err
			}
			if !slices.Equal(want, out) {
				return fmt.Errorf("ReduceScatter on rank %d: %v, want %v", w.Rank(), out, want)
			}
			inplace := append([]affine(nil), send...)
			if err := ReduceScatter(w, nil, inplace, counts, affineOp); err != nil {
				return err
			}
			if !slices.Equal(want, inplace[:len(want)]) {
				return fmt.Errorf("in-place ReduceScatter on rank %d: %v, want %v", w.Rank(), inplace[:len(want)], want)
			}
			req, err := IreduceScatter(w, send, out, counts, affineOp)
			if err != nil {
				return err
			}
			if _, err := req.Wait(); err != nil {
				return err
			}
			if !slices.Equal(want, out) {
				return fmt.Errorf("IreduceScatter on rank %d: %v, want %v", w.Rank(), out, want)
			}
			return nil
		})
	}
}

// TestNonblockingBadArguments: argument errors come from the call, with
// their class.
func TestNonblockingBadArguments(t *testing.T) {
	runColl(t, 3, func(w *Comm) error {
		buf := make([]int, 3)
		checks := []struct {
			name string
			err  error
			want error
		}{
			{"Ibcast root", second(Ibcast(w, buf, 3)), ErrRoot},
			{"Ireduce root", second(Ireduce(w, buf, buf, Sum[int](), -1)), ErrRoot},
			{"Iallreduce count", second(Iallreduce(w, buf, buf[:2], Sum[int]())), ErrCount},
			{"Igather count", second(Igather(w, buf, make([]int, 4), w.Rank())), ErrCount},
			{"Igatherv counts", second(Igatherv(w, buf, buf, []int{1}, []int{0}, w.Rank())), ErrCount},
			{"Iscatterv outside", second(Iscatterv(w, buf, []int{1, 1, 5}, []int{0, 1, 2}, buf[:1], w.Rank())), ErrCount},
			{"Iallgather count", second(Iallgather(w, buf, make([]int, 4))), ErrCount},
			{"Ialltoall count", second(Ialltoall(w, buf, make([]int, 6))), ErrCount},
			{"Ialltoallv nil counts", second(Ialltoallv(w, buf, nil, nil, buf, nil, nil)), ErrCount},
			{"IreduceScatter counts", second(IreduceScatter(w, buf, buf, []int{1, 1}, Sum[int]())), ErrCount},
			{"IreduceScatterBlock in place", second(IreduceScatterBlock(w, nil, make([]int, 4), Sum[int]())), ErrCount},
			{"Iscan count", second(Iscan(w, buf, buf[:1], Sum[int]())), ErrCount},
			{"AllreduceInit count", second(AllreduceInit(w, buf, buf[:1], Sum[int]())), ErrCount},
			{"Ibcast pointers", second(Ibcast(w, []*int{nil}, 0)), ErrType},
		}
		for _, c := range checks {
			if !errors.Is(c.err, c.want) {
				return fmt.Errorf("%s: %v, want %v", c.name, c.err, c.want)
			}
		}
		var nilComm *Comm
		if _, err := nilComm.Ibarrier(); !errors.Is(err, ErrComm) {
			return fmt.Errorf("Ibarrier on nil: %v", err)
		}
		return nil
	})
}

func second[A any](_ A, err error) error { return err }

// TestPersistentCollectives starts each persistent collective several
// times with new data: every start gives the blocking result; Start on an
// active request is refused.
func TestPersistentCollectives(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 8} {
		runColl(t, n, func(w *Comm) error {
			const m = 7
			p, me := w.Size(), w.Rank()
			bbuf := make([]float64, m)
			rsend, rrecv := make([]float64, m), make([]float64, m)
			asend, arecv := make([]float64, m), make([]float64, m)
			gsend, grecv := make([]float64, m), make([]float64, m*p)
			ssend, srecv := make([]float64, m*p), make([]float64, m)
			agsend, agrecv := make([]float64, m), make([]float64, m*p)
			a2send, a2recv := make([]float64, m*p), make([]float64, m*p)
			rsbsend, rsbrecv := make([]float64, m*p), make([]float64, m)
			type pair struct {
				name string
				req  Request
				err  error
			}
			mk := func(name string) func(Request, error) pair {
				return func(r Request, err error) pair { return pair{name, r, err} }
			}
			reqs := []pair{
				mk("Barrier")(w.BarrierInit()),
				mk("Bcast")(BcastInit(w, bbuf, p-1)),
				mk("Reduce")(ReduceInit(w, rsend, rrecv, Sum[float64](), 0)),
				mk("Allreduce")(AllreduceInit(w, asend, arecv, Sum[float64]())),
				mk("Gather")(GatherInit(w, gsend, grecv, p/2)),
				mk("Scatter")(ScatterInit(w, ssend, srecv, p/2)),
				mk("Allgather")(AllgatherInit(w, agsend, agrecv)),
				mk("Alltoall")(AlltoallInit(w, a2send, a2recv)),
				mk("ReduceScatterBlock")(ReduceScatterBlockInit(w, rsbsend, rsbrecv, Sum[float64]())),
			}
			all := make([]Request, len(reqs))
			for i, r := range reqs {
				if r.err != nil {
					return fmt.Errorf("%sInit: %w", r.name, r.err)
				}
				all[i] = r.req
			}
			for round := range 4 {
				fill := func(b []float64, salt int) {
					for i := range b {
						b[i] = float64(round*100 + me*10 + i + salt)
					}
				}
				for _, b := range [][]float64{bbuf, rsend, asend, gsend, ssend, agsend, a2send, rsbsend} {
					fill(b, len(b))
				}
				bwant := slices.Clone(bbuf)
				if err := Bcast(w, bwant, p-1); err != nil {
					return err
				}
				rwant, awant, gwant := make([]float64, m), make([]float64, m), make([]float64, m*p)
				swant, agwant, a2want, rsbwant := make([]float64, m), make([]float64, m*p), make([]float64, m*p), make([]float64, m)
				if err := errors.Join(Reduce(w, rsend, rwant, Sum[float64](), 0), Allreduce(w, asend, awant, Sum[float64]()),
					Gather(w, gsend, gwant, p/2), Scatter(w, ssend, swant, p/2), Allgather(w, agsend, agwant),
					Alltoall(w, a2send, a2want), ReduceScatterBlock(w, rsbsend, rsbwant, Sum[float64]())); err != nil {
					return err
				}
				if err := Startall(all); err != nil {
					return err
				}
				if err := all[3].Start(); !errors.Is(err, ErrRequest) {
					return fmt.Errorf("Start of an active persistent Allreduce: %v", err)
				}
				if err := Waitall(all, nil); err != nil {
					return err
				}
				if slices.ContainsFunc(all, func(r Request) bool { return r == Request{} }) {
					return fmt.Errorf("Waitall set a persistent request to null")
				}
				checks := []struct {
					name      string
					got, want []float64
					mine      bool
				}{
					{"Bcast", bbuf, bwant, true},
					{"Reduce", rrecv, rwant, me == 0},
					{"Allreduce", arecv, awant, true},
					{"Gather", grecv, gwant, me == p/2},
					{"Scatter", srecv, swant, true},
					{"Allgather", agrecv, agwant, true},
					{"Alltoall", a2recv, a2want, true},
					{"ReduceScatterBlock", rsbrecv, rsbwant, true},
				}
				for _, c := range checks {
					if c.mine && !slices.Equal(c.got, c.want) {
						return fmt.Errorf("start %d, %s on rank %d: %v, want %v", round, c.name, me, c.got, c.want)
					}
				}
			}
			for _, r := range all {
				if err := r.Free(); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

// TestPersistentAllreduceZeroAllocs: a started persistent Allreduce
// allocates nothing once warm.
func TestPersistentAllreduceZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const warm, runs = 50, 500
	runJob(t, "loop", 2, Config{}, func(r *rk, w *Comm) {
		send, recv := []float64{1, 2, 3}, make([]float64, 3)
		req, err := AllreduceInit(w, send, recv, Sum[float64]())
		r.NoError(err)
		once := func() {
			if err := req.Start(); err != nil {
				panic(err)
			}
			if _, err := req.Wait(); err != nil {
				panic(err)
			}
		}
		if w.Rank() == 1 {
			for range warm + runs + 1 {
				once()
			}
			return
		}
		for range warm {
			once()
		}
		allocs := testing.AllocsPerRun(runs, once)
		r.Equal([]float64{2, 4, 6}, recv)
		r.Zero(allocs, "allocations per Start+Wait")
	})
}

// TestScheduleCache: a one-shot call with the same buffers, lengths, root
// and operation as a finished one reuses its schedule; any difference
// builds a new one, so results follow the arguments.
func TestScheduleCache(t *testing.T) {
	runColl(t, 3, func(w *Comm) error {
		me := w.Rank()
		buf := make([]int, 4)
		out := make([]int, 4)
		scale := func(k int) Op[int] { // same code, different captured k: different operations
			return NewOp("scaled-sum", func(in, io []int) {
				for i := range io {
					io[i] = in[i] + io[i] + k
				}
			}, true)
		}
		type call struct {
			n    int
			op   Op[int]
			want func(i int) int // element i of the result
		}
		calls := []call{
			{4, Sum[int](), func(i int) int { return 3*i + 3 }},
			{4, Sum[int](), func(i int) int { return 3*i + 3 }},
			{4, Max[int](), func(i int) int { return i + 2 }},
			{2, Sum[int](), func(i int) int { return 3*i + 3 }},
			{4, scale(1), func(i int) int { return 3*i + 3 + 2 }},
			{4, scale(10), func(i int) int { return 3*i + 3 + 20 }},
			{4, Sum[int](), func(i int) int { return 3*i + 3 }},
		}
		for round := range 3 {
			for k, c := range calls {
				for i := range buf {
					buf[i] = i + me
				}
				clear(out)
				req, err := Iallreduce(w, buf[:c.n], out[:c.n], c.op)
				if err != nil {
					return err
				}
				if _, err := req.Wait(); err != nil {
					return err
				}
				for i := range c.n {
					if out[i] != c.want(i) {
						return fmt.Errorf("round %d call %d: element %d is %d, want %d", round, k, i, out[i], c.want(i))
					}
				}
			}
		}
		hits := 0
		w.p.nbc.mu.Lock()
		for _, n := range w.schedCache {
			if n != nil {
				hits++
			}
		}
		w.p.nbc.mu.Unlock()
		if hits == 0 {
			return fmt.Errorf("no schedule kept")
		}
		return nil
	})
}

// TestPersistentVariants starts the persistent v, w, prefix and
// neighborhood collectives several times with new data and compares each
// start with the blocking form.
func TestPersistentVariants(t *testing.T) {
	for _, p := range []int{1, 3, 4} {
		runJob(t, "loop", p, Config{}, func(r *rk, w *Comm) {
			me := w.Rank()
			counts, displs := vCounts(p, 3)
			total := displs[p-1] + counts[p-1] + 1
			gsend, grecv := make([]float64, counts[me]), make([]float64, total)
			ssend, srecv := make([]float64, total), make([]float64, counts[me])
			agrecv := make([]float64, total)
			a2s, a2r := make([]float64, 2*p), make([]float64, 2*p)
			a2c, a2d := evenBlocks(p, 2)
			rscounts := make([]int, p)
			for i := range rscounts {
				rscounts[i] = i%2 + 1
			}
			rstotal := 0
			for _, c := range rscounts {
				rstotal += c
			}
			rssend, rsrecv := make([]float64, rstotal), make([]float64, rscounts[me])
			scs, scr := make([]affine, 2), make([]affine, 2)
			exs, exr := make([]float64, 2), make([]float64, 2)
			// Alltoallw: to each rank one float64, received at a stride of 2.
			ws, wr := make([]float64, p), make([]float64, 2*p)
			wcnt, wsd, wrd := make([]int, p), make([]int, p), make([]int, p)
			wt := make([]*Datatype, p)
			for j := range p {
				wcnt[j], wsd[j], wrd[j], wt[j] = 1, 8*j, 16*j, Float64
			}
			cart, err := w.CartCreate([]int{p}, []bool{true}, false)
			r.NoError(err)
			nsend, nrecv := make([]float64, 2), make([]float64, 4)
			mk := func(req Request, err error) Request { r.NoError(err); return req }
			reqs := []Request{
				mk(GathervInit(w, gsend, grecv, counts, displs, p-1)),
				mk(ScattervInit(w, ssend, counts, displs, srecv, 0)),
				mk(AllgathervInit(w, gsend, agrecv, counts, displs)),
				mk(AlltoallvInit(w, a2s, a2c, a2d, a2r, a2c, a2d)),
				mk(AlltoallwInit(w, ws, wcnt, wsd, wt, wr, wcnt, wrd, wt)),
				mk(ReduceScatterInit(w, rssend, rsrecv, rscounts, Sum[float64]())),
				mk(ScanInit(w, scs, scr, affineOp)),
				mk(ExscanInit(w, exs, exr, Sum[float64]())),
				mk(NeighborAllgatherInit(cart, nsend[:1], nrecv[:2])),
				mk(NeighborAlltoallInit(cart, nsend, nrecv[2:])),
			}
			for round := range 3 {
				v := func(i int) float64 { return float64(round*1000 + me*100 + i) }
				for i := range gsend {
					gsend[i] = v(i)
				}
				for i := range ssend {
					ssend[i] = v(i)
				}
				for i := range a2s {
					a2s[i] = v(i)
				}
				for i := range ws {
					ws[i] = v(i)
				}
				for i := range rssend {
					rssend[i] = v(i)
				}
				for i := range scs {
					scs[i] = affineOf(me+round, i)
				}
				for i := range exs {
					exs[i] = v(i)
				}
				for i := range nsend {
					nsend[i] = v(i)
				}
				r.NoError(Startall(reqs))
				r.NoError(Waitall(reqs, nil))
				// The blocking forms, for comparison.
				wg, wsr, wag := make([]float64, total), make([]float64, counts[me]), make([]float64, total)
				wa2 := make([]float64, 2*p)
				wrs := make([]float64, rscounts[me])
				wsc, wex := make([]affine, 2), make([]float64, 2)
				r.NoError(Gatherv(w, gsend, wg, counts, displs, p-1))
				r.NoError(Scatterv(w, ssend, counts, displs, wsr, 0))
				r.NoError(Allgatherv(w, gsend, wag, counts, displs))
				r.NoError(Alltoallv(w, a2s, a2c, a2d, wa2, a2c, a2d))
				r.NoError(ReduceScatter(w, rssend, wrs, rscounts, Sum[float64]()))
				r.NoError(Scan(w, scs, wsc, affineOp))
				r.NoError(Exscan(w, exs, wex, Sum[float64]()))
				if me == p-1 {
					r.Equal(wg, grecv, "GathervInit start %d", round)
				}
				r.Equal(wsr, srecv, "ScattervInit start %d", round)
				r.Equal(wag, agrecv, "AllgathervInit start %d", round)
				r.Equal(wa2, a2r, "AlltoallvInit start %d", round)
				for j := range p {
					r.Equal(float64(round*1000+j*100+me), wr[2*j], "AlltoallwInit start %d from %d", round, j)
				}
				r.Equal(wrs, rsrecv, "ReduceScatterInit start %d", round)
				r.Equal(wsc, scr, "ScanInit start %d", round)
				if me > 0 {
					r.Equal(wex, exr, "ExscanInit start %d", round)
				}
				left, right := (me-1+p)%p, (me+1)%p
				lv := func(i int) float64 { return float64(round*1000 + left*100 + i) }
				rv := func(i int) float64 { return float64(round*1000 + right*100 + i) }
				r.Equal([]float64{lv(0), rv(0)}, nrecv[:2], "NeighborAllgatherInit start %d", round)
				// Also with 1 or 2 ranks, where both neighbors are one rank:
				// the block sent down lands in the block from above (MPI-4.1
				// Example 8.10).
				r.Equal([]float64{lv(1), rv(0)}, nrecv[2:], "NeighborAlltoallInit start %d", round)
			}
			for _, q := range reqs {
				r.NoError(q.Free())
			}
		})
	}
}

// Iallreduce and AllreduceInit of vectors past AMGO_IALLREDUCE_RING run the
// ring schedule, which with a send buffer of its own sends from it and
// receives into recv without copying first; in place it copies as before.
// Both against the serial sums, on 2 to 4 ranks.
func TestIallreduceRingApartAndInPlace(t *testing.T) {
	n := iallreduceRing/8 + 37 // float64s: past the threshold, not a multiple of the ranks
	for _, p := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("ranks=%d", p), func(t *testing.T) {
			runJob(t, "loop", p, Config{}, func(r *rk, w *Comm) {
				send, got := make([]float64, n), make([]float64, n)
				for i := range send {
					send[i] = value(w.Rank(), i)
				}
				req, err := Iallreduce(w, send, got, Sum[float64]())
				r.NoError(err)
				_, err = req.Wait()
				r.NoError(err)
				for i := range got {
					if got[i] != sumOver(p, i) {
						r.Failf("apart", "element %d: %v, want %v", i, got[i], sumOver(p, i))
					}
				}
				inPlace := append([]float64(nil), send...)
				req, err = Iallreduce(w, nil, inPlace, Sum[float64]())
				r.NoError(err)
				_, err = req.Wait()
				r.NoError(err)
				r.Equal(got, inPlace, "in place")
				pers := make([]float64, n)
				preq, err := AllreduceInit(w, send, pers, Sum[float64]())
				r.NoError(err)
				for range 2 {
					clear(pers)
					r.NoError(preq.Start())
					_, err = preq.Wait()
					r.NoError(err)
					r.Equal(got, pers, "persistent")
				}
				r.NoError(preq.Free())
			})
		})
	}
}
