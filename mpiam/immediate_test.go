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
