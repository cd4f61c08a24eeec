package mpiam

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amgo-hpc/amgo/am/transport/tcp"
)

// A sender that floods a rank which posts no receive, with messages of any
// size down to 0 bytes, is throttled: past AMGO_UNEXPECTED_LIMIT (records
// counted, not just payload) its sends to that rank go by rendezvous, so a
// blocking Send waits for its receive, memory at the receiver stays below the
// hard limit, and every message arrives in order once receives are posted;
// then the throttle is lifted.
func TestUnexpectedFloodIsBounded(t *testing.T) {
	t.Setenv(EnvUnexpectedLimit, "4096")
	for _, size := range []int{0, 8, 1000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			var sent atomic.Int32
			eachNetwork(t, 2, func(r *rk, w *Comm) {
				// More than the per-peer buffer holds (each message takes at
				// least a granule of 64 bytes of it; 1 MiB over tcp) and
				// than a ring holds of one-line records (256 KiB over shm on
				// a small node), so that the sender must stall short of the
				// end. Both ranks must count alike: BufferBytes is the
				// largest over the job.
				msgs := max(2000, 2*w.p.ep.ImmediateQueueBytes()/64, 2*w.p.ep.BufferBytes()/64)
				sent.Store(0)
				if w.Rank() == 0 {
					buf := make([]byte, size)
					for i := 0; i < msgs; i++ {
						if size > 0 {
							buf[0] = byte(i)
						}
						r.NoError(Send(w, buf, 1, 7))
						sent.Add(1)
					}
					return
				}
				// Poll without receiving until the sender has stalled (no send for
				// 100 ms, after the throttle): it must stall short of the end.
				last, since := sent.Load(), time.Now()
				for deadline := time.Now().Add(20 * time.Second); ; {
					_, _, err := w.Iprobe(0, 99)
					r.NoError(err)
					if n := sent.Load(); n != last {
						last, since = n, time.Now()
					}
					if w.p.recvThrottle[0].on.Load() && time.Since(since) > 100*time.Millisecond {
						break
					}
					r.True(time.Now().Before(deadline), "the sender never stalled: %d sent", last)
				}
				r.Less(int(sent.Load()), msgs, "the sender must be throttled")
				w.p.mu.Lock()
				queued := w.p.eng.Stats().Unexpected
				w.p.mu.Unlock()
				hard := w.p.unexpHardFrom(0)
				r.LessOrEqual(w.p.unexpBytes[0].Load(), hard)
				r.LessOrEqual(int64(queued), hard/unexpRecordBytes+1)
				buf := make([]byte, size)
				for i := 0; i < msgs; i++ {
					st, err := Recv(w, buf, 0, 7)
					r.NoError(err)
					r.Equal(size, st.Bytes)
					if size > 0 {
						r.Equal(byte(i), buf[0], "in order")
					}
				}
				r.Zero(w.p.unexpBytes[0].Load())
				r.False(w.p.recvThrottle[0].on.Load(), "the throttle is lifted")
			})
		})
	}
}

// Isend is local and both ranks reach the barrier, so MPI's progress rule
// (MPI-4.1 §3.7.4) requires the barrier to complete however many sends wait
// unmatched: past the unexpected limit, messages must not keep the buffer
// space that the barrier's message needs. Rank 0 starts more Isends than the
// limit holds, with no receive posted; both ranks pass a barrier; then rank 1
// receives them in reverse order and rank 0 completes its sends.
func TestUnmatchedIsendsPastTheLimitDoNotBlockABarrier(t *testing.T) {
	for _, c := range []struct {
		limit      string
		msgs, size int
	}{
		{"", 600, 2000},      // past the default limit (1 MiB) by payload
		{"", 6000, 32},       // past it by records
		{"16384", 300, 2000}, // far past a small limit
	} {
		t.Run(fmt.Sprintf("%d×%dB/limit=%s", c.msgs, c.size, c.limit), func(t *testing.T) {
			if c.limit != "" {
				t.Setenv(EnvUnexpectedLimit, c.limit)
			}
			eachNetwork(t, 2, func(r *rk, w *Comm) {
				if w.Rank() == 0 {
					reqs := make([]Request, c.msgs)
					for i := range reqs {
						buf := make([]byte, c.size)
						buf[0], buf[len(buf)-1] = byte(i), byte(i>>8)
						var err error
						reqs[i], err = Isend(w, buf, 1, i)
						r.NoError(err)
					}
					r.NoError(w.Barrier())
					r.NoError(Waitall(reqs, nil))
					return
				}
				r.NoError(w.Barrier())
				buf := make([]byte, c.size)
				for i := c.msgs - 1; i >= 0; i-- {
					st, err := Recv(w, buf, 0, i)
					r.NoError(err)
					r.Equal(c.size, st.Bytes)
					r.Equal(byte(i), buf[0])
					r.Equal(byte(i>>8), buf[c.size-1])
				}
			})
		})
	}
}

