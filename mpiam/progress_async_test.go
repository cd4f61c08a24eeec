package mpiam

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// With a progress goroutine (AMGO_PROGRESS), a rendezvous Isend moves its
// data while the sending rank computes and makes no MPI call: the receive
// completes long before the sender comes back (asynchronous progress).
func TestAsyncProgressDuringCompute(t *testing.T) {
	t.Setenv("AMGO_PROGRESS", "200us")
	var recvDone, computeDone atomic.Int64
	err := RunLocal(2, Config{}, func(w *Comm) error {
		n := w.p.eagerNoGet * 8 // rendezvous on every network
		if w.Rank() == 0 {
			r, err := Isend(w, make([]byte, n), 1, 1)
			if err != nil {
				return err
			}
			time.Sleep(300 * time.Millisecond) // compute, no MPI calls
			computeDone.Store(time.Now().UnixNano())
			_, err = r.Wait()
			return err
		}
		if _, err := Recv(w, make([]byte, n), 0, 1); err != nil {
			return err
		}
		recvDone.Store(time.Now().UnixNano())
		return nil
	})
	require.NoError(t, err)
	require.Less(t, recvDone.Load(), computeDone.Load(), "the data moved while the sender computed")
}
