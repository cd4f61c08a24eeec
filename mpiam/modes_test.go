package mpiam

import (
	"fmt"
	"testing"
	"time"
)

// sendFn is one send mode, blocking or not, as a test drives it.
type sendFn struct {
	name  string
	mode  Mode
	start func(c *Comm, buf []byte, dest, tag int) (Request, error)
}

var sendFns = []sendFn{
	{"Send", Standard, func(c *Comm, b []byte, d, t int) (Request, error) { return Request{}, Send(c, b, d, t) }},
	{"Bsend", Buffered, func(c *Comm, b []byte, d, t int) (Request, error) { return Request{}, Bsend(c, b, d, t) }},
	{"Ssend", Synchronous, func(c *Comm, b []byte, d, t int) (Request, error) { return Request{}, Ssend(c, b, d, t) }},
	{"Rsend", Ready, func(c *Comm, b []byte, d, t int) (Request, error) { return Request{}, Rsend(c, b, d, t) }},
	{"Isend", Standard, Isend[byte]},
	{"Ibsend", Buffered, Ibsend[byte]},
	{"Issend", Synchronous, Issend[byte]},
	{"Irsend", Ready, Irsend[byte]},
}

// Every send mode, blocking and nonblocking, at eager and rendezvous sizes,
// delivers its data with the receive posted first; the modes that may start
// before their receive (all but ready) also with the receive posted after
// (MPI-4.1 §3.4; MPICH send_tests, dtype_send, bsend1-5).
func TestSendModes_MPI41_3_4(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		e, sure := r.eagerLimit(w), r.eagerSure(w)
		sizes := []int{16, sure, e, e + 1, 200_000}
		r.NoError(w.BufferAttach(make([]byte, 2*(200_000+BsendOverhead))))
		for fi, f := range sendFns {
			for si, n := range sizes {
				for _, posted := range []bool{true, false} {
					if f.mode == Ready && !posted {
						continue // erroneous: see TestRsendWithoutReceive_MPI41_3_4
					}
					what := fmt.Sprintf("%s %d bytes posted=%v", f.name, n, posted)
					tag := 100*fi + 10*si
					if posted {
						tag++
					}
					seed := tag
					// A buffered send, or a small standard one, completes
					// before its receive is posted; Ssend and rendezvous
					// wait, and so may a standard send above the sure eager
					// size.
					early := f.mode == Buffered || f.mode != Synchronous && n <= sure
					switch w.Rank() {
					case 0:
						if posted {
							r.NoError(w.Barrier(), what) // rank 1 has posted
						}
						req, err := f.start(w, patterned(n, seed), 1, tag)
						r.NoError(err, what)
						_, err = req.Wait() // nil for the blocking forms
						r.NoError(err, what)
						if !posted {
							r.NoError(w.Barrier(), what)
						}
					case 1:
						buf := make([]byte, n)
						var req Request
						var err error
						if posted {
							req, err = Irecv(w, buf, 0, tag)
							r.NoError(err)
							r.NoError(w.Barrier(), what)
						} else {
							if early {
								r.NoError(w.Barrier(), what)
							}
							req, err = Irecv(w, buf, 0, tag)
							r.NoError(err)
						}
						st, err := req.Wait()
						r.NoError(err, what)
						r.Equal(Status{Source: 0, Tag: tag, Bytes: n}, st, what)
						r.NoError(checkPattern(buf, seed), what)
						if !posted && !early {
							r.NoError(w.Barrier(), what)
						}
					}
				}
			}
		}
		_, err := w.BufferDetach()
		r.NoError(err)
	})
}

// A synchronous send completes only once the matching receive has started:
// Test on an Issend keeps returning false while the receiver has not posted,
// at eager and rendezvous sizes, and true after (MPI-4.1 §3.4; MPICH pssend,
// huge_ssend).
func TestSsendCompletesOnlyAfterReceiveStarts_MPI41_3_4(t *testing.T) {
	for _, n := range []int{8, 100_000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			for _, nw := range networks {
				t.Run(nw, func(t *testing.T) {
					post := make(chan struct{})
					runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) {
						switch w.Rank() {
						case 0:
							req, err := Issend(w, patterned(n, 3), 1, 7)
							r.NoError(err)
							deadline := time.Now().Add(30 * time.Millisecond)
							for time.Now().Before(deadline) {
								done, _, err := req.Test()
								r.NoError(err)
								r.False(done, "Issend completed before the receive was posted")
							}
							close(post)
							for {
								done, st, err := req.Test()
								r.NoError(err)
								if done {
									r.Equal(1, st.Source)
									break
								}
							}
						case 1:
							<-post
							buf := make([]byte, n)
							_, err := Recv(w, buf, 0, 7)
							r.NoError(err)
							r.NoError(checkPattern(buf, 3))
						}
					})
				})
			}
		})
	}
}

