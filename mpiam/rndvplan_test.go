package mpiam

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The rendezvous plan for every kind of network and size (docs/mpi.md,
// "Rendezvous protocol").
func TestPlanTransfer(t *testing.T) {
	const split = 128 << 10
	for _, c := range []struct {
		n            int
		offered, get bool
		split        int
		want         transferPlan
	}{
		// Networks without a get (tcp, udp, sim) or no address offered: store.
		{n: 64 << 10, want: transferPlan{push: 64 << 10, cts: true, recvParts: 1}},
		{n: 64 << 10, offered: true, want: transferPlan{push: 64 << 10, cts: true, recvParts: 1}},
		{n: 64 << 10, get: true, want: transferPlan{push: 64 << 10, cts: true, recvParts: 1}},
		{n: 0, want: transferPlan{push: 0, cts: true, recvParts: 1}}, // a fin, no store
		// A get: the receiver pulls everything below the split size.
		{n: 64 << 10, offered: true, get: true, split: split, want: transferPlan{pull: true, recvParts: 1}},
		{n: 0, offered: true, get: true, split: split, want: transferPlan{pull: true, recvParts: 1}},
		{n: 1 << 20, offered: true, get: true, split: 0, want: transferPlan{pull: true, recvParts: 1}},
		// From the split size on, both sides copy half.
		{n: split, offered: true, get: true, split: split,
			want: transferPlan{push: 64 << 10, pull: true, cts: true, more: true, recvParts: 2}},
		{n: 1<<20 + 5000, offered: true, get: true, split: split,
			want: transferPlan{push: 512<<10 + 0, pull: true, cts: true, more: true, recvParts: 2}},
		// A half below 4 KiB rounds to nothing: a plain pull.
		{n: 6000, offered: true, get: true, split: 4096, want: transferPlan{pull: true, recvParts: 1}},
		{n: 9000, offered: true, get: true, split: 4096,
			want: transferPlan{push: 4096, pull: true, cts: true, more: true, recvParts: 2}},
	} {
		t.Run(fmt.Sprintf("n=%d/offered=%v/get=%v/split=%d", c.n, c.offered, c.get, c.split), func(t *testing.T) {
			got := planTransfer(c.n, c.offered, c.get, c.split)
			require.Equal(t, c.want, got)
			// Invariants: every byte moves exactly once, by one side or both.
			if got.pull {
				require.LessOrEqual(t, got.push, c.n)
			} else {
				require.Equal(t, c.n, got.push)
			}
			require.Equal(t, got.cts, got.push > 0 || !got.pull, "a clear-to-send exactly when the sender has something to do")
			require.Equal(t, got.more, got.cts && got.pull)
		})
	}
}
