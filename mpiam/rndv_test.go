package mpiam

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// rndvSizes are rendezvous sizes that take each path on a network with a
// single-copy get: a pull just past the eager limit, a pull below the split
// size, and splits (one of an odd size).
func rndvSizes(w *Comm) []int {
	e := eagerMaxNext(w)
	return []int{e + 1000, max(100<<10, e+8<<10), max(DefaultRndvSplitBytes, e+1), 1<<20 + 3}
}

// Every rendezvous path moves the data intact and completes both sides: the
// store (networks without a get, and synchronous sends below the get
// threshold), the receiver's pull, and the split between both.
func TestRendezvousPaths(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		ep := w.p.ep
		canGet := peerCanGet(w, 1-w.Rank())
		for i, n := range rndvSizes(w) {
			before := ep.Stats()
			if w.Rank() == 0 {
				req, err := Isend(w, patterned(n, i), 1, i)
				r.NoError(err)
				st, err := req.Wait()
				r.NoError(err)
				r.Equal(n, st.Bytes)
			} else {
				buf := make([]byte, n)
				st, err := Recv(w, buf, 0, i)
				r.NoError(err)
				r.Equal(n, st.Bytes)
				r.NoError(checkPattern(buf, i), "size %d", n)
			}
			r.NoError(w.Barrier())
			after := ep.Stats()
			split := canGet && n >= DefaultRndvSplitBytes
			switch {
			case w.Rank() == 1 && canGet:
				r.EqualValues(1, after.Gets-before.Gets, "size %d: the receiver pulls", n)
			case w.Rank() == 0 && split:
				r.EqualValues(1, after.StoresPut-before.StoresPut, "size %d: the sender stores half", n)
			case w.Rank() == 0 && canGet:
				r.Zero(after.StoresPut+after.StoresPacketed-before.StoresPut-before.StoresPacketed, "size %d: pulled only", n)
			case w.Rank() == 0:
				r.EqualValues(1, after.StoresPut+after.StoresPacketed-before.StoresPut-before.StoresPacketed, "size %d: stored", n)
			}
		}
		// A synchronous send below the get threshold is stored in packets.
		if w.Rank() == 0 {
			r.NoError(Ssend(w, patterned(100, 9), 1, 99))
		} else {
			buf := make([]byte, 100)
			_, err := Recv(w, buf, 0, 99)
			r.NoError(err)
			r.NoError(checkPattern(buf, 9))
		}
	})
}

// With splitting off, large messages are pulled whole.
func TestRendezvousSplitOff(t *testing.T) {
	t.Setenv(EnvRndvSplit, "off")
	runJob(t, "loop", 2, Config{}, func(r *rk, w *Comm) {
		n := 1 << 20
		if w.Rank() == 0 {
			r.NoError(Send(w, patterned(n, 3), 1, 0))
			r.Zero(w.p.ep.Stats().StoresPut)
			return
		}
		buf := make([]byte, n)
		_, err := Recv(w, buf, 0, 0)
		r.NoError(err)
		r.NoError(checkPattern(buf, 3))
		r.EqualValues(1, w.p.ep.Stats().Gets)
	})
}

// A rendezvous that arrives while the receiver is itself sending the source
// one (an exchange) is pulled whole: both cores copy already, so the split's
// extra clear-to-send and store would only cost. Rank 1 receives rank 0's
// message while its own to rank 0 waits (rank 0 posts nothing until told),
// so rank 0 stores nothing; a one-way message of the same size is split.
func TestRendezvousExchangeNotSplit(t *testing.T) {
	runJob(t, "loop", 2, Config{}, func(r *rk, w *Comm) {
		n := 2 * DefaultRndvSplitBytes
		ep, peer := w.p.ep, 1-w.Rank()
		before := ep.Stats()
		// One way: split.
		if w.Rank() == 0 {
			r.NoError(Send(w, patterned(n, 1), 1, 1))
			r.EqualValues(1, ep.Stats().StoresPut-before.StoresPut, "a one-way message is split")
		} else {
			buf := make([]byte, n)
			_, err := Recv(w, buf, 0, 1)
			r.NoError(err)
			r.NoError(checkPattern(buf, 1))
		}
		r.NoError(w.Barrier())
		// An exchange: rank 1 matches rank 0's message while its own is
		// outstanding.
		before = ep.Stats()
		send, err := Isend(w, patterned(n, 2+w.Rank()), peer, 2)
		r.NoError(err)
		buf := make([]byte, n)
		if w.Rank() == 1 {
			_, err = Recv(w, buf, 0, 2)
			r.NoError(err)
			r.NoError(Send(w, []byte{1}, 0, 3))
		} else {
			_, err = Recv(w, make([]byte, 1), 1, 3)
			r.NoError(err)
			_, err = Recv(w, buf, 1, 2)
			r.NoError(err)
		}
		r.NoError(checkPattern(buf, 2+peer))
		_, err = send.Wait()
		r.NoError(err)
		if w.Rank() == 0 {
			r.Zero(ep.Stats().StoresPut-before.StoresPut, "rank 1 pulled rank 0's message whole")
		}
		r.NoError(w.Barrier())
		r.Zero(w.p.sendsTo[peer], "no rendezvous send left counted")
	})
}