// A ready send with no receive posted is erroneous (MPI-4.1 §3.4: "may be
// started only if the matching receive is already posted"); amgo delivers
// the data as a standard send would and the receive that matches it reports
// ErrReadyNotPosted (class MPI_ERR_OTHER), eager and rendezvous alike. The
// sender completes normally.
func TestRsendWithoutReceive_MPI41_3_4(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw, func(t *testing.T) {
			sent := make(chan struct{})
			runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) {
				e := r.eagerLimit(w)
				switch w.Rank() {
				case 0:
					r.NoError(Rsend(w, patterned(40, 1), 1, 1))
					req, err := Irsend(w, patterned(e+10, 2), 1, 2)
					r.NoError(err)
					// The RTS has gone out: let rank 1 probe for it.
					close(sent)
					_, err = req.Wait()
					r.NoError(err)
				case 1:
					<-sent
					_, err := w.Probe(0, 2) // both messages are here, unexpected
					r.NoError(err)
					for i, n := range []int{40, e + 10} {
						buf := make([]byte, n)
						st, err := Recv(w, buf, 0, i+1)
						r.ErrorIs(err, ErrReadyNotPosted)
						r.Equal(ClassOther, ErrorClass(err))
						r.ErrorIs(st.Err, ErrReadyNotPosted)
						r.Equal(n, st.Bytes)
						r.NoError(checkPattern(buf, i+1), "data is intact")
					}
				}
			})
		})
	}
}

// Buffered sends: ErrBuffer with no buffer, when the attached buffer is too
// small or exhausted by pending sends, and for a second attach; BufferDetach
// waits until the buffered messages have left (MPI-4.1 §3.6; MPICH
// bsendpending, bsend2-5, rqfree).
func TestBsendBuffer_MPI41_3_6(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw, func(t *testing.T) {
			post := make(chan struct{})
			runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) {
				e := r.eagerLimit(w)
				big := 4 * e // rendezvous: stays in the buffer until received
				switch w.Rank() {
				case 0:
					err := Bsend(w, []byte{1}, 1, 1)
					r.ErrorIs(err, ErrBuffer, "no buffer attached")
					r.Equal(ClassBuffer, ErrorClass(err))
					r.ErrorIs(w.BufferAttach(nil), ErrBuffer)
					r.NoError(w.BufferAttach(make([]byte, big+BsendOverhead+100)))
					r.ErrorIs(w.BufferAttach(make([]byte, 100)), ErrBuffer, "second attach")
					r.ErrorIs(Bsend(w, make([]byte, big+101), 1, 1), ErrBuffer, "larger than the buffer")
					r.NoError(Bsend(w, patterned(big, 5), 1, 2)) // local: returns before the receive
					_, err = Ibsend(w, make([]byte, 50), 1, 3)
					r.ErrorIs(err, ErrBuffer, "buffer exhausted by the pending send")
					// Detach blocks until the pending message has gone.
					detached := make(chan error, 1)
					go func() { _, err := w.BufferDetach(); detached <- err }()
					select {
					case err := <-detached:
						r.Failf("BufferDetach returned early", "err %v", err)
					case <-time.After(30 * time.Millisecond):
					}
					close(post)
					r.NoError(<-detached)
					// Reattach: Ibsend + Free still delivers (MPICH rqfree).
					buf := make([]byte, 3*(64+BsendOverhead))
					r.NoError(w.BufferAttach(buf))
					for i := range 3 {
						req, err := Ibsend(w, patterned(64, 10+i), 1, 4)
						r.NoError(err)
						r.NoError(req.Free())
					}
					// Bsend to self.
					r.NoError(Bsend(w, []int32{42}, 0, 5))
					got := []int32{0}
					_, err = Recv(w, got, 0, 5)
					r.NoError(err)
					r.Equal(int32(42), got[0])
					b, err := w.BufferDetach()
					r.NoError(err)
					r.Len(b, len(buf))
					_, err = w.BufferDetach()
					r.ErrorIs(err, ErrBuffer, "nothing attached")
				case 1:
					<-post
					buf := make([]byte, big)
					_, err := Recv(w, buf, 0, 2)
					r.NoError(err)
					r.NoError(checkPattern(buf, 5))
					for i := range 3 {
						b := make([]byte, 64)
						_, err := Recv(w, b, 0, 4)
						r.NoError(err)
						r.NoError(checkPattern(b, 10+i))
					}
				}
			})
		})
	}
}

