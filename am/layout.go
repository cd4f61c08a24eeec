package am

import (
	"fmt"

	"github.com/amgo-hpc/amgo/am/transport"
)

// The job's layout: which ranks share a node (GASNet-EX calls such a set a
// neighbourhood: ranks that can share memory). Package job learns it at
// start-up; MPI's CommSplitType with CommTypeShared and the node-aware
// collectives read it.

// SetLayout records that rank r runs on node node[r] (nodes numbered 0, 1,
// ... by their lowest rank, as package job's Layout does). Set it before
// communication starts. Errors: ErrConfig for a slice of the wrong length or
// a negative node.
func (ep *Endpoint) SetLayout(node []int) error {
	if len(node) != ep.size {
		return fmt.Errorf("%w: layout of %d ranks for a job of %d", ErrConfig, len(node), ep.size)
	}
	for r, k := range node {
		if k < 0 {
			return fmt.Errorf("%w: rank %d on node %d", ErrConfig, r, k)
		}
	}
	ep.layout = append([]int(nil), node...)
	return nil
}

// Node is the node that rank runs on (0 when no layout was set: one node;
// -1 for a rank out of range). Ranks with the same Node share memory.
func (ep *Endpoint) Node(rank int) int {
	if uint(rank) >= uint(ep.size) {
		return -1
	}
	if ep.layout == nil {
		return 0
	}
	return ep.layout[rank]
}

// layoutOf is the layout a transport knows, if it knows one
// (transport.Layouter: package route's in-process jobs).
func layoutOf(tr transport.Transport) []int {
	if l, ok := tr.(transport.Layouter); ok {
		return l.Layout()
	}
	return nil
}
