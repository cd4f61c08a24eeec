package job

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/route"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

func TestNodeID(t *testing.T) {
	t.Setenv(EnvNode, "")
	id, err := NodeID()
	require.NoError(t, err)
	require.Regexp(t, `^boot=[0-9a-f-]+,shm=\d+:\d+,pidns=\d+$`, id)
	again, err := NodeID()
	require.NoError(t, err)
	require.Equal(t, id, again, "stable within a process")
	t.Setenv(EnvNode, "a")
	id, err = NodeID()
	require.NoError(t, err)
	require.Equal(t, "node=a", id)
}

// Every rank learns the same layout, nodes numbered by their lowest rank.
func TestDiscoverLayout(t *testing.T) {
	ids := []string{"x", "y", "x", "z", "y"}
	boots := transporttest.NewBootstraps(len(ids), "layout")
	got := make([]Layout, len(ids))
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for r := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[r], errs[r] = discover(boots[r], ids[r])
		}()
	}
	wg.Wait()
	for r := range ids {
		require.NoError(t, errs[r])
		require.Equal(t, []int{0, 1, 0, 2, 1}, got[r].Node, "rank %d", r)
	}
	l := got[0]
	require.Equal(t, 3, l.Nodes())
	require.Equal(t, []int{1, 4}, l.Ranks(1))
}

// openRouted over in-memory bootstraps: ranks on two emulated nodes reach
// their node's ranks over shm and the others over tcp, and a job on one
// node uses shm alone.
func TestOpenRouted(t *testing.T) {
	t.Setenv("AMGO_JOB_DIR", t.TempDir())
	t.Setenv("AMGO_IFACE", "127.0.0.1")
	for _, tc := range []struct {
		node  []int
		names []string // rank 0's network to each rank
	}{
		{[]int{0, 1, 0, 1}, []string{"shm", "tcp", "shm", "tcp"}},
		{[]int{0, 0, 0}, nil},
	} {
		t.Run(fmt.Sprint(tc.node), func(t *testing.T) {
			n := len(tc.node)
			boots := transporttest.NewBootstraps(n, fmt.Sprintf("routed-%d", n))
			trs := make([]transport.Transport, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					trs[r], errs[r] = openRouted(boots[r], Layout{Node: tc.node})
				}()
			}
			wg.Wait()
			for r := range n {
				require.NoError(t, errs[r])
				defer trs[r].Close()
			}
			if tc.names == nil {
				require.Equal(t, "shm", trs[0].Caps().Name, "one node: shm alone")
				return
			}
			rt, ok := trs[0].(*route.Transport)
			require.True(t, ok)
			for r, want := range tc.names {
				require.Equal(t, want, rt.Network(r), "rank 0 to rank %d", r)
			}
			// Rank 0 exchanges a packet with every rank, over both networks.
			for peer := 1; peer < n; peer++ {
				echo := make(chan error, 1)
				go func() {
					var rx transporttest.Last
					if err := transporttest.RecvOne(trs[peer], &rx, true); err != nil {
						echo <- err
						return
					}
					echo <- transporttest.SendRetry(trs[peer], rx.Src, rx.Buf, nil, &rx)
				}()
				msg := []byte{byte(peer), 1, 2, 3, 4, 5, 6, 7}
				var rx transporttest.Last
				require.NoError(t, transporttest.SendRetry(trs[0], peer, msg, nil, &rx))
				require.NoError(t, transporttest.RecvOne(trs[0], &rx, true))
				require.NoError(t, <-echo)
				require.Equal(t, peer, rx.Src)
				require.Equal(t, msg, rx.Buf)
			}
		})
	}
}