// A collective's exchange step to a peer that can read this rank's memory,
// blocking or on the schedule engine, goes eager up to its limit and by
// rendezvous (one get by each rank) above it, below shm's eager limit for
// point-to-point messages: both cores copy in an exchange, and a
// single-copy read is one copy where eager is two. The limit is the stream
// limit (Allgather's exchanges), lower for an all-to-all's blocks
// (DefaultBlockLimit).
func TestExchangeStepProtocol(t *testing.T) {
	runJob(t, "shm", 2, Config{}, func(r *rk, w *Comm) {
		ep := w.p.ep
		r.Equal(DefaultBlockLimit, w.p.blockLimit)
		r.Less(w.p.blockLimit, w.p.streamLimit)
		r.Less(w.p.streamLimit+8, w.p.eagerLimit, "a point-to-point message of these sizes is eager")
		peer := 1 - w.Rank()
		for _, c := range []struct {
			name string
			lim  int
			run  func(send, recv []byte) error
		}{
			{"Alltoall", w.p.blockLimit, func(send, recv []byte) error { return Alltoall(w, send, recv) }},
			{"Ialltoall", w.p.blockLimit, func(send, recv []byte) error { // the schedule engine's (sched.Op.Blocks)
				req, err := Ialltoall(w, send, recv)
				if err == nil {
					_, err = req.Wait()
				}
				return err
			}},
			{"Allgather", w.p.streamLimit, func(send, recv []byte) error {
				return Allgather(w, send[w.Rank()*len(send)/2:(w.Rank()+1)*len(send)/2], recv)
			}},
			{"Iallgather", w.p.streamLimit, func(send, recv []byte) error { // sched.Op.Exchange
				req, err := Iallgather(w, send[w.Rank()*len(send)/2:(w.Rank()+1)*len(send)/2], recv)
				if err == nil {
					_, err = req.Wait()
				}
				return err
			}},
		} {
			for _, n := range []int{c.lim, c.lim + 8} {
				send, recv := patterned(2*n, 1+w.Rank()), make([]byte, 2*n)
				before := ep.Stats().Gets
				r.NoError(c.run(send, recv), "%s %d", c.name, n)
				gets := ep.Stats().Gets - before
				r.Equal(send[w.Rank()*n:(w.Rank()+1)*n], recv[w.Rank()*n:(w.Rank()+1)*n], "%s: own block", c.name)
				if strings.HasSuffix(c.name, "gather") { // the peer's own block
					r.Equal(patterned(2*n, 1+peer)[peer*n:(peer+1)*n], recv[peer*n:(peer+1)*n], "%s: peer's block", c.name)
				} else {
					r.Equal(patterned(2*n, 1+peer)[w.Rank()*n:(w.Rank()+1)*n], recv[peer*n:(peer+1)*n], "%s: peer's block", c.name)
				}
				if n <= c.lim {
					r.Zero(gets, "%s: %d bytes go eager", c.name, n)
				} else {
					r.EqualValues(1, gets, "%s: %d bytes are read once", c.name, n)
				}
				r.NoError(w.Barrier())
			}
		}
	})
}

