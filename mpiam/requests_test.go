package mpiam

import (
	"fmt"
	"reflect"
	"testing"
	"unsafe"
)

// A message longer than the receive buffer fills the buffer, writes nothing
// past it and reports ErrTruncate (class MPI_ERR_TRUNCATE), eager and
// rendezvous, blocking and not; the sender completes normally (MPI-4.1
// §3.2.5; MPICH huge_underflow for the shorter-message case).
func TestTruncate_MPI41_3_2_5(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		e := r.eagerLimit(w)
		sizes := []int{100, e, e + 1, 300_000}
		switch w.Rank() {
		case 0:
			for i, n := range sizes {
				r.NoError(Send(w, patterned(n, i), 1, i), "sender completes")
				req, err := Isend(w, patterned(n, i), 1, 100+i)
				r.NoError(err)
				_, err = req.Wait()
				r.NoError(err)
			}
			// A shorter message fills only the start of the buffer.
			r.NoError(Send(w, patterned(10, 77), 1, 200))
		case 1:
			for i, n := range sizes {
				for k, tag := range []int{i, 100 + i} {
					room := n / 2
					mem := make([]byte, room+64)
					for j := range mem {
						mem[j] = 0xEE
					}
					var st Status
					var err error
					if k == 0 {
						st, err = Recv(w, mem[:room], 0, tag)
					} else {
						req, ierr := Irecv(w, mem[:room], AnySource, AnyTag)
						r.NoError(ierr)
						st, err = req.Wait()
					}
					r.ErrorIs(err, ErrTruncate, "%d bytes into %d", n, room)
					r.Equal(ClassTruncate, ErrorClass(err))
					r.ErrorIs(st.Err, ErrTruncate)
					r.Equal(tag, st.Tag)
					r.Equal(room, st.Bytes)
					r.Equal(-1, firstDiff(mem[:room], patterned(n, i)[:room]))
					for j := room; j < len(mem); j++ {
						r.Equal(byte(0xEE), mem[j], "byte %d past the buffer written", j-room)
					}
				}
			}
			mem := make([]byte, 100)
			st, err := Recv(w, mem, 0, 200)
			r.NoError(err)
			r.Equal(10, st.Bytes)
			r.NoError(checkPattern(mem[:10], 77))
			r.Equal(make([]byte, 90), mem[10:])
		}
	})
}

// Communication with ProcNull succeeds at once and does nothing: a receive
// leaves its buffer untouched and reports source ProcNull, tag AnyTag, count
// 0; probes find that status at once; mprobes return a message that Mrecv
// receives as such (MPI-4.1 §4.10; MPICH probenull, recvnull).
func TestProcNull_MPI41_4_10(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		null := Status{Source: ProcNull, Tag: AnyTag}
		buf := []float64{1.5, 2.5}
		for _, f := range sendFns {
			req, err := f.start(w, []byte{1, 2}, ProcNull, 3)
			r.NoError(err, f.name)
			_, err = req.Wait()
			r.NoError(err, f.name)
		}
		st, err := Recv(w, buf, ProcNull, 3)
		r.NoError(err)
		r.Equal(null, st)
		r.Equal([]float64{1.5, 2.5}, buf)
		r.Equal(0, GetCount[float64](st))
		req, err := Irecv(w, buf, ProcNull, AnyTag)
		r.NoError(err)
		st, err = req.Wait()
		r.NoError(err)
		r.Equal(null, st)
		st, err = w.Probe(ProcNull, 3)
		r.NoError(err)
		r.Equal(null, st)
		ok, st, err := w.Iprobe(ProcNull, AnyTag)
		r.NoError(err)
		r.True(ok)
		r.Equal(null, st)
		m, st, err := w.Mprobe(ProcNull, 3)
		r.NoError(err)
		r.Equal(null, st)
		st, err = Mrecv(m, buf)
		r.NoError(err)
		r.Equal(null, st)
		ok, m, st, err = w.Improbe(ProcNull, 3)
		r.NoError(err)
		r.True(ok)
		r.Equal(null, st)
		req, err = Imrecv(m, buf)
		r.NoError(err)
		st, err = req.Wait()
		r.NoError(err)
		r.Equal(null, st)
		r.Equal([]float64{1.5, 2.5}, buf)
		st, err = Sendrecv(w, []byte{1}, ProcNull, 1, buf, ProcNull, 1)
		r.NoError(err)
		r.Equal(null, st)
		// Persistent requests on ProcNull.
		sr, err := SendInit(w, []byte{1}, ProcNull, 1, Standard)
		r.NoError(err)
		rr, err := RecvInit(w, buf, ProcNull, 1)
		r.NoError(err)
		r.NoError(Startall([]Request{sr, rr}))
		sts := make([]Status, 2)
		r.NoError(Waitall([]Request{sr, rr}, sts))
		r.Equal(null, sts[1])
	})
}

