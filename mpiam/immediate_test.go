package mpiam

import (
	"fmt"
	"testing"

	"github.com/amgo-hpc/amgo/am"
)

// Eager messages go as immediate requests where the network carries them
// (loop, shm) and as medium requests with AMGO_IMMEDIATE=0 (Config.AM's
// NoImmediate) and elsewhere: both paths deliver every message once, in
// order, posted or unexpected, blocking or not, at sizes around
// am.MaxImmediate; only messages without a tool value go immediately.
func TestEagerImmediateAndMediumPaths(t *testing.T) {
	sizes := []int{0, 1, 8, 100, am.MaxImmediate - 1, am.MaxImmediate, am.MaxImmediate + 1, 3000}
	const rounds = 40
	for _, nw := range []string{"loop", "shm", "tcp", "shm+tcp"} {
		for _, off := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/noimmediate=%v", nw, off), func(t *testing.T) {
				cfg := Config{Thread: ThreadSingle, AM: am.Config{NoImmediate: off}}
				runJob(t, nw, 2, cfg, func(r *rk, w *Comm) {
					peer := 1 - w.Rank()
					for i := 0; i < rounds; i++ {
						size := sizes[i%len(sizes)]
						if w.Rank() == 0 {
							// Unexpected at rank 1 (it receives after the barrier),
							// then posted (it receives before the second barrier).
							r.NoError(Send(w, patterned(size, i), peer, i))
							q, err := Isend(w, patterned(size, i+1), peer, i)
							r.NoError(err)
							r.NoError(w.Barrier())
							r.NoError(w.Barrier())
							_, err = q.Wait()
							r.NoError(err)
							continue
						}
						r.NoError(w.Barrier())
						buf := make([]byte, size)
						st, err := Recv(w, buf, peer, i)
						r.NoError(err)
						r.Equal(size, st.Bytes)
						r.NoError(checkPattern(buf, i))
						q, err := Irecv(w, buf, peer, i)
						r.NoError(err)
						r.NoError(w.Barrier())
						st, err = q.Wait()
						r.NoError(err)
						r.Equal(size, st.Bytes)
						r.NoError(checkPattern(buf, i+1))
					}
					s := w.p.ep.Stats()
					carries := w.p.ep.PeerCarriesImmediate(w.world(peer))
					if w.Rank() == 0 {
						if carries {
							r.Positive(s.ImmediateSent, "eager messages went as immediate requests")
						} else {
							r.Zero(s.ImmediateSent)
						}
					} else if carries {
						r.Positive(s.ImmediateRecv)
					}
					r.Equal(!off && (nw == "loop" || nw == "shm"), carries)
				})
			})
		}
	}
}

// countTool counts the events it sees.
type countTool struct{ n int }

func (t *countTool) Before(*Event) {}
func (t *countTool) After(*Event)  { t.n++ }

// An eager Isend completes in its call and keeps no state: its handle
// still behaves as a completed send under every completion call (status
// with destination, tag and bytes; null once reported), Cancel says
// ErrCancelSend, Free nulls it, Info describes it, and a tool attached
// after the call sees a request it can complete.
func TestEagerIsendCompletesInItsCall(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		peer := 1 - w.Rank()
		if w.Rank() == 1 {
			buf := make([]byte, 100)
			for i := 0; i < 8; i++ {
				st, err := Recv(w, buf, peer, i)
				r.NoError(err)
				r.NoError(checkPattern(buf[:st.Bytes], i))
			}
			return
		}
		send := func(i int) Request {
			q, err := Isend(w, patterned(10+i, i), peer, i)
			r.NoError(err)
			return q
		}
		want := func(i int) Status { return Status{Source: peer, Tag: i, Bytes: 10 + i} }

		q := send(0) // Test, then the handle is null
		ok, st, err := q.Test()
		r.NoError(err)
		r.True(ok)
		r.Equal(want(0), st)
		r.Equal(RequestInfo{}, q.Info(), "null once reported")
		st, err = q.Wait()
		r.NoError(err)
		r.Equal(emptyStatus, st)

		q = send(1) // Cancel, Info, Wait
		r.ErrorIs(q.Cancel(), ErrCancelSend)
		info := q.Info()
		r.True(info.Send)
		r.Equal(peer, info.Peer)
		r.Equal(1, info.Tag)
		r.Equal(11, info.Bytes)
		st, err = q.Wait()
		r.NoError(err)
		r.Equal(want(1), st)

		q = send(2) // Free
		r.NoError(q.Free())
		ok, _, err = q.Test()
		r.NoError(err)
		r.True(ok)

		reqs := []Request{Request{}, send(3)} // Waitany, then Testany finds none active
		idx, st, err := Waitany(reqs)
		r.NoError(err)
		r.Equal(1, idx)
		r.Equal(want(3), st)
		r.Zero(reqs[1])
		idx, ok, _, err = Testany(reqs)
		r.NoError(err)
		r.True(ok)
		r.Equal(Undefined, idx)

		reqs = []Request{send(4), send(5)} // Waitsome, Waitall with statuses
		got, sts, err := Waitsome(reqs)
		r.NoError(err)
		r.Equal([]int{0, 1}, got)
		r.Equal([]Status{want(4), want(5)}, sts)
		reqs = []Request{send(6)}
		statuses := make([]Status, 1)
		r.NoError(Waitall(reqs, statuses))
		r.Equal(want(6), statuses[0])
		r.Zero(reqs[0])

		q = send(7) // a tool attached after the call
		tool := &countTool{}
		r.NoError(w.AddTool(tool))
		st, err = q.Wait()
		r.NoError(err)
		r.Equal(want(7), st)
	})
}
