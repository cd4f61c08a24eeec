package mpiam

import (
	"fmt"
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

// With a progress goroutine, a nonblocking collective's schedule advances
// while every rank computes and makes no MPI call: an Iallreduce of several
// rounds (4 ranks: two exchanges) and a rendezvous-sized Ibcast complete
// before any rank waits for them.
func TestAsyncProgressOfSchedules(t *testing.T) {
	t.Setenv("AMGO_PROGRESS", "200us")
	err := RunLocal(4, Config{}, func(w *Comm) error {
		sum := make([]int64, 1)
		a, err := Iallreduce(w, []int64{int64(w.Rank())}, sum, Sum[int64]())
		if err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		b, err := Ibcast(w, buf, 0)
		if err != nil {
			return err
		}
		deadline := time.Now().Add(10 * time.Second)
		for !a.completed() || !b.completed() { // compute, no MPI calls
			if time.Now().After(deadline) {
				return fmt.Errorf("rank %d: the schedules did not advance without MPI calls", w.Rank())
			}
			time.Sleep(time.Millisecond)
		}
		if _, err := a.Wait(); err != nil {
			return err
		}
		if _, err := b.Wait(); err != nil {
			return err
		}
		if sum[0] != 6 {
			return fmt.Errorf("Iallreduce: %d", sum[0])
		}
		return nil
	})
	require.NoError(t, err)
}
