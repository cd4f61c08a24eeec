package mpiam

import (
	"sync/atomic"
	"testing"
	"time"
)

// Unexpected eager data from one source is copied out of the per-peer buffer up
// to AMGO_UNEXPECTED_LIMIT; past it, messages keep their space (the seed's
// buffered protocol), so a sender that floods a rank that receives nothing is
// back-pressured: memory at the receiver stays bounded, and every message is
// delivered in order once receives are posted.
func TestUnexpectedFloodIsBounded(t *testing.T) {
	t.Setenv(EnvUnexpectedLimit, "4096")
	const msgs, size = 200, 1000
	var sent atomic.Int32
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		sent.Store(0)
		if w.Rank() == 0 {
			buf := make([]byte, size)
			for i := 0; i < msgs; i++ {
				buf[0] = byte(i)
				r.NoError(Send(w, buf, 1, 7))
				sent.Add(1)
			}
			return
		}
		// Poll without receiving for a while: the sender must stall.
		deadline := time.Now().Add(100 * time.Millisecond)
		for time.Now().Before(deadline) {
			_, _, err := w.Iprobe(0, 99)
			r.NoError(err)
		}
		stalledAt := sent.Load()
		r.Less(int(stalledAt), msgs, "the sender must be back-pressured")
		w.p.mu.Lock()
		queued := w.p.eng.Stats().Unexpected
		w.p.mu.Unlock()
		// At most the limit in heap copies plus one per-peer buffer's worth held in place.
		r.LessOrEqual(queued, (4096+w.p.ep.BufferBytes())/size+1)
		r.LessOrEqual(w.p.unexpBytes[0].Load(), int64(4096))
		buf := make([]byte, size)
		for i := 0; i < msgs; i++ {
			st, err := Recv(w, buf, 0, 7)
			r.NoError(err)
			r.Equal(size, st.Bytes)
			r.Equal(byte(i), buf[0], "in order")
		}
		r.Zero(w.p.unexpBytes[0].Load())
	})
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
			r.NoError(Waitall([]*Request{s1, s2}, nil))
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
		if w.p.ep.Transport().Caps().Get {
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
			seq := w.sendSeq[0].Load()
			a0, a1, a2 := envelope(w.ctx, w.rank, 5, seq+1, 0) // the number after the next
			r.NoError(w.p.ep.RequestMedium(0, hEager, []byte("second"), a0, a1, a2))
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
