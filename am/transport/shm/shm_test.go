//go:build linux

package shm

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

var jobSeq atomic.Int64

// openJob opens n shm transports in this process, each on its own goroutine
// (New fences), with their files in a test directory.
func openJob(t testing.TB, n int, opts map[string]string) []transport.Transport {
	dir := t.TempDir()
	o := map[string]string{"dir": dir}
	for k, v := range opts {
		o[k] = v
	}
	bs := transporttest.NewBootstraps(n, fmt.Sprintf("shmtest-%d", jobSeq.Add(1)))
	ts := make([]transport.Transport, n)
	errs := make(chan error, n)
	for i := range bs {
		go func() {
			tr, err := New(bs[i], o)
			if err == nil {
				ts[i] = tr
			}
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
		return openJob(t, n, map[string]string{"ring_bytes": "16k"})
	})
}