// Over the stream limit and up to the eager limit, a message to a peer
// with a single-copy read goes eager when nothing else is in flight to it
// (a ping-pong: the answer brings back the credit of the message before)
// and by rendezvous within a window of messages (a stream). Every message
// arrives intact either way.
func TestStreamLimit(t *testing.T) {
	runJob(t, "shm", 2, Config{}, func(r *rk, w *Comm) {
		p := w.p
		n := DefaultStreamLimit + 16<<10
		r.Less(n, p.eagerLimit, "the size is within shm's eager limit")
		r.Equal(DefaultStreamLimit, p.streamLimit)
		const rounds, window = 10, 16
		// A ping-pong of messages of this size: eager after its first turn.
		before := p.ep.Stats().Gets
		buf := make([]byte, n)
		for i := range rounds {
			if w.Rank() == 0 {
				r.NoError(Send(w, patterned(n, i), 1, 1))
				_, err := Recv(w, buf, 1, 2)
				r.NoError(err)
			} else {
				_, err := Recv(w, buf, 0, 1)
				r.NoError(err)
				r.NoError(Send(w, buf, 0, 2))
			}
			r.NoError(checkPattern(buf, i))
		}
		r.LessOrEqual(p.ep.Stats().Gets-before, uint64(1), "a ping-pong's messages go eager")
		r.NoError(w.Barrier())
		// A ping-pong whose answers are 8 bytes: eager too (the answers
		// carry the space back, flowctl.CarryAny).
		before = p.ep.Stats().Gets
		ans := make([]byte, 8)
		for i := range 4 * rounds {
			if w.Rank() == 0 {
				r.NoError(Send(w, patterned(n, i), 1, 4))
				_, err := Recv(w, ans, 1, 5)
				r.NoError(err)
			} else {
				_, err := Recv(w, buf, 0, 4)
				r.NoError(err)
				r.NoError(checkPattern(buf, i))
				r.NoError(Send(w, ans, 0, 5))
			}
		}
		if w.Rank() == 1 {
			r.LessOrEqual(p.ep.Stats().Gets-before, uint64(1), "answered by 8 bytes, a ping-pong's messages go eager")
		}
		r.NoError(w.Barrier())
		// A window: once the first is under way, by rendezvous.
		before = p.ep.Stats().Gets
		reqs := make([]Request, window)
		bufs := make([][]byte, window)
		for i := range reqs {
			var err error
			if w.Rank() == 0 {
				reqs[i], err = Isend(w, patterned(n, 100+i), 1, 3)
			} else {
				bufs[i] = make([]byte, n)
				reqs[i], err = Irecv(w, bufs[i], 0, 3)
			}
			r.NoError(err)
		}
		r.NoError(Waitall(reqs, nil))
		if w.Rank() == 1 {
			for i, b := range bufs {
				r.NoError(checkPattern(b, 100+i))
			}
			r.GreaterOrEqual(p.ep.Stats().Gets-before, uint64(1), "a window's messages go by rendezvous")
		}
		r.NoError(w.Barrier())
	})
}

func TestRendezvousSplitEnv(t *testing.T) {
	t.Setenv(EnvRndvSplit, "lots")
	err := RunLocal(1, Config{}, func(*Comm) error { return nil })
	r := require.New(t)
	r.ErrorIs(err, ErrArg)
	r.ErrorContains(err, EnvRndvSplit)
}

// A message longer than the receive buffer fills it and reports ErrTruncate
// on every path; the sender completes without error.
func TestRendezvousTruncate(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		for i, n := range []int{eagerMaxNext(w) + 1000, 300 << 10} {
			if w.Rank() == 0 {
				r.NoError(Send(w, patterned(n, i), 1, i))
				continue
			}
			short := n - 5000
			buf := make([]byte, short)
			st, err := Recv(w, buf, 0, i)
			r.ErrorIs(err, ErrTruncate, "size %d", n)
			r.Equal(short, st.Bytes)
			r.NoError(checkPattern(buf, i), "size %d", n) // a prefix of the pattern
		}
	})
}

// A peer that refuses single-copy gets (CMA's EPERM) gets the data stored
// instead, for pulls and for the pulled half of splits.
func TestRendezvousGetRefused(t *testing.T) {
	runJob(t, "loop+noget", 2, Config{}, func(r *rk, w *Comm) {
		for i, n := range rndvSizes(w) {
			if w.Rank() == 0 {
				r.NoError(Send(w, patterned(n, i), 1, i))
				continue
			}
			buf := make([]byte, n)
			st, err := Recv(w, buf, 0, i)
			r.NoError(err, "size %d", n)
			r.Equal(n, st.Bytes)
			r.NoError(checkPattern(buf, i), "size %d", n)
		}
		r.NoError(w.Barrier())
		s := w.p.ep.Stats()
		r.Zero(s.Gets)
		if w.Rank() == 0 {
			r.NotZero(s.StoresPut)
		}
	})
}

