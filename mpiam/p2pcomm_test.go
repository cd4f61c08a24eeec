package mpiam

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// Sendrecv and SendrecvReplace shift data around a ring without deadlock,
// at eager and rendezvous sizes, including the head-to-head case of two
// ranks (MPI-4.1 §3.10; MPICH sendrecv2, sendrecv3, isendrecv_replace).
func TestSendrecvRing_MPI41_3_10(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			eachNetwork(t, n, func(r *rk, w *Comm) {
				me, size := w.Rank(), w.Size()
				next, prev := (me+1)%size, (me+size-1)%size
				for _, count := range []int{1, 3000, 50_000} { // float64s: 8 B, 24 KB, 400 KB
					out := make([]float64, count)
					for i := range out {
						out[i] = float64(me*1_000_000 + i)
					}
					in := make([]float64, count)
					st, err := Sendrecv(w, out, next, 1, in, prev, 1)
					r.NoError(err)
					r.Equal(Status{Source: prev, Tag: 1, Bytes: 8 * count}, st)
					r.Equal(count, GetCount[float64](st))
					for i := range in {
						r.Equal(float64(prev*1_000_000+i), in[i])
					}
					// Replace: pass the buffer all the way round.
					buf := append([]float64(nil), out...)
					for range size {
						st, err = SendrecvReplace(w, buf, next, 2, AnySource, 2)
						r.NoError(err)
						r.Equal(prev, st.Source)
					}
					r.Equal(out, buf)
				}
			})
		})
	}
}

