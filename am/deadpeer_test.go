package am

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/stretchr/testify/require"
)

// A rank whose network attachment goes away mid-job (its transport closed,
// as a crashed process's would be) is reported to a rank blocked waiting for
// it, by rank, within the 5 s the job promises; requests to it then fail at
// once, and traffic between the live ranks goes on.
func TestDeadPeerReleasesBlockedWait(t *testing.T) {
	for _, network := range []string{"loop"} { // shm notices a dead process by its pid, which in-process ranks share: mpiam's process tests cover it
		t.Run(network, func(t *testing.T) {
			trs := openJob(t, network, 3)
			var eps []*Endpoint
			var got atomic.Int64
			const hPing handlers.Index = 20
			for _, tr := range trs {
				ep, err := New(tr, Config{})
				require.NoError(t, err)
				_, err = ep.Register(handlers.Entry{Index: hPing, Name: "ping", NArgs: 1,
					Fn: func(tok *handlers.Token, a []uint64, _ []byte) { got.Add(int64(a[0])) }})
				require.NoError(t, err)
				eps = append(eps, ep)
			}
			t.Cleanup(func() {
				for _, ep := range eps {
					_ = ep.tr.Close()
				}
			})
			// Rank 1 keeps polling for the live traffic.
			defer pollInBackground(eps[1], 50*time.Microsecond)()

			start := time.Now()
			go func() {
				time.Sleep(20 * time.Millisecond)
				_ = trs[2].Close() // rank 2 "dies"
			}()
			err := eps[0].PollUntil(func() bool { return false }) // waits on rank 2 for ever
			took := time.Since(start)
			require.ErrorIs(t, err, ErrPeerDead)
			require.ErrorIs(t, err, transport.ErrPeer)
			var pe *PeerError
			require.True(t, errors.As(err, &pe))
			require.Equal(t, 2, pe.Rank)
			require.Less(t, took, 5*time.Second)
			t.Logf("%s: rank 2's death seen by rank 0 after %v", network, took)
			require.Equal(t, []int{2}, eps[0].DeadPeers())
			require.Equal(t, 1, eps[0].Deaths())
			require.ErrorIs(t, eps[0].PeerFailure(2), ErrPeerDead)
			require.NoError(t, eps[0].PeerFailure(1))

			// New requests to the dead rank fail at once; a barrier cannot complete.
			err = eps[0].RequestShort(2, hPing, 1)
			require.ErrorIs(t, err, ErrPeerDead)
			require.ErrorIs(t, eps[0].Barrier(), ErrPeerDead)

			// Live ranks still talk; a wait started after the death is not failed by it.
			require.NoError(t, eps[0].RequestShort(1, hPing, 5))
			require.NoError(t, eps[0].PollUntil(func() bool { return got.Load() == 5 }))
			n, err := eps[0].Poll()
			require.NoError(t, err, "a known death is reported once")
			require.GreaterOrEqual(t, n, 0)
		})
	}
}

// failedRank takes the rank from the error's type, never from its words: a
// message that names other ranks first ("rank 0's ring from rank 3") or none
// at all is attributed to the rank the *transport.PeerError carries.
func TestFailedRankFromNetworkErrors(t *testing.T) {
	for _, c := range []struct {
		err        error
		self, want int
	}{
		{transport.PeerErrorf(3, "shm: rank 0's ring from rank 3: corrupt"), 0, 3},
		{transport.PeerErrorf(0, "tcp: rank 1: dial rank 0: refused"), 1, 0},
		{transport.PeerErrorf(2, "a message without any number"), 0, 2},
		{fmt.Errorf("wrapped: %w", transport.PeerErrorf(2, "gone")), 0, 2},
		{&PeerError{Rank: 1, Err: errors.New("gone")}, 0, 1},
		{errors.New("tcp: rank 3 has closed"), 0, -1}, // words are not a contract
		{fmt.Errorf("untyped: %w", transport.ErrPeer), 0, -1},
		{transport.PeerErrorf(99, "send to rank 99 of 4"), 0, -1},
		{transport.PeerErrorf(0, "myself"), 0, -1},
	} {
		require.Equal(t, c.want, failedRank(c.err, c.self, 4), "%v", c.err)
	}
	require.ErrorIs(t, transport.PeerErrorf(1, "x"), transport.ErrPeer)
}
