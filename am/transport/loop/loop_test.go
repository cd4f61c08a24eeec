package loop

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

func TestConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		ts, err := NewJob(n, map[string]string{"ring_bytes": "16k"})
		require.NoError(t, err)
		return ts
	})
}

func TestFactory(t *testing.T) {
	tr, err := transport.Open("loop", transporttest.NewBootstraps(1, "one")[0], nil)
	require.NoError(t, err)
	require.Equal(t, 1, tr.Size())
	require.Equal(t, "loop", tr.Caps().Name)
	require.NoError(t, tr.Close())

	_, err = transport.Open("loop", transporttest.NewBootstraps(2, "two")[0], nil)
	require.ErrorContains(t, err, "NewJob")
}

func TestOptions(t *testing.T) {
	ts, err := NewJob(1, map[string]string{"ring_bytes": "1m", "spin": "1us"})
	require.NoError(t, err)
	require.Greater(t, ts[0].Caps().MaxPacket, 500<<10)
	for _, o := range []map[string]string{{"ring_bytes": "x"}, {"ring_bytes": "8"}, {"spin": "fast"}} {
		_, err := NewJob(1, o)
		require.Error(t, err, "%v", o)
	}
	_, err = NewJob(0, nil)
	require.Error(t, err)
}

// No wake-up is lost with senders that skip their fence (internal/membarrier).
func TestWakeRace(t *testing.T) {
	rounds := 3000
	if testing.Short() {
		rounds = 300
	}
	ts, err := NewJob(2, map[string]string{"spin": "0s"})
	require.NoError(t, err)
	transporttest.WakeRace(t, ts, rounds, 1)
}

// Rings are made on first contact: a job of 1000 ranks costs no ring until
// a rank sends, and a rank polls only the rings into it. Many ranks making
// their rings into one rank at once (each rank's first Send) lose nothing.
func TestRingsOnFirstContact(t *testing.T) {
	const n = 1000
	ts, err := NewJob(n, nil)
	require.NoError(t, err)
	for _, tr := range ts {
		require.Zero(t, tr.(*Transport).nAct.Load())
	}
	var wg sync.WaitGroup
	for src := 1; src < 64; src++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, ts[src].Send(0, []byte{byte(src)}, nil))
			require.NoError(t, ts[src].Send(0, []byte{byte(src)}, nil))
		}()
	}
	got := map[int]int{}
	var last transporttest.Last
	for total := 0; total < 2*63; {
		k, err := ts[0].Poll(&last, 1)
		require.NoError(t, err)
		if k > 0 {
			require.Equal(t, byte(last.Src), last.Buf[0])
			got[last.Src]++
			total++
		}
	}
	wg.Wait()
	for src := 1; src < 64; src++ {
		require.Equal(t, 2, got[src], "packets from rank %d", src)
	}
	require.Equal(t, int32(63), ts[0].(*Transport).nAct.Load())
	require.Zero(t, ts[1].(*Transport).nAct.Load())
}

// Sleep is Wait without the spin (transport.Sleeper).
func TestSleep(t *testing.T) {
	ts, err := NewJob(2, nil)
	require.NoError(t, err)
	defer ts[0].Close()
	defer ts[1].Close()
	transporttest.Sleep(t, ts)
}

// Wake ends a Wait in progress, and makes the next Wait return at once when
// no Wait is in progress (transport.Waker).
func TestWake(t *testing.T) {
	ts, err := NewJob(2, map[string]string{"spin": "0s"})
	require.NoError(t, err)
	defer ts[0].Close()
	defer ts[1].Close()
	transporttest.Wake(t, ts)
}