// A rank that exchanges with itself: the receive is posted before the send
// starts, so even a rendezvous send to self completes (MPI-4.1 §3.10).
func TestSendrecvSelf(t *testing.T) {
	err := RunLocal(1, Config{}, func(w *Comm) error {
		for _, count := range []int{1, 3000, 50_000} {
			out := make([]float64, count)
			for i := range out {
				out[i] = float64(i) + 0.5
			}
			in := make([]float64, count)
			st, err := Sendrecv(w, out, 0, 7, in, 0, 7)
			if err != nil {
				return err
			}
			if st != (Status{Source: 0, Tag: 7, Bytes: 8 * count}) || !slices.Equal(out, in) {
				return fmt.Errorf("count %d: status %+v, data equal %v", count, st, slices.Equal(out, in))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Typed buffers travel as their bytes; GetCount gives elements of the
// receiver's type, or Undefined when the bytes are not a whole number of
// them (MPI-4.1 §3.2.5 MPI_Get_count).
func TestTypedBuffers_MPI41_3_2_5(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		if w.Rank() == 0 {
			r.NoError(Send(w, []float64{1.5, -2, 3e300}, 1, 1))
			r.NoError(Send(w, []int32{-7, 1 << 30, 0, 5}, 1, 2))
			r.NoError(Send(w, []complex128{complex(1, -1), complex(0, 2.5)}, 1, 3))
			r.NoError(Send(w, []byte{1, 2, 3, 4, 5, 6}, 1, 4)) // 6 bytes: 1.5 int32s
			big := make([]complex128, 5000)                    // rendezvous
			for i := range big {
				big[i] = complex(float64(i), float64(-i))
			}
			r.NoError(Send(w, big, 1, 5))
			return
		}
		f := make([]float64, 4)
		st, err := Recv(w, f, 0, 1)
		r.NoError(err)
		r.Equal(3, GetCount[float64](st))
		r.Equal([]float64{1.5, -2, 3e300, 0}, f)
		i32 := make([]int32, 4)
		st, err = Recv(w, i32, 0, 2)
		r.NoError(err)
		r.Equal(4, GetCount[int32](st))
		r.Equal(2, GetCount[float64](st))
		r.Equal(16, GetCount[byte](st))
		r.Equal([]int32{-7, 1 << 30, 0, 5}, i32)
		c := make([]complex128, 2)
		st, err = Recv(w, c, 0, 3)
		r.NoError(err)
		r.Equal(2, GetCount[complex128](st))
		r.Equal(4, GetCount[float64](st))
		r.Equal([]complex128{complex(1, -1), complex(0, 2.5)}, c)
		part := make([]int32, 2)
		st, err = Recv(w, part, 0, 4)
		r.NoError(err)
		r.Equal(6, st.Bytes)
		r.Equal(Undefined, GetCount[int32](st))
		r.Equal(3, GetCount[int16](st))
		big := make([]complex128, 5000)
		st, err = Recv(w, big, 0, 5)
		r.NoError(err)
		r.Equal(5000, GetCount[complex128](st))
		for i := range big {
			r.Equal(complex(float64(i), float64(-i)), big[i])
		}
	})
}

// Invalid arguments are errors of the right class, usable with errors.Is:
// ranks outside the communicator, tags outside 0..TagUB (wildcards only on
// receives), nil and freed communicators (MPI-4.1 §9.4; MPICH large_tag).
func TestInvalidArguments_MPI41_9_4(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		buf := make([]byte, 4)
		check := func(err, want error, class Class, what string) {
			r.Error(err, what)
			r.True(errors.Is(err, want), "%s: %v is not %v", what, err, want)
			r.Equal(class, ErrorClass(err), what)
		}
		check(Send(w, buf, 2, 0), ErrRank, ClassRank, "dest = size")
		check(Send(w, buf, -5, 0), ErrRank, ClassRank, "negative dest")
		check(Send(w, buf, AnySource, 0), ErrRank, ClassRank, "AnySource dest")
		_, err := Isend(w, buf, 7, 0)
		check(err, ErrRank, ClassRank, "Isend dest")
		check(Send(w, buf, 0, -1), ErrTag, ClassTag, "AnyTag on a send")
		check(Send(w, buf, 0, TagUB+1), ErrTag, ClassTag, "tag > TagUB")
		_, err = Recv(w, buf, 2, 0)
		check(err, ErrRank, ClassRank, "source = size")
		_, err = Irecv(w, buf, 0, -7)
		check(err, ErrTag, ClassTag, "negative receive tag")
		_, err = w.Probe(3, 0)
		check(err, ErrRank, ClassRank, "probe source")
		_, _, err = w.Iprobe(0, TagUB+1)
		check(err, ErrTag, ClassTag, "probe tag")
		_, _, err = w.Mprobe(-3, 0)
		check(err, ErrRank, ClassRank, "mprobe source")
		_, err = SendInit(w, buf, 9, 0, Standard)
		check(err, ErrRank, ClassRank, "SendInit")
		_, err = RecvInit(w, buf, 0, -9)
		check(err, ErrTag, ClassTag, "RecvInit")
		_, err = Sendrecv(w, buf, 5, 0, buf, 0, 0)
		check(err, ErrRank, ClassRank, "Sendrecv")
		// The largest tag works (MPICH large_tag).
		r.NoError(Send(w, []byte{1}, w.Rank(), TagUB))
		st, err := Recv(w, buf, w.Rank(), TagUB)
		r.NoError(err)
		r.Equal(TagUB, st.Tag)

		var nilComm *Comm
		check(Send(nilComm, buf, 0, 0), ErrComm, ClassComm, "nil comm send")
		_, err = Recv(nilComm, buf, 0, 0)
		check(err, ErrComm, ClassComm, "nil comm recv")
		check(nilComm.Barrier(), ErrComm, ClassComm, "nil comm barrier")
		_, err = nilComm.Dup()
		check(err, ErrComm, ClassComm, "nil comm dup")
		_, _, err = nilComm.Iprobe(0, 0)
		check(err, ErrComm, ClassComm, "nil comm iprobe")

		d, err := w.Dup()
		r.NoError(err)
		r.NoError(d.Free())
		check(Send(d, buf, 0, 0), ErrComm, ClassComm, "freed comm send")
		_, err = Irecv(d, buf, 0, 0)
		check(err, ErrComm, ClassComm, "freed comm irecv")
		check(d.Free(), ErrComm, ClassComm, "free twice")
		check(w.Free(), ErrComm, ClassComm, "free world")
		r.Equal(ClassSuccess, ErrorClass(nil))
		r.Equal(ClassOther, ErrorClass(errors.New("not mpiam")))
		r.Equal("MPI_ERR_TRUNCATE", ClassTruncate.String())
	})
}

// A duplicated communicator has its own context: a message sent on it is
// not received by a receive on the parent with the same source and tag, even
// if it was sent first, and the other way round (MPI-4.1 §7.4.2; MPICH
// huge_dupcomm, bsend5).
func TestDupSeparatesContexts_MPI41_7_4_2(t *testing.T) {
	eachNetwork(t, 3, func(r *rk, w *Comm) {
		d, err := w.Dup()
		r.NoError(err)
		r.NotEqual(w.Context(), d.Context())
		r.Equal(w.Rank(), d.Rank())
		r.Equal(w.Size(), d.Size())
		d2, err := d.Dup()
		r.NoError(err)
		r.NotEqual(d.Context(), d2.Context())
		r.NotEqual(w.Context(), d2.Context())
		e := r.eagerLimit(w)
		switch w.Rank() {
		case 0:
			var reqs []Request
			for _, n := range []int{8, 2 * e} {
				for _, x := range []struct {
					c    *Comm
					seed int
				}{{d, 1}, {d2, 3}, {w, 2}} {
					req, err := Isend(x.c, patterned(n, x.seed), 1, 7)
					r.NoError(err)
					reqs = append(reqs, req)
				}
			}
			r.NoError(Waitall(reqs, nil))
		case 1:
			for _, n := range []int{8, 2 * e} {
				buf := make([]byte, n)
				st, err := w.Probe(AnySource, AnyTag) // only the parent's message matches
				r.NoError(err)
				r.Equal(7, st.Tag)
				_, err = Recv(w, buf, 0, 7)
				r.NoError(err)
				r.NoError(checkPattern(buf, 2), "parent received the dup's message")
				_, err = Recv(d2, buf, AnySource, AnyTag)
				r.NoError(err)
				r.NoError(checkPattern(buf, 3))
				_, err = Recv(d, buf, 0, 7)
				r.NoError(err)
				r.NoError(checkPattern(buf, 1))
			}
		}
		r.NoError(d.Barrier())
		r.NoError(d2.Free())
		r.NoError(d.Free())
	})
}

// Barrier: no rank leaves before every rank has entered, over many
// consecutive barriers on world and a dup (MPI-4.1 §6.3).
func TestBarrier_MPI41_6_3(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			for _, nw := range networks {
				t.Run(nw, func(t *testing.T) {
					entered := make([]int64, n)
					var mu = make(chan struct{}, 1)
					runJob(t, nw, n, Config{}, func(r *rk, w *Comm) {
						d, err := w.Dup()
						r.NoError(err)
						for round := range 50 {
							mu <- struct{}{}
							entered[w.Rank()] = int64(round)
							<-mu
							c := w
							if round%2 == 1 {
								c = d
							}
							r.NoError(c.Barrier())
							mu <- struct{}{}
							for k := range entered {
								r.GreaterOrEqual(entered[k], int64(round), "rank %d left barrier %d before rank %d entered", w.Rank(), round, k)
							}
							<-mu
						}
					})
				})
			}
		})
	}
}
