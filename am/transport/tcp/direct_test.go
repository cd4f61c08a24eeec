//go:build linux

package tcp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/transport"
)

// waitFor polls tr, sleeping in Wait with a long timeout between polls, until
// it has delivered want packets; it fails when that takes seconds (Wait slept
// through an arrival).
func waitFor(t *testing.T, tr *Transport, want int) {
	t.Helper()
	got := 0
	start := time.Now()
	for got < want {
		n, err := tr.Poll(recvFunc(func(int, []byte) {}), 64)
		require.NoError(t, err)
		got += n
		if got < want {
			require.NoError(t, tr.Wait(10*time.Second))
		}
		require.Less(t, time.Since(start), 3*time.Second, "Wait slept through an arrival")
	}
}

// epollCount is the number of rank r's open connections in its epoll set and
// outside it.
func epollCount(tr *Transport) (in, out int) {
	tr.pollMu.Lock()
	defer tr.pollMu.Unlock()
	for _, c := range tr.open {
		if c.fd < 0 {
			continue
		}
		if c.polled {
			in++
		} else {
			out++
		}
	}
	return
}

// Up to directMax open connections stay out of the epoll set and Wait still
// wakes on their arrivals; beyond it they all join the set, and Wait wakes on
// them there; a peer that vanishes without a goodbye wakes Wait in both.
func TestDirectAndEpollWait(t *testing.T) {
	const n = directMax + 3
	ts := openJob(t, n, map[string]string{"spin": "0s"})
	defer closeAll(ts)
	late := func(src, dst int) chan struct{} {
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			time.Sleep(50 * time.Millisecond)
			ts[src].Send(dst, []byte("late"), nil)
		}()
		return sent
	}
	// Direct: rank 0 talks to rank 1 only (rank 1 dials, rank 0 accepts).
	require.NoError(t, ts[1].Send(0, []byte("hi"), nil))
	waitFor(t, ts[0], 1)
	sent := late(0, 1)
	waitFor(t, ts[1], 1) // a dialed connection
	<-sent
	in, out := epollCount(ts[0])
	require.Equal(t, [2]int{0, 1}, [2]int{in, out})
	sent = late(1, 0)
	waitFor(t, ts[0], 1) // an accepted one
	<-sent
	in, out = epollCount(ts[1])
	require.Equal(t, [2]int{0, 1}, [2]int{in, out})

	// Everyone to everyone: n-1 > directMax connections each, all in epoll.
	done := make(chan struct{})
	for r := 0; r < n; r++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for d := 0; d < n; d++ {
				if d != r {
					require.NoError(t, ts[r].Send(d, []byte("all"), nil))
				}
			}
			waitFor(t, ts[r], n-1)
		}()
	}
	for r := 0; r < n; r++ {
		<-done
	}
	for r := 0; r < n; r++ {
		in, out := epollCount(ts[r])
		require.Equal(t, [2]int{n - 1, 0}, [2]int{in, out}, "rank %d", r)
	}
	sent = late(n-1, 0)
	waitFor(t, ts[0], 1)
	<-sent

	// A peer vanishing without a goodbye wakes a sleeping Wait (epoll mode).
	checkDead := func(tr *Transport, dead *Transport) {
		go func() {
			// Close without the goodbyes.
			time.Sleep(50 * time.Millisecond)
			dead.closed.Store(true)
			dead.connWG.Wait()
			dead.pollMu.Lock()
			dead.pump()
			dead.closeFds()
			dead.pollMu.Unlock()
		}()
		start := time.Now()
		for {
			_, err := tr.Poll(recvFunc(func(int, []byte) {}), 64)
			if err != nil {
				require.ErrorIs(t, err, transport.ErrPeer)
				break
			}
			require.NoError(t, tr.Wait(10*time.Second))
			require.Less(t, time.Since(start), 3*time.Second, "dead peer not noticed")
		}
	}
	checkDead(ts[0], ts[n-1])

	// And in direct mode: a fresh pair.
	ps := openJob(t, 2, map[string]string{"spin": "0s"})
	defer closeAll(ps)
	require.NoError(t, ps[1].Send(0, []byte("hi"), nil))
	waitFor(t, ps[0], 1)
	in, out = epollCount(ps[0])
	require.Equal(t, [2]int{0, 1}, [2]int{in, out})
	checkDead(ps[0], ps[1])
}