// Wait and Test on a null (nil) request, or on an inactive persistent one,
// return at once with the empty status; Waitany and Testany on lists with no
// active request give Undefined; Waitsome and Testsome give no indices
// (MPI-4.1 §3.7.3, §3.7.5; MPICH waittestnull, waitany_null, inactivereq).
func TestCompletionWithNullRequests_MPI41_3_7_5(t *testing.T) {
	eachNetwork(t, 1, func(r *rk, w *Comm) {
		var null Request
		st, err := null.Wait()
		r.NoError(err)
		r.Equal(emptyStatus, st)
		r.Equal(Status{Source: AnySource, Tag: AnyTag}, st)
		ok, st, err := null.Test()
		r.NoError(err)
		r.True(ok)
		r.Equal(emptyStatus, st)
		r.NoError(null.Cancel())
		r.NoError(null.Free())
		inactive, err := RecvInit(w, make([]byte, 4), 0, 1)
		r.NoError(err)
		for _, list := range [][]Request{nil, {}, {Request{}}, {Request{}, Request{}, Request{}}, {Request{}, inactive}} {
			i, st, err := Waitany(list)
			r.NoError(err)
			r.Equal(Undefined, i)
			r.Equal(emptyStatus, st)
			i, ok, st, err := Testany(list)
			r.NoError(err)
			r.True(ok)
			r.Equal(Undefined, i)
			r.Equal(emptyStatus, st)
			idx, sts, err := Waitsome(list)
			r.NoError(err)
			r.Nil(idx)
			r.Nil(sts)
			idx, sts, err = Testsome(list)
			r.NoError(err)
			r.Nil(idx)
			r.Nil(sts)
			statuses := make([]Status, len(list))
			r.NoError(Waitall(list, statuses))
			for _, s := range statuses {
				r.Equal(emptyStatus, s)
			}
			ok, err = Testall(list, nil)
			r.NoError(err)
			r.True(ok)
		}
		st, err = inactive.Wait()
		r.NoError(err)
		r.Equal(emptyStatus, st)
		ok, st, err = inactive.Test()
		r.NoError(err)
		r.True(ok)
		r.Equal(emptyStatus, st)
		r.NoError(inactive.Free())
	})
}

// The completion families with a mix of nil, active and completed requests:
// Waitall fills every status and nils the non-persistent requests; Waitany
// and Testany report one index; Waitsome and Testsome report all completed;
// a reported request acts as null afterwards (MPI-4.1 §3.7.5; MPICH
// sendall, many_isend).
func TestCompletionFamilies_MPI41_3_7_5(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		peer := 1 - w.Rank()
		e := r.eagerLimit(w)
		sizes := []int{1, 2 * e, 3, 0, e + 5}
		if w.Rank() == 0 {
			for round := range 4 {
				for i, n := range sizes {
					r.NoError(Send(w, patterned(n, 10*round+i), peer, i))
				}
			}
			return
		}
		post := func(round int) ([]Request, [][]byte) {
			reqs := make([]Request, 0, 2*len(sizes))
			bufs := make([][]byte, len(sizes))
			for i, n := range sizes {
				bufs[i] = make([]byte, n)
				req, err := Irecv(w, bufs[i], peer, i)
				r.NoError(err)
				reqs = append(reqs, Request{}, req) // a nil before each
			}
			return reqs, bufs
		}
		check := func(round, i int, st Status, bufs [][]byte) {
			r.Equal(Status{Source: peer, Tag: i, Bytes: sizes[i]}, st)
			r.NoError(checkPattern(bufs[i], 10*round+i))
		}
		// Waitall with statuses.
		reqs, bufs := post(0)
		sts := make([]Status, len(reqs))
		r.NoError(Waitall(reqs, sts))
		for k, st := range sts {
			if k%2 == 0 {
				r.Equal(emptyStatus, st)
			} else {
				check(0, k/2, st, bufs)
			}
		}
		for _, req := range reqs {
			r.Zero(req, "Waitall sets every reported handle to the null one")
		}
		// Waitany until Undefined.
		reqs, bufs = post(1)
		seen := 0
		for {
			k, st, err := Waitany(reqs)
			r.NoError(err)
			if k == Undefined {
				break
			}
			r.Zero(reqs[k])
			check(1, k/2, st, bufs)
			seen++
		}
		r.Equal(len(sizes), seen)
		// Waitsome until nil.
		reqs, bufs = post(2)
		seen = 0
		for {
			idx, sts, err := Waitsome(reqs)
			r.NoError(err)
			if idx == nil {
				break
			}
			r.Len(sts, len(idx))
			for j, k := range idx {
				r.Zero(reqs[k])
				check(2, k/2, sts[j], bufs)
				seen++
			}
		}
		r.Equal(len(sizes), seen)
		// Testany and Testsome in a loop.
		reqs, bufs = post(3)
		seen = 0
		for seen < len(sizes) {
			k, ok, st, err := Testany(reqs)
			r.NoError(err)
			if ok && k != Undefined {
				check(3, k/2, st, bufs)
				seen++
			}
			idx, sts, err := Testsome(reqs)
			r.NoError(err)
			for j, k := range idx {
				check(3, k/2, sts[j], bufs)
				seen++
			}
		}
		k, ok, _, err := Testany(reqs)
		r.NoError(err)
		r.True(ok)
		r.Equal(Undefined, k)
		ok, err = Testall(reqs, nil)
		r.NoError(err)
		r.True(ok)
	})
}

