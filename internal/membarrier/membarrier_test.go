package membarrier

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/internal/release"
)

// storeBuffering runs rounds of the store-buffering litmus test on two
// goroutines: side A stores x with a release store and loads y; side B stores
// y, runs fence, and loads x. It returns how many rounds both loads read zero.
func storeBuffering(t *testing.T, rounds int, bStore func(*uint64, uint64), fence func() error) int {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs two Ps: the sides must run at once")
	}
	var x, y uint64
	var turn, arrived atomic.Uint64 // round both sides may run; sides done with it
	var bothZero atomic.Int64
	var wg sync.WaitGroup
	side := func(store func(*uint64, uint64), mine, other *uint64, fence func() error, seen *[2]uint64, k int) {
		defer wg.Done()
		for i := uint64(1); i <= uint64(rounds); i++ {
			for turn.Load() != i {
			}
			store(mine, 1)
			if fence != nil {
				if err := fence(); err != nil {
					t.Error(err)
				}
			}
			seen[k] = atomic.LoadUint64(other)
			if arrived.Add(1) == 2*i { // the second side to finish the round
				if seen[0] == 0 && seen[1] == 0 {
					bothZero.Add(1)
				}
				atomic.StoreUint64(&x, 0)
				atomic.StoreUint64(&y, 0)
				turn.Store(i + 1)
			}
		}
	}
	var seen [2]uint64 // written by its side before arrived.Add, read after it
	wg.Add(2)
	go side(release.Store64, &x, &y, nil, &seen, 0)
	go side(bStore, &y, &x, fence, &seen, 1)
	turn.Store(1)
	wg.Wait()
	return int(bothZero.Load())
}

// With Heavy on one side, both loads reading zero is forbidden: the outcome
// x86 allows (each store still in its core's store buffer when the other core
// loads) for two release stores without a fence.
func TestStoreBufferingForbidden(t *testing.T) {
	if !Enabled() {
		t.Skip("membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) not available here")
	}
	rounds := 5000
	if testing.Short() {
		rounds = 500
	}
	require.Zero(t, storeBuffering(t, rounds, release.Store64, Heavy), "rounds in which both sides missed the other's store")
	// The control, without Heavy, shows that the test can see the outcome at
	// all; whether it does in a given run depends on timing, so it is logged,
	// not asserted.
	t.Logf("without a fence: both loads read zero in %d of %d rounds", storeBuffering(t, rounds, release.Store64, nil), rounds)
}

func TestHeavy(t *testing.T) {
	require.NoError(t, Heavy()) // a no-op when not Enabled
}

// BenchmarkHeavy is the heavy side's cost: an inter-processor interrupt to
// every CPU that runs a registered process.
func BenchmarkHeavy(b *testing.B) {
	if !Enabled() {
		b.Skip("membarrier not available here")
	}
	for b.Loop() {
		if err := Heavy(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHeavyBusy is Heavy while another thread of this process spins on
// the other CPU: the interrupt it must take.
func BenchmarkHeavyBusy(b *testing.B) {
	if !Enabled() {
		b.Skip("membarrier not available here")
	}
	var stop atomic.Bool
	go func() {
		for !stop.Load() {
		}
	}()
	for b.Loop() {
		if err := Heavy(); err != nil {
			b.Fatal(err)
		}
	}
	stop.Store(true)
}
