package flowctl

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewWindowRejectsBadSizes(t *testing.T) {
	for _, n := range []int{0, -64, 100, 2 << 30} {
		_, err := NewWindow(n)
		require.ErrorIs(t, err, ErrBadSize, "size %d", n)
	}
}

// The buffered protocol of MPI over SP AM: allocation at the sender, freed by the reply.
func TestBufferedProtocolFreesOnReply(t *testing.T) {
	w, err := NewWindow(DefaultBufferBytes)
	require.NoError(t, err)
	var offs []uint32
	for i := 0; i < DefaultBufferBytes/1024; i++ {
		off, ok, err := w.Alloc(1024)
		require.NoError(t, err)
		require.True(t, ok)
		offs = append(offs, off)
	}
	_, ok, err := w.Alloc(64)
	require.NoError(t, err)
	require.False(t, ok, "a full buffer must back-pressure the sender")
	require.NoError(t, w.Free(offs[0], 1024))
	off, ok, err := w.Alloc(1024)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, offs[0], off)
}

// An unexpected message keeps its space while later ones are freed; the ring
// only advances once the oldest block is freed.
func TestRetainedBlockHoldsRing(t *testing.T) {
	w, _ := NewWindow(4 * Granule)
	a, _, _ := w.Alloc(Granule)
	b, _, _ := w.Alloc(Granule)
	c, _, _ := w.Alloc(2 * Granule)
	require.NoError(t, w.Free(b, Granule))
	require.NoError(t, w.Free(c, 2*Granule))
	_, ok, _ := w.Alloc(Granule)
	require.False(t, ok, "block a still holds the ring")
	require.Equal(t, 1, w.Outstanding())
	require.NoError(t, w.Free(a, Granule))
	require.Equal(t, 0, w.InUse())
	_, ok, _ = w.Alloc(4 * Granule)
	require.True(t, ok)
}

func TestFreeRejectsBogusRanges(t *testing.T) {
	w, _ := NewWindow(8 * Granule)
	a, _, _ := w.Alloc(2 * Granule)
	require.ErrorIs(t, w.Free(a+Granule, Granule), ErrNotAllocated, "inside a block")
	require.ErrorIs(t, w.Free(a, Granule), ErrNotAllocated, "ends inside a block")
	require.ErrorIs(t, w.Free(4*Granule, Granule), ErrNotAllocated, "never allocated")
	require.ErrorIs(t, w.Free(0, 0), ErrNotAllocated)
	require.ErrorIs(t, w.Free(7*Granule, 4*Granule), ErrNotAllocated, "past the end")
	require.NoError(t, w.Free(a, 2*Granule))
	require.ErrorIs(t, w.Free(a, 2*Granule), ErrNotAllocated, "double free")
}

func TestCoalescedFree(t *testing.T) {
	w, _ := NewWindow(8 * Granule)
	a, _, _ := w.Alloc(Granule)
	_, _, _ = w.Alloc(2 * Granule)
	_, _, _ = w.Alloc(Granule)
	require.NoError(t, w.Free(a, 4*Granule))
	require.Equal(t, 0, w.Outstanding())
	require.Equal(t, 0, w.InUse())
}

func TestWrapPadding(t *testing.T) {
	w, _ := NewWindow(4 * Granule)
	a, _, _ := w.Alloc(3 * Granule)
	require.NoError(t, w.Free(a, 3*Granule))
	// 2 granules do not fit in the last one: the allocation wraps to offset 0.
	b, ok, _ := w.Alloc(2 * Granule)
	require.True(t, ok)
	require.Equal(t, uint32(0), b)
	c, ok, _ := w.Alloc(2 * Granule)
	require.True(t, ok)
	require.Equal(t, uint32(2*Granule), c)
	_, ok, _ = w.Alloc(Granule)
	require.False(t, ok)
}

