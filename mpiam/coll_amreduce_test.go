package mpiam

import (
	"fmt"
	"github.com/amgo-hpc/amgo/handlers"
	"testing"

	"github.com/amgo-hpc/amgo/mpiam/internal/proto"
	"github.com/stretchr/testify/require"
)

// Small allreduces run over active messages: back to back without a
// barrier between them (a fast rank runs a call ahead of its partners, the
// case the two slots per step are for), with sizes on both sides of
// allreduceAMMax interleaved, on every network and at power-of-two and
// other sizes (fold-in and fold-out), at both thread levels. Every result is
// exact and alike on every rank. The shared-memory collectives are off:
// they would take these calls on one node.
func TestAllreduceOverActiveMessages(t *testing.T) {
	t.Setenv(EnvCollShm, "0")
	for _, n := range []int{2, 3, 4, 5, 6, 7} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			eachNetwork(t, n, func(r *rk, w *Comm) { checkSmallAllreduces(r, w) })
		})
	}
	t.Run("multiple", func(t *testing.T) {
		runJob(t, "shm", 3, Config{Thread: ThreadMultiple}, func(r *rk, w *Comm) { checkSmallAllreduces(r, w) })
	})
}

func checkSmallAllreduces(r *rk, w *Comm) {
	n, me := w.Size(), w.Rank()
	calls := 100
	if r.net == "sim" || r.net == "loop+sim" || r.net == "udp" {
		calls = 30
	}
	for i := 0; i < calls; i++ {
		k := 1 + i%5 // 8..40 bytes: over active messages
		if i%7 == 6 {
			k = allreduceAMMax/8 + 1 // just above: point to point
		}
		send := make([]int64, k)
		for j := range send {
			send[j] = int64((me+1)*(i+1) + j)
		}
		got := make([]int64, k)
		r.NoError(Allreduce(w, send, got, Sum[int64]()))
		for j := range got {
			want := int64(n*(n+1)/2*(i+1) + n*j)
			r.Equal(want, got[j], "call %d element %d", i, j)
		}
		m := []float64{float64(me*i%5) + 0.5}
		r.NoError(Allreduce(w, nil, m, Max[float64]()))
		best := 0.0
		for q := 0; q < n; q++ {
			best = max(best, float64(q*i%5)+0.5)
		}
		r.Equal(best, m[0], "call %d max", i)
	}
	want := 2*calls - calls/7
	if (coll{c: w}).nodeLevels() != nil {
		want = 0 // ranks on two nodes: the two-level algorithm
	}
	r.EqualValues(want, w.arCalls.Load(), "calls over active messages")
}

// A rank's slots: a message that finds its slot taken waits in the
// overflow list and moves in when the slot frees; past the list's bound
// the message is refused (the handler drops and counts it).
func TestAllreduceSlots(t *testing.T) {
	var s arState
	require.True(t, s.putLocked(1, 4, []byte{1}, handlers.Piggyback{}))
	require.True(t, s.putLocked(1, 6, []byte{3}, handlers.Piggyback{Value: 9, Set: true}), "same parity: overflow")
	require.True(t, s.putLocked(1, 5, []byte{2}, handlers.Piggyback{}))
	sl := s.slotLocked(1, 4)
	require.EqualValues(t, 5, sl.ready.Load())
	dst := make([]byte, 1)
	n, pb := s.takeLocked(1, 4, dst)
	require.Equal(t, 1, n)
	require.False(t, pb.Set)
	require.Equal(t, byte(1), dst[0])
	require.EqualValues(t, 7, sl.ready.Load(), "call 6 moved in")
	require.Empty(t, s.over)
	_, pb = s.takeLocked(1, 6, dst)
	require.Equal(t, handlers.Piggyback{Value: 9, Set: true}, pb, "the overflowed message's tool value moved in with it")
	require.Equal(t, byte(3), dst[0])
	require.Zero(t, sl.ready.Load())
	for i := 0; i < arMaxOver; i++ {
		require.True(t, s.putLocked(2, uint64(2*i), nil, handlers.Piggyback{}))
	}
	require.True(t, s.putLocked(2, 2*arMaxOver, nil, handlers.Piggyback{}), "the slot took the first, the list the rest")
	require.False(t, s.putLocked(2, 2*arMaxOver+2, nil, handlers.Piggyback{}), "list full")
}

// Malformed allreduce messages are refused by the parser: odd context, a
// step out of range, too much data, a wrong argument count.
func TestParseAllreduceAM(t *testing.T) {
	a0, a1 := proto.AllreduceAM{Context: 4, Step: 3, Call: 9}.Args()
	m, err := proto.ParseAllreduceAM([]uint64{a0, a1}, 8, allreduceAMMax)
	require.NoError(t, err)
	require.Equal(t, proto.AllreduceAM{Context: 4, Step: 3, Call: 9}, m)
	for _, bad := range []struct {
		a []uint64
		n int
	}{
		{[]uint64{5, 0}, 8},
		{[]uint64{uint64(proto.MaxAllreduceSteps) << 32, 0}, 8},
		{[]uint64{a0, a1}, allreduceAMMax + 1},
		{[]uint64{a0}, 8},
	} {
		_, err := proto.ParseAllreduceAM(bad.a, bad.n, allreduceAMMax)
		require.ErrorIs(t, err, proto.ErrMalformed, "%v", bad)
	}
}