// A rendezvous receive whose buffer cannot be registered (it overlaps another
// pending receive's: an erroneous program) fails with ErrBuffer, and the
// sender still completes. Where the receiver pulls the data (networks with a
// single-copy get) nothing is registered and both receives complete.
func TestUnregistrableReceiveBufferDoesNotHangSender(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		n := r.eagerLimit(w) + 1000
		if w.Rank() == 0 {
			s1, err := Isend(w, make([]byte, n), 1, 1)
			r.NoError(err)
			s2, err := Isend(w, make([]byte, n), 1, 2)
			r.NoError(err)
			r.NoError(Waitall([]Request{s1, s2}, nil))
			return
		}
		// Both requests-to-send are waiting before the receives are posted, so
		// the two registrations overlap in time.
		_, err := w.Probe(0, 1)
		r.NoError(err)
		_, err = w.Probe(0, 2)
		r.NoError(err)
		buf := make([]byte, n+10)
		a, err := Irecv(w, buf[:n], 0, 1)
		r.NoError(err)
		b, err := Irecv(w, buf[5:n+5], 0, 2) // overlaps a's buffer
		r.NoError(err)
		_, errA := a.Wait()
		_, errB := b.Wait()
		// Whichever registered second fails; the other succeeds.
		if peerCanGet(w, 0) {
			r.NoError(errA)
			r.NoError(errB)
		} else if errA == nil {
			r.ErrorIs(errB, ErrBuffer)
		} else {
			r.ErrorIs(errA, ErrBuffer)
		}
	})
}

// Sends from two goroutines of one rank take their sequence numbers without a
// lock, so the later number may reach the network first and be held for
// order. A held message is always copied out of the per-peer buffer, even past
// the unexpected limit: the message before it may be waiting for that space.
// Here the later number is sent by hand first; its space must come back before
// the earlier one is sent.
func TestHeldMessageFreesItsSpace(t *testing.T) {
	t.Setenv(EnvUnexpectedLimit, "0") // every unexpected message would keep its space
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		if w.Rank() == 1 {
			seq := atomic.LoadUint32(&w.sendSeq[0])
			a0, a1 := envelope(w.ctx, w.rank, 5, seq+1, 0) // the number after the next
			r.NoError(w.p.ep.RequestMedium(0, hEager, []byte("second"), a0, a1))
			r.Zero(w.p.ep.Drain(10*time.Second), "the held message must not keep its space")
			r.NoError(Send(w, []byte("first"), 0, 5))
			return
		}
		buf := make([]byte, 16)
		for _, want := range []string{"first", "second"} {
			st, err := Recv(w, buf, 1, 5)
			r.NoError(err)
			r.Equal(want, string(buf[:st.Bytes]))
		}
	})
}

// Each source is allowed the slack of its own network before its messages
// keep their buffer space: in a job over shm within a node and tcp between
// nodes (ranks 0 and 2 on one node, 1 and 3 on the other), a peer over shm
// gets its ring's buffer and a queue of immediate requests, a peer over tcp
// tcp's larger buffer and no queue (tcp carries no immediate requests).
func TestUnexpectedHardLimitPerSource(t *testing.T) {
	runJob(t, "shm+tcp", 4, Config{}, func(r *rk, w *Comm) {
		if w.Rank() != 0 {
			return
		}
		ep := w.p.ep
		r.Equal(unexpHardLimit(w.p.unexpLimit, ep.BufferBytesTo(2), ep.ImmediateQueueBytes()), w.p.unexpHardFrom(2), "shm")
		r.Equal(unexpHardLimit(w.p.unexpLimit, tcp.BufferBytes, 0), w.p.unexpHardFrom(1), "tcp")
		r.Less(ep.BufferBytesTo(2), ep.BufferBytesTo(1))
		r.Positive(ep.ImmediateQueueBytes())
	})
}