// Testsome distinguishes "active requests, none completed" (outcount 0: an
// empty, non-nil list) from "no active request" (outcount MPI_UNDEFINED: nil),
// and Testany likewise reports false versus Undefined and true (MPI-4.1
// §3.7.5).
func TestTestsomeOutcountZeroVersusUndefined_MPI41_3_7_5(t *testing.T) {
	eachNetwork(t, 1, func(r *rk, w *Comm) {
		req, err := Irecv(w, make([]byte, 1), 0, 1)
		r.NoError(err)
		reqs := []Request{Request{}, req}
		idx, sts, err := Testsome(reqs)
		r.NoError(err)
		r.NotNil(idx, "an active request: outcount 0, not MPI_UNDEFINED")
		r.Empty(idx)
		r.Empty(sts)
		k, ok, _, err := Testany(reqs)
		r.NoError(err)
		r.False(ok)
		r.Equal(Undefined, k)
		ok, err = Testall(reqs, nil)
		r.NoError(err)
		r.False(ok)
		r.False(reqs[1].IsNull(), "Testall changes nothing when not all completed")
		r.NoError(req.Cancel())
		idx, _, err = Waitsome(reqs)
		r.NoError(err)
		r.Equal([]int{1}, idx)
		idx, _, err = Testsome(reqs)
		r.NoError(err)
		r.Nil(idx)
	})
}

// Probe, Iprobe, Mprobe and Improbe report the message that the receive will
// get, at eager and rendezvous sizes; a matched probe removes the message so
// that only Mrecv/Imrecv receives it, once (MPI-4.1 §3.8.1-3.8.3; MPICH
// mprobe, probe_unexp, isendselfprobe).
func TestProbe_MPI41_3_8(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		e := r.eagerLimit(w)
		sizes := []int{24, 2*e + 3}
		if w.Rank() == 0 {
			for round := range 4 {
				for i, n := range sizes {
					req, err := Isend(w, patterned(n, 10*round+i), 1, 10*round+i)
					r.NoError(err)
					defer func() { _, err := req.Wait(); r.NoError(err) }()
				}
			}
			return
		}
		for i, n := range sizes {
			// Probe, then Recv of that message.
			st, err := w.Probe(0, AnyTag)
			r.NoError(err)
			r.Equal(Status{Source: 0, Tag: i, Bytes: n}, st)
			buf := make([]byte, st.Bytes)
			st2, err := Recv(w, buf, st.Source, st.Tag)
			r.NoError(err)
			r.Equal(st, st2)
			r.NoError(checkPattern(buf, i))
		}
		for i, n := range sizes {
			tag := 10 + i
			var st Status
			for {
				ok, s, err := w.Iprobe(AnySource, tag)
				r.NoError(err)
				if ok {
					st = s
					break
				}
			}
			r.Equal(Status{Source: 0, Tag: tag, Bytes: n}, st)
			buf := make([]byte, n)
			_, err := Recv(w, buf, AnySource, tag)
			r.NoError(err)
			r.NoError(checkPattern(buf, tag))
		}
		for i, n := range sizes {
			tag := 20 + i
			m, st, err := w.Mprobe(AnySource, tag)
			r.NoError(err)
			r.Equal(Status{Source: 0, Tag: tag, Bytes: n}, st)
			// The message is out of matching: a probe no longer sees it.
			ok, _, err := w.Iprobe(0, tag)
			r.NoError(err)
			r.False(ok)
			buf := make([]byte, n)
			st, err = Mrecv(m, buf)
			r.NoError(err)
			r.Equal(Status{Source: 0, Tag: tag, Bytes: n}, st)
			r.NoError(checkPattern(buf, tag))
			_, err = Mrecv(m, buf)
			r.ErrorIs(err, ErrRequest, "a message is received once")
		}
		for i, n := range sizes {
			tag := 30 + i
			var m *Message
			for m == nil {
				ok, mm, st, err := w.Improbe(0, tag)
				r.NoError(err)
				if ok {
					r.Equal(n, st.Bytes)
					m = mm
				}
			}
			buf := make([]byte, n)
			req, err := Imrecv(m, buf)
			r.NoError(err)
			st, err := req.Wait()
			r.NoError(err)
			r.Equal(n, st.Bytes)
			r.NoError(checkPattern(buf, tag))
		}
		_, err := Mrecv[byte](nil, nil)
		r.ErrorIs(err, ErrRequest)
	})
}

