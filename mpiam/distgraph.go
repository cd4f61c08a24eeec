package mpiam

import (
	"cmp"
	"fmt"
	"slices"
)

// DistGraphCreate makes a communicator with a distributed graph topology
// whose edges any rank may name (MPI_Dist_graph_create, MPI-4.1 §8.5.4):
// this rank names, for each i, degrees[i] edges from sources[i] to the
// next degrees[i] entries of destinations, with those entries of weights
// (nil: unweighted). Every edge is delivered to both its ends; each rank's
// sources and destinations (DistGraphNeighbors) are then its in- and
// out-edges ordered by who named them (rank, then position), the same order
// at both ends, so the k-th message of a neighborhood collective between
// two ranks travels the k-th edge between them. The graph has weights when
// any rank passed them (edges without get weight 1). reorder is accepted
// and not used. Collective over c. Errors, on every rank when one rank
// passed bad arguments: ErrArg for lengths that do not agree or a negative
// degree, ErrRank for a rank outside c.
func (c *Comm) DistGraphCreate(sources, degrees, destinations, weights []int, reorder bool) (*Comm, error) {
	if c.hooked() {
		var d *Comm
		err := c.p.hookErr(&Event{Call: CallDistGraphCreate, Comm: c}, func() (err error) {
			d, err = c.distGraphCreate(sources, degrees, destinations, weights)
			return err
		})
		return d, err
	}
	return c.distGraphCreate(sources, degrees, destinations, weights)
}

// An edge on the wire: who named it (rank, position), its two ends, its
// weight and whether it had one.
const edgeWords = 6

func (c *Comm) distGraphCreate(sources, degrees, destinations, weights []int) (*Comm, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	var bad error
	total := 0
	switch {
	case len(degrees) != len(sources):
		bad = fmt.Errorf("%w: DistGraphCreate with %d sources and %d degrees", ErrArg, len(sources), len(degrees))
	case weights != nil && len(weights) != len(destinations):
		bad = fmt.Errorf("%w: DistGraphCreate with %d destinations and %d weights", ErrArg, len(destinations), len(weights))
	}
	for i := 0; bad == nil && i < len(degrees); i++ {
		if degrees[i] < 0 {
			bad = fmt.Errorf("%w: DistGraphCreate degree %d of source %d is negative", ErrArg, degrees[i], i)
		}
		total += degrees[i]
	}
	if bad == nil && total != len(destinations) {
		bad = fmt.Errorf("%w: DistGraphCreate degrees add up to %d, with %d destinations", ErrArg, total, len(destinations))
	}
	for _, r := range append(slices.Clone(sources), destinations...) {
		if bad == nil && (r < 0 || r >= c.size) {
			bad = fmt.Errorf("%w: DistGraphCreate names rank %d (communicator has %d ranks)", ErrRank, r, c.size)
		}
	}
	// Each edge goes to both of its ends.
	counts := make([]int, c.size)
	var edges [][edgeWords]int64
	if bad == nil {
		k := 0
		for i, src := range sources {
			for range degrees[i] {
				w, has := int64(1), int64(0)
				if weights != nil {
					w, has = int64(weights[k]), 1
				}
				edges = append(edges, [edgeWords]int64{int64(c.rank), int64(k), int64(src), int64(destinations[k]), w, has})
				k++
			}
		}
		for _, e := range edges {
			counts[e[2]] += edgeWords
			if e[3] != e[2] {
				counts[e[3]] += edgeWords
			}
		}
	}
	displs := make([]int, c.size)
	for q := 1; q < c.size; q++ {
		displs[q] = displs[q-1] + counts[q-1]
	}
	send := make([]int64, displs[c.size-1]+counts[c.size-1])
	at := slices.Clone(displs)
	for _, e := range edges {
		copy(send[at[e[2]]:], e[:])
		at[e[2]] += edgeWords
		if e[3] != e[2] {
			copy(send[at[e[3]]:], e[:])
			at[e[3]] += edgeWords
		}
	}
	flag := int64(0)
	if bad != nil {
		flag = 1
	}
	if weights != nil {
		flag |= 2
	}
	// Agree on failure and weights, then exchange the counts and the edges.
	x, err := c.startColl(CallAllreduce, false)
	if err != nil {
		return nil, err
	}
	agreed := make([]int64, 1)
	if err := allreduce(x, []int64{flag}, agreed, BOr[int64]()); err != nil {
		return nil, err
	}
	if agreed[0]&1 != 0 {
		if bad != nil {
			return nil, bad
		}
		return nil, fmt.Errorf("%w: DistGraphCreate: another rank passed bad arguments", ErrArg)
	}
	rcounts := make([]int, c.size)
	if x, err = c.startColl(CallAlltoall, false); err != nil {
		return nil, err
	}
	c64 := make([]int64, c.size)
	for q, n := range counts {
		c64[q] = int64(n)
	}
	r64 := make([]int64, c.size)
	if err := alltoall(x, c64, r64); err != nil {
		return nil, err
	}
	rdispls := make([]int, c.size)
	for q, n := range r64 {
		rcounts[q] = int(n)
		if q > 0 {
			rdispls[q] = rdispls[q-1] + rcounts[q-1]
		}
	}
	recv := make([]int64, rdispls[c.size-1]+rcounts[c.size-1])
	if x, err = c.startColl(CallAlltoallv, false); err != nil {
		return nil, err
	}
	if err := alltoallPairwise(x, send, counts, displs, recv, rcounts, rdispls); err != nil {
		return nil, err
	}
	got := make([][edgeWords]int64, len(recv)/edgeWords)
	for i := range got {
		copy(got[i][:], recv[i*edgeWords:])
	}
	slices.SortFunc(got, func(a, b [edgeWords]int64) int {
		return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
	})
	g := &graphTopo{}
	weighted := agreed[0]&2 != 0
	for _, e := range got {
		if int(e[3]) == c.rank { // an in-edge
			g.sources = append(g.sources, int(e[2]))
			if weighted {
				g.sourceWeights = append(g.sourceWeights, int(e[4]))
			}
		}
		if int(e[2]) == c.rank { // an out-edge
			g.dests = append(g.dests, int(e[3]))
			if weighted {
				g.destWeights = append(g.destWeights, int(e[4]))
			}
		}
	}
	if weighted {
		// Weighted with no edge here: empty, not nil, lists.
		g.sourceWeights = append(make([]int, 0, len(g.sources)), g.sourceWeights...)
		g.destWeights = append(make([]int, 0, len(g.dests)), g.destWeights...)
	}
	d, err := c.dup()
	if err != nil {
		return nil, err
	}
	d.graph = g
	return d, nil
}