// A request-to-send that finds its receive posted is read by its handler
// (pullInHandler); when the peer refuses that get, the read becomes a store
// queued for a waiting goroutine, and both sides complete with the data.
func TestRendezvousGetRefusedInHandler(t *testing.T) {
	runJob(t, "loop+noget", 2, Config{}, func(r *rk, w *Comm) {
		n := w.p.eagerLimit + 1
		r.LessOrEqual(n, inlinePullMax)
		if w.Rank() == 0 {
			r.NoError(w.Barrier()) // the receive is posted
			r.NoError(Send(w, patterned(n, 3), 1, 3))
			r.NotZero(w.p.ep.Stats().StoresPut)
			return
		}
		buf := make([]byte, n)
		req, err := Irecv(w, buf, 0, 3)
		r.NoError(err)
		r.NoError(w.Barrier())
		st, err := req.Wait()
		r.NoError(err)
		r.Equal(n, st.Bytes)
		r.NoError(checkPattern(buf, 3))
		r.Zero(w.p.ep.Stats().Gets)
	})
}

// Persistent rendezvous requests run the protocol again on every start.
func TestRendezvousPersistent(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		n := DefaultRndvSplitBytes + 4096
		buf := make([]byte, n)
		var req Request
		var err error
		if w.Rank() == 0 {
			req, err = SendInit(w, buf, 1, 5, Standard)
		} else {
			req, err = RecvInit(w, buf, 0, 5)
		}
		r.NoError(err)
		for round := range 3 {
			if w.Rank() == 0 {
				pattern(buf, round)
			}
			r.NoError(req.Start())
			_, err := req.Wait()
			r.NoError(err, "round %d", round)
			if w.Rank() == 1 {
				r.NoError(checkPattern(buf, round), fmt.Sprintf("round %d", round))
			}
		}
	})
}

// TestEagerLimitByPeer checks the protocol choice of standard sends: eager up
// to getEagerLimit everywhere (a quarter of the job's smallest buffer, at
// most DefaultGetEagerLimit); above it rendezvous towards a peer that
// can be read with a single copy and eager up to MaxMedium elsewhere; with
// EnvEagerLimit one limit for every network.
func TestEagerLimitByPeer(t *testing.T) {
	// rendezvous sends n bytes from rank 0 to rank 1 and reports whether it
	// went by rendezvous (the receiver pulled or the sender stored).
	rendezvous := func(r *rk, w *Comm, n, tag int) bool {
		ep := w.p.ep
		before := ep.Stats()
		if w.Rank() == 0 {
			r.NoError(Send(w, patterned(n, tag), 1, tag))
		} else {
			buf := make([]byte, n)
			_, err := Recv(w, buf, 0, tag)
			r.NoError(err)
			r.NoError(checkPattern(buf, tag))
		}
		after := ep.Stats()
		moved := after.Gets + after.StoresPut + after.StoresPacketed - before.Gets - before.StoresPut - before.StoresPacketed
		var all [1]uint64
		r.NoError(Allreduce(w, []uint64{moved}, all[:], Sum[uint64]()))
		return all[0] > 0
	}
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		canGet := peerCanGet(w, 1-w.Rank())
		lim := getEagerLimit(w.p.ep)
		r.False(rendezvous(r, w, lim, 1), "at the limit: eager")
		mm := min(DefaultEagerLimit, w.p.ep.MaxMediumTo(1-w.Rank())) // the peer's network's
		if lim < mm {
			r.Equal(canGet, rendezvous(r, w, lim+1, 2), "above it: rendezvous where the receiver can get")
		}
		if canGet {
			r.GreaterOrEqual(lim, 16<<10, "a peer read with a get takes eager messages of at least 16 KiB")
			r.Equal(min(DefaultGetEagerLimit, w.p.ep.BufferBytesTo(1-w.Rank())/4), lim, "a quarter of its buffer")
		}
		if mm > lim {
			r.Equal(canGet, rendezvous(r, w, mm, 4), "the limit: eager without a get")
		}
		r.True(rendezvous(r, w, mm+1, 5), "above it: rendezvous everywhere")
		// A collective's exchange steps stay eager up to MaxMedium: an
		// Allreduce of 16 KiB on 2 ranks exchanges halves of 8 KiB.
		before := w.p.ep.Stats()
		send := make([]uint64, 2048)
		for i := range send {
			send[i] = uint64(i + w.Rank())
		}
		recv := make([]uint64, len(send))
		r.NoError(Allreduce(w, send, recv, Sum[uint64]()))
		for i, v := range recv {
			r.EqualValues(2*i+1, v)
		}
		after := w.p.ep.Stats()
		r.Equal(before.Gets, after.Gets, "exchange steps do not pull")
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv(EnvEagerLimit, "12000")
		eachNetwork(t, 2, func(r *rk, w *Comm) {
			r.False(rendezvous(r, w, 8<<10, 1), "below the set limit: eager on every network")
			r.True(rendezvous(r, w, 12001, 2), "above it: rendezvous on every network")
		})
	})
}