func TestWholeBufferAfterWrapWhenIdle(t *testing.T) {
	w, _ := NewWindow(16 * Granule)
	off, _, _ := w.Alloc(3 * Granule)
	require.NoError(t, w.Free(off, 3*Granule))
	off, ok, err := w.Alloc(16 * Granule)
	require.NoError(t, err)
	require.True(t, ok, "an idle window hands out the whole buffer")
	require.Equal(t, uint32(0), off)
}

// A randomized check against a byte map: no two outstanding reservations ever
// overlap, and everything freed eventually becomes allocatable again.
func TestWindowRandomized(t *testing.T) {
	seed := int64(20261121)
	rng := rand.New(rand.NewSource(seed))
	const size = 16 * Granule
	w, _ := NewWindow(size)
	owner := make([]int, size/Granule)
	type res struct{ off, n uint32 }
	var out []res
	for step := 0; step < 200000; step++ {
		if rng.Intn(2) == 0 && len(out) > 0 {
			i := rng.Intn(len(out))
			r := out[i]
			require.NoError(t, w.Free(r.off, r.n), "seed %d step %d", seed, step)
			for g := r.off / Granule; g < (r.off+r.n)/Granule; g++ {
				owner[g] = 0
			}
			out = append(out[:i], out[i+1:]...)
			continue
		}
		n := (1 + rng.Intn(4)) * Granule
		off, ok, err := w.Alloc(n)
		require.NoError(t, err)
		if !ok {
			continue
		}
		for g := off / Granule; g < (off+uint32(n))/Granule; g++ {
			require.Zero(t, owner[g], "seed %d step %d: overlap at granule %d", seed, step, g)
			owner[g] = step + 1
		}
		out = append(out, res{off, uint32(n)})
	}
	for _, r := range out {
		require.NoError(t, w.Free(r.off, r.n))
	}
	require.Equal(t, 0, w.InUse())
}

func BenchmarkAllocFree(b *testing.B) {
	w, _ := NewWindow(DefaultBufferBytes)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		off, _, _ := w.Alloc(128)
		_ = w.Free(off, 128)
	}
}

// BenchmarkAllocFreeCoalesced is the pattern of a one-way stream of small
// messages: 64-byte blocks allocated one at a time and freed sixteen at a
// time by one coalesced credit return. ns/op is per block.
func BenchmarkAllocFreeCoalesced(b *testing.B) {
	w, err := NewWindow(DefaultBufferBytes)
	require.NoError(b, err)
	b.ReportAllocs()
	for i := 0; i < b.N; i += 16 {
		var first uint32
		for j := 0; j < 16; j++ {
			off, ok, err := w.Alloc(Granule)
			if !ok || err != nil {
				b.Fatal(ok, err)
			}
			if j == 0 {
				first = off
			}
		}
		if err := w.Free(first, 16*Granule); err != nil {
			b.Fatal(err)
		}
	}
}

// TestWindowInOrderCoalescedRandomized drives the in-order path of Free
// (replies freeing the oldest blocks, several at a time) mixed with
// out-of-order frees and bogus ones (double frees, ranges ending inside a
// block or running past the outstanding blocks), which must fail and
// change nothing.
func TestWindowInOrderCoalescedRandomized(t *testing.T) {
	seed := int64(20261126)
	rng := rand.New(rand.NewSource(seed))
	const size = 32 * Granule
	w, _ := NewWindow(size)
	type res struct{ off, n uint32 }
	var out []res // outstanding, oldest first
	var gone []res
	for step := 0; step < 200000; step++ {
		switch op := rng.Intn(8); {
		case op < 3 && len(out) > 0:
			// Coalesce a run of the oldest blocks that are adjacent.
			k := 1
			for k < len(out) && k < 1+rng.Intn(6) && out[k].off == out[k-1].off+out[k-1].n {
				k++
			}
			n := out[k-1].off + out[k-1].n - out[0].off
			require.NoError(t, w.Free(out[0].off, n), "seed %d step %d", seed, step)
			gone = append(gone, out[:k]...)
			out = append([]res(nil), out[k:]...)
		case op == 3 && len(out) > 0:
			i := rng.Intn(len(out))
			require.NoError(t, w.Free(out[i].off, out[i].n), "seed %d step %d", seed, step)
			gone = append(gone, out[i])
			out = append(out[:i], out[i+1:]...)
		case op == 4 && len(gone) > 0:
			g := gone[rng.Intn(len(gone))]
			owned := false
			for _, r := range out {
				owned = owned || r.off == g.off
			}
			if !owned {
				inUse := w.InUse()
				require.ErrorIs(t, w.Free(g.off, g.n), ErrNotAllocated, "double free, seed %d step %d", seed, step)
				require.Equal(t, inUse, w.InUse())
			}
		case op == 5 && len(out) > 0 && out[0].n > Granule:
			inUse := w.InUse()
			require.ErrorIs(t, w.Free(out[0].off, out[0].n-Granule), ErrNotAllocated, "ends inside, seed %d step %d", seed, step)
			require.Equal(t, inUse, w.InUse())
		default:
			n := (1 + rng.Intn(3)) * Granule
			off, ok, err := w.Alloc(n)
			require.NoError(t, err)
			if ok {
				out = append(out, res{off, uint32(n)})
			}
		}
		if len(gone) > 64 {
			gone = gone[32:]
		}
	}
	for _, r := range out {
		require.NoError(t, w.Free(r.off, r.n))
	}
	require.Equal(t, 0, w.InUse())
	require.Equal(t, 0, w.Outstanding())
}

