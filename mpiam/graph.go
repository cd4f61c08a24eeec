package mpiam

import (
	"fmt"
	"slices"
)

// generalGraph is a GraphCreate topology: the whole graph, as MPI gives it
// (index[i] is the end of node i's entries in edges).
type generalGraph struct {
	index, edges []int
	symmetric    bool // every edge a-b has as many copies b-a
}

func (g *generalGraph) neighbors(r int) []int {
	lo := 0
	if r > 0 {
		lo = g.index[r-1]
	}
	return g.edges[lo:g.index[r]]
}

// GraphCreate makes a communicator with a graph topology that every rank
// passes whole (MPI_Graph_create, MPI-4.1 §8.5.3): node i's neighbors are
// edges[index[i-1]:index[i]] (edges[0:index[0]] for node 0), the nodes are
// the first len(index) ranks of c in c's order, and the other ranks get nil.
// reorder is accepted and not used. Neighborhood collectives on the result
// take each rank's neighbors both as sources and as destinations, so they
// need a symmetric graph (they fail with ErrTopology otherwise). Collective
// over c. Errors: ErrArg for an index that decreases or does not end at
// len(edges), ErrRank for a neighbor outside the graph, ErrDims for more
// nodes than c has ranks, ErrNotSame when the ranks passed different graphs.
func (c *Comm) GraphCreate(index, edges []int, reorder bool) (*Comm, error) {
	if c.hooked() {
		var d *Comm
		err := c.p.hookErr(&Event{Call: CallGraphCreate, Comm: c}, func() (err error) { d, err = c.graphCreate(index, edges); return err })
		return d, err
	}
	return c.graphCreate(index, edges)
}

func (c *Comm) graphCreate(index, edges []int) (*Comm, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	// Bad arguments are reported after the collective step, so that every
	// rank takes it whatever another rank passed.
	n := len(index)
	var bad error
	prev := 0
	for i, e := range index {
		if e < prev && bad == nil {
			bad = fmt.Errorf("%w: GraphCreate index[%d] = %d is below index[%d] = %d", ErrArg, i, e, i-1, prev)
		}
		prev = max(prev, e)
	}
	switch {
	case n > c.size:
		bad = fmt.Errorf("%w: GraphCreate of %d nodes on a communicator of %d ranks", ErrDims, n, c.size)
	case bad == nil && prev != len(edges):
		bad = fmt.Errorf("%w: GraphCreate index ends at %d, with %d edges", ErrArg, prev, len(edges))
	}
	for _, e := range edges {
		if bad == nil && (e < 0 || e >= n) {
			bad = fmt.Errorf("%w: GraphCreate edge to node %d of %d", ErrRank, e, n)
		}
	}
	color := 0
	if c.rank >= n || bad != nil {
		color = Undefined
	}
	d, err := c.splitAgreeing(color, c.rank, graphSig(index, edges), "GraphCreate graph")
	if bad != nil {
		return nil, bad
	}
	if err != nil || d == nil {
		return nil, err
	}
	g := &generalGraph{index: slices.Clone(index), edges: slices.Clone(edges), symmetric: true}
	count := map[[2]int]int{}
	for a := range n {
		for _, b := range g.neighbors(a) {
			count[[2]int{a, b}]++
		}
	}
	for k, v := range count {
		if count[[2]int{k[1], k[0]}] != v {
			g.symmetric = false
		}
	}
	d.ggraph = g
	return d, nil
}

// graphSig is a signature of a graph for checking that every rank passed
// the same one.
func graphSig(index, edges []int) int64 {
	h := uint64(14695981039346656037) // FNV-1a over both lists
	for _, l := range [][]int{index, {-1}, edges} {
		for _, v := range l {
			u := uint64(v)
			for range 8 {
				h ^= u & 0xff
				h *= 1099511628211
				u >>= 8
			}
		}
	}
	return int64(h >> 1)
}

func (c *Comm) ggraphOf(call string) (*generalGraph, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	if c.ggraph == nil {
		return nil, fmt.Errorf("%w: %s on a communicator without a graph topology (GraphCreate)", ErrTopology, call)
	}
	return c.ggraph, nil
}

// GraphdimsGet returns the number of nodes and of edges of c's graph
// (MPI_Graphdims_get, MPI-4.1 §8.5.5). Errors: ErrComm, ErrTopology when c
// has no GraphCreate topology.
func (c *Comm) GraphdimsGet() (nnodes, nedges int, err error) {
	g, err := c.ggraphOf("GraphdimsGet")
	if err != nil {
		return 0, 0, err
	}
	return len(g.index), len(g.edges), nil
}

// GraphGet returns c's graph as GraphCreate took it (MPI_Graph_get, MPI-4.1
// §8.5.5), as fresh slices. Errors: ErrComm, ErrTopology when c has no
// GraphCreate topology.
func (c *Comm) GraphGet() (index, edges []int, err error) {
	g, err := c.ggraphOf("GraphGet")
	if err != nil {
		return nil, nil, err
	}
	return slices.Clone(g.index), slices.Clone(g.edges), nil
}

// GraphNeighbors returns the neighbors of rank r in c's graph, in the
// order given (MPI_Graph_neighbors, MPI-4.1 §8.5.5); GraphNeighborsCount
// is their number. Errors: ErrComm, ErrTopology when c has no GraphCreate
// topology, ErrRank for r outside the graph.
func (c *Comm) GraphNeighbors(r int) ([]int, error) {
	g, err := c.ggraphOf("GraphNeighbors")
	if err != nil {
		return nil, err
	}
	if r < 0 || r >= len(g.index) {
		return nil, fmt.Errorf("%w: GraphNeighbors of rank %d in a graph of %d nodes", ErrRank, r, len(g.index))
	}
	return slices.Clone(g.neighbors(r)), nil
}

// GraphNeighborsCount returns the number of neighbors of rank r in c's
// graph (MPI_Graph_neighbors_count, MPI-4.1 §8.5.5). Errors as
// GraphNeighbors'.
func (c *Comm) GraphNeighborsCount(r int) (int, error) {
	nb, err := c.GraphNeighbors(r)
	return len(nb), err
}
