package am

import (
	"fmt"
	"sync"
	"testing"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/loop"
	"github.com/amgo-hpc/amgo/am/transport/shm"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
	"github.com/stretchr/testify/require"
)

// networks lists every network the endpoint tests run on: every protocol path
// is tested on every transport.
var networks = []string{"fake", "loop", "shm", "lossy"}

var jobSeq sync.Mutex
var jobN int

// openJob opens n ranks of one job over the named network in this process.
func openJob(t testing.TB, network string, n int) []transport.Transport {
	t.Helper()
	switch network {
	case "fake":
		return newFakeNet(n).transports()
	case "lossy":
		// 10% loss, 30% reordering, 1% duplication: am's reliability layer
		// makes it ordered and reliable. The seed replays a failure.
		seed := int64(20261121 + n)
		t.Logf("lossy network seed=%d", seed)
		return newLossyNet(n, seed).transports()
	case "loop":
		trs, err := loop.NewJob(n, nil)
		require.NoError(t, err)
		return trs
	case "shm":
		jobSeq.Lock()
		jobN++
		id := fmt.Sprintf("amtest-%d-%d", jobN, n)
		jobSeq.Unlock()
		boots := transporttest.NewBootstraps(n, id)
		trs := make([]transport.Transport, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range boots {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				trs[i], errs[i] = shm.New(boots[i], map[string]string{"dir": t.TempDir()})
			}(i)
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		return trs
	}
	t.Fatalf("unknown network %q", network)
	return nil
}

// forEachNetwork runs body on n fresh endpoints over every network.
func forEachNetwork(t *testing.T, n int, cfg Config, body func(t *testing.T, eps []*Endpoint)) {
	for _, network := range networks {
		t.Run(network, func(t *testing.T) {
			var eps []*Endpoint
			for _, tr := range openJob(t, network, n) {
				ep, err := New(tr, cfg)
				require.NoError(t, err)
				eps = append(eps, ep)
			}
			t.Cleanup(func() {
				for _, ep := range eps {
					_ = ep.tr.Close()
				}
			})
			body(t, eps)
		})
	}
}