// A Window's memory follows the blocks outstanding at once, not its buffer:
// none before the first reservation, a small FIFO for a window of a few
// messages however often it turns over, and one block per granule only
// when that many are outstanding.
func TestWindowMemoryFollowsOutstanding(t *testing.T) {
	const size = 1 << 20
	w, err := NewWindow(size)
	require.NoError(t, err)
	require.Zero(t, cap(w.blocks), "an idle peer's window holds no blocks")
	var offs []uint32
	for round := 0; round < 10000; round++ {
		for len(offs) < 10 {
			off, ok, err := w.Alloc(2 * Granule)
			require.NoError(t, err)
			require.True(t, ok)
			offs = append(offs, off)
		}
		require.NoError(t, w.Free(offs[0], 2*Granule))
		offs = offs[1:]
	}
	require.Equal(t, minBlocks, cap(w.blocks))
	for _, off := range offs {
		require.NoError(t, w.Free(off, 2*Granule))
	}
	for i := 0; i < size/Granule; i++ {
		_, ok, err := w.Alloc(Granule)
		require.NoError(t, err)
		require.True(t, ok, "granule %d", i)
	}
	_, ok, err := w.Alloc(Granule)
	require.NoError(t, err)
	require.False(t, ok, "the buffer is full")
	require.Equal(t, size/Granule, cap(w.blocks))
	require.Equal(t, size/Granule, w.Outstanding())
}

// A free that joins the newest block to the oldest (their offsets adjacent
// across the buffer's start, as a receiver coalesces space it consumed in
// that order) is found by offset, not by FIFO order.
func TestFreeJoiningNewestToOldest(t *testing.T) {
	w, err := NewWindow(8 * Granule)
	require.NoError(t, err)
	alloc := func(want uint32) {
		t.Helper()
		off, ok, err := w.Alloc(Granule)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, want, off)
	}
	for i := uint32(0); i < 8; i++ {
		alloc(i * Granule)
	}
	require.NoError(t, w.Free(0, 4*Granule))
	for i := uint32(0); i < 4; i++ {
		alloc(i * Granule) // the next lap: the newest now ends where the oldest starts
	}
	require.NoError(t, w.Free(3*Granule, 2*Granule), "the newest block and the oldest, as one range")
	require.Equal(t, 6, w.Outstanding())
	require.Equal(t, 7*Granule, w.InUse(), "the oldest is freed: the tail moved past it")
	require.ErrorIs(t, w.Free(3*Granule, Granule), ErrNotAllocated, "freed twice")
	require.NoError(t, w.Free(5*Granule, 3*Granule))
	require.NoError(t, w.Free(0, 3*Granule))
	require.Zero(t, w.InUse())
}
