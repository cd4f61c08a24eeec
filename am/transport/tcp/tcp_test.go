//go:build linux

package tcp

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

var jobSeq atomic.Int64

// openJob opens n tcp transports in this process over loopback, each on its
// own goroutine (New fences).
func openJob(t testing.TB, n int, opts map[string]string) []*Transport {
	o := map[string]string{"iface": "127.0.0.1"}
	for k, v := range opts {
		o[k] = v
	}
	bs := transporttest.NewBootstraps(n, fmt.Sprintf("tcptest-%d", jobSeq.Add(1)))
	ts := make([]*Transport, n)
	errs := make(chan error, n)
	for i := range bs {
		go func() {
			tr, err := open(bs[i], o)
			ts[i] = tr
			errs <- err
		}()
	}
	for range bs {
		require.NoError(t, <-errs)
	}
	return ts
}

func TestConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		ts := openJob(t, n, map[string]string{"sendq_bytes": "256k"})
		out := make([]transport.Transport, n)
		for i, tr := range ts {
			out[i] = tr
		}
		return out
	})
}

// Wake ends a Wait in progress, and makes the next Wait return at once when
// no Wait is in progress (transport.Waker).
func TestWakeEndsWait(t *testing.T) {
	ts := openJob(t, 2, map[string]string{"spin": "0s"})
	defer ts[0].Close()
	defer ts[1].Close()
	transporttest.Wake(t, []transport.Transport{ts[0], ts[1]})
}