// Cancel of a send: amgo does not cancel sends (deprecated since MPI-4.0);
// Cancel says so with ErrCancelSend (class MPI_ERR_UNSUPPORTED_OPERATION) and
// the send completes normally, so Wait does not hang (MPI-4.1 §3.8.4).
func TestCancelSend_MPI41_3_8_4(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		n := 2 * r.eagerLimit(w)
		switch w.Rank() {
		case 0:
			for i, size := range []int{8, n} {
				req, err := Isend(w, patterned(size, i), 1, i)
				r.NoError(err)
				err = req.Cancel()
				r.ErrorIs(err, ErrCancelSend)
				r.Equal(ClassUnsupport, ErrorClass(err))
				st, err := req.Wait()
				r.NoError(err)
				r.False(st.Cancelled)
			}
		case 1:
			for i, size := range []int{8, n} {
				buf := make([]byte, size)
				_, err := Recv(w, buf, 0, i)
				r.NoError(err)
				r.NoError(checkPattern(buf, i))
			}
		}
	})
}

// Cancel of a receive that has not matched: Wait returns at once with
// Cancelled set and the buffer untouched, for exact and AnySource receives;
// a later message goes to the next receive. Cancel after the match has no
// effect (MPI-4.1 §3.8.4: "either the cancellation succeeds, or the
// communication succeeds, but not both"; MPICH rcancel, cancelanysrc).
func TestCancelRecv_MPI41_3_8_4(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		switch w.Rank() {
		case 1:
			for _, src := range []int{0, AnySource} {
				buf := []byte{9, 9, 9}
				req, err := Irecv(w, buf, src, 1)
				r.NoError(err)
				r.NoError(req.Cancel())
				r.NoError(req.Cancel(), "twice")
				st, err := req.Wait()
				r.NoError(err)
				r.True(st.Cancelled)
				r.True(st.TestCancelled())
				r.Equal([]byte{9, 9, 9}, buf)
			}
			r.NoError(w.Barrier())
			// The message goes to a receive posted after the cancelled ones.
			buf := make([]byte, 3)
			st, err := Recv(w, buf, 0, 1)
			r.NoError(err)
			r.False(st.Cancelled)
			r.Equal([]byte{1, 2, 3}, buf)
			// Matched, then cancelled: the receive completes normally.
			req, err := Irecv(w, buf, 0, 2)
			r.NoError(err)
			for {
				if ok, _, _ := w.Iprobe(0, 3); ok {
					break // tag 3 was sent after tag 2, so tag 2 has matched
				}
			}
			r.NoError(req.Cancel())
			st, err = req.Wait()
			r.NoError(err)
			r.False(st.Cancelled)
			r.Equal([]byte{4, 5, 6}, buf)
			_, err = Recv(w, buf, 0, 3)
			r.NoError(err)
		case 0:
			r.NoError(w.Barrier())
			r.NoError(Send(w, []byte{1, 2, 3}, 1, 1))
			r.NoError(Send(w, []byte{4, 5, 6}, 1, 2))
			r.NoError(Send(w, []byte{7}, 1, 3))
		}
	})
}

// Persistent receive with AnySource cancelled while started (MPICH pscancel,
// precv_anysrc): the request becomes inactive and can be started again.
func TestCancelPersistentRecv_MPI41_3_9(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		if w.Rank() == 1 {
			buf := make([]byte, 4)
			req, err := RecvInit(w, buf, AnySource, 1)
			r.NoError(err)
			r.NoError(req.Start())
			r.NoError(req.Cancel())
			st, err := req.Wait()
			r.NoError(err)
			r.True(st.Cancelled)
			r.NoError(w.Barrier())
			r.NoError(req.Start())
			st, err = req.Wait()
			r.NoError(err)
			r.Equal(Status{Source: 0, Tag: 1, Bytes: 4}, st)
			r.NoError(req.Free())
		} else {
			r.NoError(w.Barrier())
			r.NoError(Send(w, []byte{1, 2, 3, 4}, 1, 1))
		}
	})
}
