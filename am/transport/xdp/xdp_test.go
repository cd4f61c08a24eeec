//go:build linux

package xdp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/internal/reliable"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

// Two ranks in two namespaces exchange packets both ways.
func TestPingPong(t *testing.T) {
	ts := openStar(t, 2, 1500, nil)
	name, q, mode, zc := ts[0].Interface()
	t.Logf("interface %s queue %d, %s mode, zero-copy %v, MaxPacket %d", name, q, mode, zc, ts[0].Caps().MaxPacket)
	done := make(chan error, 1)
	go func() { done <- transporttest.PingPong(ts[1], 0, 1000, false) }()
	require.NoError(t, transporttest.PingPong(ts[0], 0, 1000, false))
	require.NoError(t, <-done)
	t.Logf("rank 0: %+v", ts[0].Stats())
}

// wrapCfg are timers for a veth: round trips of microseconds.
var wrapCfg = reliable.Config{RTOMin: time.Millisecond, RTOInit: 2 * time.Millisecond, RTOMax: 50 * time.Millisecond,
	AckDelay: 100 * time.Microsecond}

// TestConformance runs the transport conformance suite over reliable.Wrap
// of xdp, as package am uses it, with every rank in its own namespace.
func TestConformance(t *testing.T) {
	skipUnlessRoot(t)
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		raw := openStar(t, n, 1500, nil)
		ts := make([]transport.Transport, n)
		for r := range raw {
			w, err := reliable.Wrap(raw[r], wrapCfg, nil)
			require.NoError(t, err)
			ts[r] = w
		}
		return ts
	})
}