// Persistent requests restarted many times, with Start and Startall, every
// send mode; completion leaves them inactive, and Wait on an inactive one
// returns the empty status (MPI-4.1 §3.9; MPICH pssend, multi_psend_derived,
// inactivereq, precv_anysrc).
func TestPersistentRequests_MPI41_3_9(t *testing.T) {
	iters := 1000
	if testing.Short() {
		iters = 200
	}
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		peer := 1 - w.Rank()
		e := r.eagerLimit(w)
		r.NoError(w.BufferAttach(make([]byte, 4*(e+BsendOverhead))))
		sbuf := make([]int64, 4)
		rbuf := make([]int64, 4)
		big := make([]byte, e+1)
		bigIn := make([]byte, e+1)
		var sends []Request
		for _, m := range []Mode{Standard, Buffered, Synchronous} {
			req, err := SendInit(w, sbuf[m:m+1], peer, int(m), m)
			r.NoError(err)
			sends = append(sends, req)
		}
		bigSend, err := SendInit(w, big, peer, 9, Standard)
		r.NoError(err)
		var recvs []Request
		for _, m := range []Mode{Standard, Buffered, Synchronous} {
			src := peer
			if m == Buffered {
				src = AnySource
			}
			req, err := RecvInit(w, rbuf[m:m+1], src, int(m))
			r.NoError(err)
			recvs = append(recvs, req)
		}
		bigRecv, err := RecvInit(w, bigIn, AnySource, 9)
		r.NoError(err)
		_, err = SendInit(w, sbuf, peer, 1, Mode(9))
		r.ErrorIs(err, ErrArg)
		for it := range iters {
			for i := range sbuf {
				sbuf[i] = int64(it*10 + i)
			}
			big[it%len(big)] = byte(it)
			r.NoError(Startall(recvs))
			r.NoError(bigRecv.Start())
			r.ErrorIs(bigRecv.Start(), ErrRequest, "active")
			for _, s := range sends {
				r.NoError(s.Start())
			}
			r.NoError(bigSend.Start())
			all := append(append([]Request{}, sends...), bigSend)
			all = append(all, recvs...)
			all = append(all, bigRecv)
			sts := make([]Status, len(all))
			r.NoError(Waitall(all, sts))
			for _, req := range all {
				r.False(req.IsNull(), "persistent requests stay")
			}
			for k := range 3 {
				r.Equal(int64(it*10+k), rbuf[k])
				r.Equal(Status{Source: peer, Tag: k, Bytes: 8}, sts[4+k])
			}
			r.Equal(byte(it), bigIn[it%len(bigIn)])
			// Inactive now: Wait gives the empty status.
			st, err := recvs[0].Wait()
			r.NoError(err)
			r.Equal(emptyStatus, st)
		}
		for _, req := range append(append(sends, recvs...), bigSend, bigRecv) {
			r.NoError(req.Free())
		}
		var plain Request
		plain, err = Isend(w, []byte{1}, w.Rank(), 50)
		r.NoError(err)
		r.ErrorIs(plain.Start(), ErrRequest, "not persistent")
		_, err = Recv(w, []byte{0}, w.Rank(), 50)
		r.NoError(err)
		_, err = plain.Wait()
		r.NoError(err)
		_, err = w.BufferDetach()
		r.NoError(err)
	})
}

