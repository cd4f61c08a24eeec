package mpiam

import (
	"encoding/binary"
	"testing"
)

// mixedSizes straddles the eager limit e: zero, small, just below, at and just
// above it, and well into the rendezvous range.
func mixedSizes(e int) []int {
	return []int{0, 8, max(e-1, 0), e, e + 1, 100_000, 1, 3 * e, 0, 16, e + 7, 8}
}

// Two messages from one sender on one communicator that both match a receive
// are received in the order sent, whatever their protocols (eager and
// rendezvous interleaved): MPI-4.1 §3.5 "Order".
func TestNonOvertakingMixedSizes_MPI41_3_5(t *testing.T) {
	specs := []struct {
		name     string
		src, tag int
	}{{"exact", 0, 9}, {"AnySource", AnySource, 9}, {"AnyTag", 0, AnyTag}, {"AnySource+AnyTag", AnySource, AnyTag}}
	body := func(r *rk, w *Comm) {
		sizes := mixedSizes(r.eagerLimit(w))
		for _, s := range specs {
			switch w.Rank() {
			case 0:
				// Blocking sends of rendezvous size need their receive: post
				// nothing on rank 1 until all are sent, using Isend.
				reqs := make([]Request, len(sizes))
				for i, n := range sizes {
					var err error
					reqs[i], err = Isend(w, patterned(n, i), 1, 9)
					r.NoError(err)
				}
				r.NoError(Waitall(reqs, nil))
			case 1:
				for i, n := range sizes {
					buf := make([]byte, 100_000+3*r.eagerLimit(w)+16)
					st, err := Recv(w, buf, s.src, s.tag)
					r.NoError(err, "%s: message %d", s.name, i)
					r.Equal(n, st.Bytes, "%s: message %d overtaken", s.name, i)
					r.Equal(0, st.Source)
					r.Equal(9, st.Tag)
					r.NoError(checkPattern(buf[:n], i), "%s: message %d", s.name, i)
				}
			}
			r.NoError(w.Barrier())
		}
	}
	t.Run("default", func(t *testing.T) { eachNetwork(t, 2, body) })
	t.Run("eager-limit-64", func(t *testing.T) {
		t.Setenv(EnvEagerLimit, "64")
		eachNetwork(t, 2, func(r *rk, w *Comm) {
			r.Equal(64, r.eagerLimit(w))
			body(r, w)
		})
	})
	t.Run("eager-limit-0", func(t *testing.T) {
		t.Setenv(EnvEagerLimit, "0")
		eachNetwork(t, 2, body)
	})
}

// Receives posted before the messages arrive are satisfied in posting order
// (the second of two receives that match a message cannot take it while the
// first is pending): MPI-4.1 §3.5.
func TestNonOvertakingPostedReceives_MPI41_3_5(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		sizes := mixedSizes(r.eagerLimit(w))
		switch w.Rank() {
		case 1:
			reqs := make([]Request, len(sizes))
			bufs := make([][]byte, len(sizes))
			for i := range sizes {
				bufs[i] = make([]byte, 100_000+4*r.eagerLimit(w))
				src, tag := 0, 4
				switch i % 3 { // interleave exact and wildcard receives
				case 1:
					src = AnySource
				case 2:
					tag = AnyTag
				}
				var err error
				reqs[i], err = Irecv(w, bufs[i], src, tag)
				r.NoError(err)
			}
			r.NoError(w.Barrier())
			sts := make([]Status, len(reqs))
			r.NoError(Waitall(reqs, sts))
			for i, n := range sizes {
				r.Equal(n, sts[i].Bytes, "receive %d", i)
				r.NoError(checkPattern(bufs[i][:n], i))
			}
		case 0:
			r.NoError(w.Barrier())
			for i, n := range sizes {
				r.NoError(Send(w, patterned(n, i), 1, 4))
			}
		}
	})
}

