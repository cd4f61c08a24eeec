package flowctl

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOwedCoalescesAdjacentFrees(t *testing.T) {
	var o Owed
	_, _, ok := o.Take()
	require.False(t, ok)
	_, pl, total := o.Add(0, 64)
	require.Zero(t, pl)
	require.Equal(t, uint32(64), total)
	_, pl, total = o.Add(64, 128)
	require.Zero(t, pl, "adjacent: coalesced")
	require.Equal(t, uint32(192), total)
	po, pl, total := o.Add(1024, 64) // not adjacent: the older range goes back
	require.Equal(t, [2]uint32{0, 192}, [2]uint32{po, pl})
	require.Equal(t, uint32(64), total)
	_, _, ok = o.TakeBefore(2048)
	require.False(t, ok, "not directly before")
	off, n, ok := o.TakeBefore(1088)
	require.True(t, ok)
	require.Equal(t, [2]uint32{1024, 64}, [2]uint32{off, n})
	require.Zero(t, o.Len())
}

func TestCarryPolicy(t *testing.T) {
	const buf = 16 << 10
	require.False(t, CarryOnRequest(0, 1<<20, buf), "nothing owed")
	require.False(t, CarryOnRequest(64, 8, buf), "small request, small range")
	require.True(t, CarryOnRequest(64, CarryMin, buf), "a large request carries any range")
	require.True(t, CarryOnRequest(buf/4, 0, buf), "an urgent range rides on anything")
	require.True(t, Urgent(buf/4, buf))
	require.False(t, Urgent(buf/4-64, buf))
}

// A model test: a sender's Window and a receiver's Owed, driven by a random
// interleaving of allocations, consumptions in any order, and every way the
// credit goes back (a request carrying it, a reply before which it ends, an
// ack when displaced or urgent). Against a reference (the set of granules
// allocated and not yet returned to the sender), every granule comes back
// exactly once, the window never refuses a return, and it ends empty.
func TestOwedAgainstReferenceModel(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 42))
		const size = 4 << 10
		w, err := NewWindow(size)
		require.NoError(t, err)
		var o Owed
		type blk struct{ off, n uint32 }
		var inFlight []blk      // allocated, not consumed yet
		out := map[uint32]int{} // reference: granule -> outstanding count
		ret := func(off, n uint32) {
			require.NoError(t, w.Free(off, n), "seed %d: return [%d,+%d)", seed, off, n)
			for g := off; g < off+n; g += Granule {
				out[g%size]--
				require.GreaterOrEqual(t, out[g%size], 0, "seed %d: granule %d returned twice", seed, g)
			}
		}
		for step := 0; step < 20000; step++ {
			switch k := rng.IntN(10); {
			case k < 4: // the sender reserves space for a request
				n := (1 + rng.IntN(6)) * Granule
				off, ok, err := w.Alloc(n)
				require.NoError(t, err)
				if !ok {
					continue
				}
				inFlight = append(inFlight, blk{off, uint32(n)})
				for g := off; g < off+uint32(n); g += Granule {
					out[g%size]++
				}
			case k < 7 && len(inFlight) > 0: // the receiver consumes one, mostly in order
				i := 0
				if rng.IntN(4) == 0 {
					i = rng.IntN(len(inFlight))
				}
				b := inFlight[i]
				inFlight = append(inFlight[:i], inFlight[i+1:]...)
				if rng.IntN(5) == 0 { // answered by a reply: its own space, plus the range before it
					if off, n, ok := o.TakeBefore(b.off); ok {
						require.Equal(t, b.off, off+n)
						ret(off, n+b.n)
					} else {
						ret(b.off, b.n)
					}
					continue
				}
				if po, pl, total := o.Add(b.off, b.n); pl > 0 { // displaced: an ack
					ret(po, pl)
				} else if Urgent(total, size) && rng.IntN(2) == 0 { // urgent: an ack
					if off, n, ok := o.Take(); ok {
						ret(off, n)
					}
				}
			case k < 9: // a request to the sender carries the range, if the policy says so
				if CarryOnRequest(o.Len(), rng.IntN(512), size) {
					if off, n, ok := o.Take(); ok {
						ret(off, n)
					}
				}
			default: // the receiver idles: everything goes back
				if off, n, ok := o.Take(); ok {
					ret(off, n)
				}
			}
		}
		for _, b := range inFlight {
			if po, pl, _ := o.Add(b.off, b.n); pl > 0 {
				ret(po, pl)
			}
		}
		if off, n, ok := o.Take(); ok {
			ret(off, n)
		}
		for g, c := range out {
			require.Zero(t, c, "seed %d: granule %d outstanding at the end", seed, g)
		}
		require.Zero(t, w.InUse(), "seed %d", seed)
	}
}

// The poller adds while senders take, concurrently: every byte comes back
// exactly once (run under the race detector by make race).
func TestOwedConcurrentAddAndTake(t *testing.T) {
	var o Owed
	var returned atomic.Uint64
	const adds = 100000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, n, ok := o.Take(); ok {
					returned.Add(uint64(n))
				}
			}
		}()
	}
	off := uint32(0)
	for i := 0; i < adds; i++ {
		if _, pl, _ := o.Add(off, Granule); pl > 0 {
			returned.Add(uint64(pl))
		}
		off += Granule
		if i%97 == 0 {
			off += Granule // a gap: the next add displaces the range
		}
	}
	close(stop)
	wg.Wait()
	if _, n, ok := o.Take(); ok {
		returned.Add(uint64(n))
	}
	require.Equal(t, uint64(adds*Granule), returned.Load())
}
