package mpiam

import (
	"testing"
)

// typeCheckCases sends pairs of (send, receive) types between ranks 0 and
// 1 and checks which receives the checking mode refuses: eager and
// rendezvous sizes, posted before and after the message arrives, every
// receive form.
func typeCheckCases(r *rk, w *Comm, n int) {
	me := w.Rank()
	other := 1 - me
	f64 := make([]float64, n)
	i64 := make([]int64, n)
	vec := strided(r, n)
	wide := make([]float64, 2*n)
	pair, err := DatatypeOf[struct {
		A int64
		B float64
	}]()
	r.NoError(err)
	pairs := make([]struct {
		A int64
		B float64
	}, n/2)
	tag := 0
	next := func() int { tag++; return tag }

	// Same element type: fine, slice to slice and datatype to slice.
	t := next()
	if me == 0 {
		r.NoError(Send(w, f64, other, t))
		r.NoError(SendTyped(w, wide, 1, vec, other, t))
	} else {
		_, err := Recv(w, f64, other, t)
		r.NoError(err, "float64 into float64")
		_, err = Recv(w, f64, other, t)
		r.NoError(err, "vector of float64 into float64")
	}
	// A shorter message is a prefix of the receive: fine.
	t = next()
	if me == 0 {
		r.NoError(Send(w, f64[:n/2], other, t))
	} else {
		_, err := Recv(w, f64, other, t)
		r.NoError(err, "prefix")
	}
	// Bytes match anything of the same size.
	t = next()
	if me == 0 {
		r.NoError(Send(w, make([]byte, 8*n), other, t))
	} else {
		_, err := Recv(w, f64, other, t)
		r.NoError(err, "bytes into float64")
	}
	// Other element types: refused, at the receive, eager or rendezvous,
	// posted first or not; the sender's call succeeds.
	t = next()
	if me == 0 {
		r.NoError(Send(w, f64, other, t))
		r.NoError(w.Barrier())
		r.NoError(Send(w, f64, other, t))
	} else {
		req, err := Irecv(w, i64, other, t) // posted before the message
		r.NoError(err)
		_, err = req.Wait()
		r.ErrorIs(err, ErrType, "float64 into int64, posted first")
		r.NoError(w.Barrier())
		_, err = Recv(w, i64, other, t)
		r.ErrorIs(err, ErrType, "float64 into int64")
	}
	// A struct of (int64, float64) against float64s, in both directions.
	t = next()
	if me == 0 {
		r.NoError(SendTyped(w, pairs, len(pairs), pair, other, t))
		r.NoError(Send(w, f64[:2*len(pairs)], other, t))
	} else {
		_, err := Recv(w, f64[:2*len(pairs)], other, t)
		r.ErrorIs(err, ErrType, "struct into float64")
		_, err = RecvTyped(w, pairs, len(pairs), pair, other, t)
		r.ErrorIs(err, ErrType, "float64 into struct")
	}
	// Sendrecv, persistent and matched-probe receives are checked too.
	t = next()
	if me == 0 {
		_, err := Sendrecv(w, f64, other, t, i64, other, t)
		r.ErrorIs(err, ErrType, "Sendrecv's receive")
		s, err := SendInit(w, f64, other, t, Standard)
		r.NoError(err)
		r.NoError(s.Start())
		_, err = s.Wait()
		r.NoError(err)
		r.NoError(Send(w, f64, other, t))
	} else {
		_, err := Sendrecv(w, f64, other, t, i64, other, t)
		r.ErrorIs(err, ErrType, "Sendrecv's receive")
		rq, err := RecvInit(w, i64, other, t)
		r.NoError(err)
		r.NoError(rq.Start())
		_, err = rq.Wait()
		r.ErrorIs(err, ErrType, "persistent receive")
		m, _, err := w.Mprobe(other, t)
		r.NoError(err)
		_, err = Mrecv(m, i64)
		r.ErrorIs(err, ErrType, "Mrecv")
	}
	r.NoError(w.Barrier())
}

// TestTypeCheckMode runs the type-signature checks on every network, at an
// eager and a rendezvous size.
func TestTypeCheckMode(t *testing.T) {
	t.Setenv(EnvCheckTypes, "1")
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		r.True(w.p.checkTypes)
		typeCheckCases(r, w, 16)
		typeCheckCases(r, w, 40000)
	})
}

// TestTypeCheckOff: without the mode, a receive of another element type of
// the same bytes succeeds, as MPI leaves the check to the implementation.
func TestTypeCheckOff(t *testing.T) {
	t.Setenv(EnvCheckTypes, "")
	runJob(t, "loop", 2, Config{}, func(r *rk, w *Comm) {
		r.False(w.p.checkTypes)
		buf := make([]float64, 4)
		if w.Rank() == 0 {
			r.NoError(Send(w, buf, 1, 1))
		} else {
			_, err := Recv(w, make([]int64, 4), 0, 1)
			r.NoError(err)
		}
	})
}

// TestTypeCheckCollectives: in the checking mode a collective whose ranks'
// blocks differ in type signature fails on every rank with ErrType, before
// any data moves, and the communicator goes on working.
func TestTypeCheckCollectives(t *testing.T) {
	t.Setenv(EnvCheckTypes, "1")
	for _, nw := range []string{"loop", "shm"} {
		t.Run(nw, func(t *testing.T) {
			runJob(t, nw, 3, Config{}, func(r *rk, w *Comm) {
				me := w.Rank()
				f := []float64{1, 2}
				i := []int64{1, 2}
				fo, io := make([]float64, 2), make([]int64, 2)
				// Same types: fine.
				r.NoError(Allreduce(w, f, fo, Sum[float64]()))
				r.Equal([]float64{3, 6}, fo)
				// Rank 1 reduces int64s, the others float64s.
				var err error
				if me == 1 {
					err = Allreduce(w, i, io, Sum[int64]())
				} else {
					err = Allreduce(w, f, fo, Sum[float64]())
				}
				r.ErrorIs(err, ErrType, "Allreduce of mixed types")
				// Bytes match anything.
				if me == 0 {
					r.NoError(Bcast(w, make([]byte, 16), 0))
				} else {
					r.NoError(Bcast(w, make([]float64, 2), 0))
				}
				// A Gather block of another length is another signature.
				all := make([]float64, 6)
				send := f
				if me == 2 {
					send = []float64{1, 2, 3}
				}
				r.ErrorIs(Gather(w, send, all, 0), ErrType, "Gather with a longer block")
				// Nonblocking and persistent: the request fails.
				var q Request
				if me == 1 {
					q, err = Iallreduce(w, i, io, Sum[int64]())
				} else {
					q, err = Iallreduce(w, f, fo, Sum[float64]())
				}
				r.NoError(err)
				_, err = q.Wait()
				r.ErrorIs(err, ErrType, "Iallreduce of mixed types")
				var p Request
				if me == 2 {
					p, err = AllreduceInit(w, i, io, Sum[int64]())
				} else {
					p, err = AllreduceInit(w, f, fo, Sum[float64]())
				}
				r.NoError(err)
				for range 2 {
					r.NoError(p.Start())
					_, err = p.Wait()
					r.ErrorIs(err, ErrType, "AllreduceInit of mixed types")
				}
				// The communicator still works.
				r.NoError(Allreduce(w, f, fo, Sum[float64]()))
				r.Equal([]float64{3, 6}, fo)
				q, err = Iallreduce(w, f, fo, Sum[float64]())
				r.NoError(err)
				_, err = q.Wait()
				r.NoError(err)
				r.NoError(w.Barrier())
			})
		})
	}
}