// A reported request stays null through every copy of its handle even after
// later operations reuse its state (Request.recycle): waiting, testing or
// cancelling a stale copy returns at once and touches none of the newer
// operations, which complete with their own data (MPI-4.1 §3.7.3: a completed
// request is deallocated and the handle set to MPI_REQUEST_NULL).
func TestReportedRequestStaysNull_MPI41_3_7_3(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		peer := 1 - w.Rank()
		var stale []Request
		for round := range 50 {
			in := make([]byte, 8)
			out := []byte(fmt.Sprintf("round%03d", round))
			rr, err := Irecv(w, in, peer, round)
			r.NoError(err)
			sr, err := Isend(w, out, peer, round)
			r.NoError(err)
			copyR, copyS := rr, sr
			if round%2 == 0 {
				st, err := rr.Wait()
				r.NoError(err)
				r.Equal(peer, st.Source)
				r.Equal(round, st.Tag)
				r.Equal(8, st.Bytes)
				r.NoError(sr.Free()) // a completed send, freed rather than waited
			} else {
				reqs := []Request{rr, sr}
				r.NoError(Waitall(reqs, nil))
				r.Equal([]Request{Request{}, Request{}}, reqs)
			}
			r.Equal(fmt.Sprintf("round%03d", round), string(in))
			stale = append(stale, copyR, copyS)
			// Every earlier handle, whose state may now serve this round's
			// operations, acts as null.
			for _, h := range stale {
				r.True(h.IsNull())
				st, err := h.Wait()
				r.NoError(err)
				r.Equal(emptyStatus, st)
				ok, st, err := h.Test()
				r.NoError(err)
				r.True(ok)
				r.Equal(emptyStatus, st)
				r.NoError(h.Cancel())
				r.Equal(RequestInfo{}, h.Info())
				r.ErrorIs(h.Start(), ErrRequest)
			}
			i, st, err := Waitany(stale)
			r.NoError(err)
			r.Equal(Undefined, i)
			r.Equal(emptyStatus, st)
		}
		r.NoError(w.Barrier())
	})
}

// With a tool attached, a reported request keeps its state, so that the tool
// can still describe it (Info) after the completion call.
func TestReportedRequestInfoWithTool(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		var infos []RequestInfo
		r.NoError(w.AddTool(afterWaitTool(func(req Request) { infos = append(infos, req.Info()) })))
		peer := 1 - w.Rank()
		buf := make([]byte, 8)
		var req Request
		var err error
		if w.Rank() == 0 {
			req, err = Isend(w, buf, peer, 3)
		} else {
			req, err = Irecv(w, buf, peer, 3)
		}
		r.NoError(err)
		_, err = req.Wait()
		r.NoError(err)
		r.Len(infos, 1)
		r.Equal(w.Rank() == 0, infos[0].Send)
		r.Equal(peer, infos[0].Peer)
		r.Equal(3, infos[0].Tag)
		r.Equal(8, infos[0].Bytes)
		r.Zero(req, "Wait sets the handle it reported through to the null Request, tool or not")
		st, err := req.Wait() // reported: null from now on
		r.NoError(err)
		r.Equal(emptyStatus, st)
	})
}

// afterWaitTool calls its function with the request of every Wait, after it.
type afterWaitTool func(Request)

func (afterWaitTool) Before(*Event) {}

func (f afterWaitTool) After(e *Event) {
	if e.Call == CallWait {
		f(e.Request)
	}
}

// The eager receive's completion (proc.completeEagerLocked) writes every
// field of Status in place rather than assigning a whole one: a field added
// to Status must be set there too, or a recycled request would report the
// last operation's value.
func TestStatusFieldsSetInPlace(t *testing.T) {
	if n := reflect.TypeFor[Status]().NumField(); n != 7 {
		t.Fatalf("Status has %d fields; completeEagerLocked sets 7: set the new ones there and update this count", n)
	}
}

// A request state's hot part fits its first three cache lines and the whole
// state is a multiple of a line, so that the states of a slab each start a
// line (reqCache.newState; 64-bit platforms).
func TestReqStateLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("layout is tuned for 64-bit platforms")
	}
	if n := unsafe.Sizeof(reqHot{}); n > 192 {
		t.Errorf("reqHot is %d bytes, more than three cache lines", n)
	}
	if n := unsafe.Sizeof(reqState{}); n%64 != 0 {
		t.Errorf("reqState is %d bytes, not a multiple of 64: adjust its padding (reqState.gen)", n)
	}
	var c reqCache
	for range 2 * stateSlab {
		if a := uintptr(unsafe.Pointer(c.newState())); a%64 != 0 {
			t.Fatalf("state at %#x does not start a cache line", a)
		}
	}
}
