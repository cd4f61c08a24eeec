package am

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/loop"
	"github.com/amgo-hpc/amgo/am/transport/route"
	"github.com/amgo-hpc/amgo/am/transport/shm"
	"github.com/amgo-hpc/amgo/am/transport/sim"
	"github.com/amgo-hpc/amgo/am/transport/tcp"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
	"github.com/amgo-hpc/amgo/am/transport/udp"
	"github.com/stretchr/testify/require"
)

// networks lists every network the endpoint tests run on: every protocol path
// is tested on every transport. "sim" and "udp" are unordered and unreliable:
// New puts the reliability layer on them.
var networks = []string{"fake", "loop", "shm", "lossy", "sim", "udp", "loop+sim", "shm+tcp"}

// simSeed is the seed of the sim network: AMGO_SIM_SEED replays a failure
// that printed seed=N, otherwise a fixed seed per job size.
func simSeed(t testing.TB, n int) int64 {
	seed := int64(20261121 + n)
	if s := os.Getenv(sim.EnvSeed); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		require.NoError(t, err, sim.EnvSeed)
		seed = v
	}
	t.Logf("sim network seed=%d (replay: %s=%d)", seed, sim.EnvSeed, seed)
	return seed
}

var jobSeq sync.Mutex
var jobN int

// nextJobID names a new job of n ranks over network, unique in this process.
func nextJobID(network string, n int) string {
	jobSeq.Lock()
	defer jobSeq.Unlock()
	jobN++
	return fmt.Sprintf("amtest-%s-%d-%d", network, jobN, n)
}

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
	case "sim":
		// 10% loss, 30% reordering, 1% duplication, in package sim.
		trs, err := sim.NewJob(n, sim.Config{Seed: simSeed(t, n), Loss: 0.10, Reorder: 0.30, Duplicate: 0.01})
		require.NoError(t, err)
		return trs
	case "udp":
		return openBooted(t, n, nextJobID("udp", n), func(b transport.Bootstrap) (transport.Transport, error) {
			return udp.New(b, map[string]string{"iface": "127.0.0.1"})
		})
	case "tcp":
		return openBooted(t, n, nextJobID("tcp", n), func(b transport.Bootstrap) (transport.Transport, error) {
			return tcp.New(b, map[string]string{"iface": "127.0.0.1"})
		})
	case "shm":
		return openBooted(t, n, nextJobID("shm", n), func(b transport.Bootstrap) (transport.Transport, error) {
			return shm.New(b, map[string]string{"dir": t.TempDir()})
		})
	case "loop+sim", "shm+tcp":
		// Ranks alternate between two emulated nodes (package route):
		// neighbours cross nodes, ranks two apart share one.
		nodes := make([]int, n)
		for r := range nodes {
			nodes[r] = r % 2
		}
		local, between := "loop", "sim"
		if network == "shm+tcp" {
			local, between = "shm", "tcp"
		}
		trs, err := route.Build(nodes,
			func(k int) ([]transport.Transport, error) { return openJob(t, local, k), nil },
			func(k int) ([]transport.Transport, error) { return openJob(t, between, k), nil })
		require.NoError(t, err)
		return trs
	}
	t.Fatalf("unknown network %q", network)
	return nil
}

// openBooted opens n ranks of a network whose constructor needs a bootstrap,
// each on its own goroutine (the constructors fence).
func openBooted(t testing.TB, n int, id string, open func(transport.Bootstrap) (transport.Transport, error)) []transport.Transport {
	boots := transporttest.NewBootstraps(n, id)
	trs := make([]transport.Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range boots {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			trs[i], errs[i] = open(boots[i])
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return trs
}

// openEndpoints opens n endpoints over network with cfg, closed when the
// test ends.
func openEndpoints(t *testing.T, network string, n int, cfg Config) []*Endpoint {
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
	return eps
}

// forEachNetwork runs body on n fresh endpoints over every network.
func forEachNetwork(t *testing.T, n int, cfg Config, body func(t *testing.T, eps []*Endpoint)) {
	for _, network := range networks {
		t.Run(network, func(t *testing.T) {
			body(t, openEndpoints(t, network, n, cfg))
		})
	}
}