// Several senders, each sending a numbered stream with mixed sizes: every
// wildcard receive sees each sender's messages in the order that sender sent
// them (MPI-4.1 §3.5; MPICH sendflood, anyall, recv_any, irecv_any).
func TestNonOvertakingSeveralSenders_MPI41_3_5(t *testing.T) {
	const senders = 3
	perSender := 40
	if testing.Short() {
		perSender = 15
	}
	for _, c := range []struct {
		name string
		src  func(sender int) int
		tag  func(sender int) int
	}{
		{"AnySource", func(int) int { return AnySource }, func(int) int { return 3 }},
		{"AnyTag", func(s int) int { return s }, func(int) int { return AnyTag }},
		{"AnySource+AnyTag", func(int) int { return AnySource }, func(int) int { return AnyTag }},
	} {
		t.Run(c.name, func(t *testing.T) {
			eachNetwork(t, senders+1, func(r *rk, w *Comm) {
				e := r.eagerLimit(w)
				size := func(sender, i int) int {
					switch (sender + i) % 5 {
					case 0:
						return 8
					case 1:
						return e + 100 // rendezvous
					case 2:
						return 0
					case 3:
						return e
					}
					return 1000
				}
				if w.Rank() > 0 {
					for i := range perSender {
						n := max(size(w.Rank(), i), 8)
						b := patterned(n, w.Rank()*1000+i)
						binary.LittleEndian.PutUint64(b, uint64(i))
						if i%2 == 0 {
							r.NoError(Send(w, b, 0, 3))
						} else {
							req, err := Isend(w, b, 0, 3)
							r.NoError(err)
							_, err = req.Wait()
							r.NoError(err)
						}
					}
					return
				}
				next := make([]int, senders+1)
				buf := make([]byte, e+200)
				for range senders * perSender {
					// Rotate the exact source over the senders for AnyTag.
					s := 1
					for k := 1; k <= senders; k++ {
						if next[k] < perSender {
							s = k
							break
						}
					}
					st, err := Recv(w, buf, c.src(s), c.tag(s))
					r.NoError(err)
					from := st.Source
					r.True(from >= 1 && from <= senders, "source %d", from)
					i := next[from]
					r.Equal(uint64(i), binary.LittleEndian.Uint64(buf), "from %d: message overtaken", from)
					n := max(size(from, i), 8)
					r.Equal(n, st.Bytes)
					want := patterned(n, from*1000+i)
					binary.LittleEndian.PutUint64(want, uint64(i))
					r.Equal(-1, firstDiff(buf[:n], want), "from %d message %d", from, i)
					next[from]++
				}
			})
		})
	}
}

// Zero-length messages in every mode carry their envelope (MPI-4.1 §3.2.2: a
// count of zero is valid).
func TestZeroLengthMessages_MPI41_3_2_2(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		r.NoError(w.BufferAttach(make([]byte, 4*BsendOverhead)))
		defer func() { _, err := w.BufferDetach(); r.NoError(err) }()
		switch w.Rank() {
		case 0:
			r.NoError(Send[byte](w, nil, 1, 1))
			r.NoError(Ssend(w, []float64{}, 1, 2))
			r.NoError(Bsend[int32](w, nil, 1, 3))
			r.NoError(w.Barrier()) // rank 1 posts the next receive
			r.NoError(Rsend[byte](w, nil, 1, 4))
		case 1:
			for tag := 1; tag <= 3; tag++ {
				st, err := Recv[byte](w, nil, 0, tag)
				r.NoError(err)
				r.Equal(Status{Source: 0, Tag: tag}, st)
				r.Equal(0, GetCount[float64](st))
			}
			req, err := Irecv(w, make([]byte, 4), 0, AnyTag)
			r.NoError(err)
			r.NoError(w.Barrier())
			st, err := req.Wait()
			r.NoError(err)
			r.Equal(Status{Source: 0, Tag: 4}, st)
		}
	})
}

// A process may send to itself: eagerly with blocking calls, and with
// Isend/Irecv at rendezvous sizes and in synchronous mode (MPICH sendself,
// isendself, isendselfprobe).
func TestSelfSend_MPI41_3_2(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		me := w.Rank()
		e := r.eagerLimit(w)
		// Eager, blocking: the message is buffered at the receiver.
		r.NoError(Send(w, patterned(100, me), me, 1))
		buf := make([]byte, 100)
		st, err := Recv(w, buf, me, 1)
		r.NoError(err)
		r.Equal(Status{Source: me, Tag: 1, Bytes: 100}, st)
		r.NoError(checkPattern(buf, me))
		// Rendezvous: Isend then Irecv, and Irecv then Isend.
		for k, sendFirst := range []bool{true, false} {
			n := 3*e + k
			big := make([]byte, n)
			var sreq, rreq Request
			if sendFirst {
				sreq, err = Isend(w, patterned(n, k), me, 2)
				r.NoError(err)
				st, err = w.Probe(me, 2)
				r.NoError(err)
				r.Equal(n, st.Bytes)
				rreq, err = Irecv(w, big, me, 2)
				r.NoError(err)
			} else {
				rreq, err = Irecv(w, big, AnySource, AnyTag)
				r.NoError(err)
				sreq, err = Isend(w, patterned(n, k), me, 2)
				r.NoError(err)
			}
			sts := make([]Status, 2)
			r.NoError(Waitall([]Request{rreq, sreq}, sts))
			r.Equal(Status{Source: me, Tag: 2, Bytes: n}, sts[0])
			r.NoError(checkPattern(big, k))
		}
		// Synchronous to self.
		sreq, err := Issend(w, []int64{7, 8}, me, 3)
		r.NoError(err)
		got := make([]int64, 2)
		_, err = Recv(w, got, me, 3)
		r.NoError(err)
		_, err = sreq.Wait()
		r.NoError(err)
		r.Equal([]int64{7, 8}, got)
	})
}
