package template

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/stretchr/testify/require"
)

var jobSeq atomic.Int64

// openJob opens n ranks through the registered factory, each on its own
// goroutine (New fences with the others), as processes would.
func openJob(t testing.TB, n int, opts map[string]string) []transport.Transport {
	boots := transporttest.NewBootstraps(n, fmt.Sprintf("template-test-%d", jobSeq.Add(1)))
	trs := make([]transport.Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range boots {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			trs[i], errs[i] = transport.Open(Name, boots[i], opts)
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return trs
}

// The conformance suite every transport runs.
func TestConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		return openJob(t, n, map[string]string{"queue_bytes": "80000"})
	})
}

func TestOptions(t *testing.T) {
	_, err := New(transporttest.NewBootstraps(1, "template-bad")[0], map[string]string{"queue_bytes": "12"})
	require.Error(t, err)
}

// A peer that closed is reported by Send with its rank (the PeerRank
// convention am reads).
func TestClosedPeer(t *testing.T) {
	trs := openJob(t, 2, nil)
	require.NoError(t, trs[1].Close())
	err := trs[0].Send(1, []byte{1}, nil)
	require.ErrorIs(t, err, transport.ErrPeer)
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 1, pe.Rank)
}

// am over the template: requests, replies, stores of every size (single-copy
// Put above PutMin, here always), a barrier; and a closed rank reported to a
// blocked wait.
func TestEndpoint(t *testing.T) {
	const n = 3
	trs := openJob(t, n, nil)
	eps := make([]*am.Endpoint, n)
	var sum atomic.Int64
	var stored atomic.Int64
	const hAdd, hAck, hStored handlers.Index = 10, 11, 12
	for i, tr := range trs {
		ep, err := am.New(tr, am.Config{})
		require.NoError(t, err)
		_, err = ep.Register(handlers.Entry{Index: hAdd, Name: "add", NArgs: 1, Fn: func(tok *handlers.Token, a []uint64, p []byte) {
			_ = tok.ReplyShort(hAck, a[0]+uint64(len(p)))
		}})
		require.NoError(t, err)
		_, err = ep.Register(handlers.Entry{Index: hAck, Name: "ack", NArgs: 1, Fn: func(_ *handlers.Token, a []uint64, _ []byte) {
			sum.Add(int64(a[0]))
		}})
		require.NoError(t, err)
		_, err = ep.Register(handlers.Entry{Index: hStored, Name: "stored", NArgs: 0, Fn: func(_ *handlers.Token, _ []uint64, p []byte) {
			stored.Add(int64(len(p)))
		}})
		require.NoError(t, err)
		eps[i] = ep
	}
	// Rank 1 registers a segment that the others store into.
	dst := make([]byte, 1<<20)
	seg, err := eps[1].RegisterSegment(dst)
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, ep := range eps {
		wg.Add(1)
		go func(i int, ep *am.Endpoint) {
			defer wg.Done()
			errs[i] = func() error {
				if i != 1 {
					for k := 0; k < 100; k++ {
						if err := ep.RequestMedium(1, hAdd, make([]byte, k), 1); err != nil {
							return err
						}
					}
					half := len(dst) / 2
					data := bytes.Repeat([]byte{byte(i)}, half)
					if err := ep.Store(1, hStored, seg.Addr+uint64(half*(i/2)), data); err != nil {
						return err
					}
				}
				return ep.Barrier()
			}()
		}(i, ep)
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	// The barrier does not order rank 2's requests to rank 1 before rank 1's
	// release: poll every rank (rank 1 runs the handlers) until they are in.
	for deadline := time.Now().Add(20 * time.Second); sum.Load() != 2*(100+99*100/2) || stored.Load() != int64(len(dst)); {
		for _, ep := range eps {
			_, err := ep.Poll()
			require.NoError(t, err)
		}
		require.True(t, time.Now().Before(deadline), "sum %d, stored %d after 20 s", sum.Load(), stored.Load())
	}
	require.Equal(t, int64(len(dst)), stored.Load())
	require.Equal(t, bytes.Repeat([]byte{0}, len(dst)/2), dst[:len(dst)/2])
	require.Equal(t, bytes.Repeat([]byte{2}, len(dst)/2), dst[len(dst)/2:])
	require.NoError(t, eps[1].UnregisterSegment(seg))

	// A rank that goes away: a blocked wait returns its failure.
	require.NoError(t, trs[2].Close())
	err = eps[0].PollUntil(func() bool { return false })
	require.ErrorIs(t, err, am.ErrPeerDead)
	require.Equal(t, []int{2}, eps[0].DeadPeers())
	for _, ep := range eps[:2] {
		_ = ep.Close()
	}
}
