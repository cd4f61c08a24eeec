package mpiam

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A Waitall's batch returns each state to its own rank's cache, even when the
// requests of two ranks alternate in one slice, and more than a batch's worth
// of them all arrive.
func TestStateBatchReturnsToOwnRank(t *testing.T) {
	a, b := &proc{}, &proc{}
	var batch stateBatch
	const n = 3*len(batch.s) + 5
	for i := range n {
		p := a
		if i%2 == 1 {
			p = b
		}
		batch.add(&reqState{reqHot: reqHot{p: p, tag: i}})
	}
	batch.flush()
	require.Len(t, a.states.free, (n+1)/2)
	require.Len(t, b.states.free, n/2)
	for _, s := range append(a.states.free, b.states.free...) {
		require.True(t, s.p == nil && s.tag == 0, "a returned state is zeroed")
	}
	s, h := a.states.get(true)
	require.Same(t, s, h.s)
	require.Len(t, a.states.free, (n+1)/2-1, "a handle's state comes from the stack")
}
