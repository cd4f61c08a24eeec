package mpiam

import (
	"fmt"
	"slices"
	"sync"

	"github.com/amgo-hpc/amgo/mpiam/internal/sched"
)

// graphTopo is a distributed graph topology: this rank's in-neighbors
// (sources) and out-neighbors (destinations), with their weights (nil:
// unweighted).
type graphTopo struct {
	sources, sourceWeights []int
	dests, destWeights     []int
}

// DistGraphCreateAdjacent makes a communicator with a distributed graph
// topology in which each rank names its own neighbors (MPI_Dist_graph_
// create_adjacent, MPI-4.1 §8.5.4): sources are the ranks of c it receives
// from, destinations the ranks it sends to, in the order neighborhood
// collectives use them; a rank may appear more than once (a multigraph).
// sourceWeights and destWeights give each edge a weight, or are nil
// (MPI_UNWEIGHTED); weights are hints that amgo keeps and returns but does
// not use. reorder is accepted and not used: ranks keep their places.
// Collective over c. The graph must be consistent (r lists q among its
// destinations as often as q lists r among its sources): it is checked,
// with an all-to-all of edge counts, and every rank gets ErrTopology when it
// is not. Errors: ErrRank for a neighbor outside c, ErrArg for weights of
// the wrong length, ErrTopology for an inconsistent graph.
func (c *Comm) DistGraphCreateAdjacent(sources, sourceWeights, destinations, destWeights []int, reorder bool) (*Comm, error) {
	if c.hooked() {
		var d *Comm
		err := c.p.hookErr(&Event{Call: CallDistGraphCreateAdjacent, Comm: c}, func() (err error) {
			d, err = c.distGraphCreateAdjacent(sources, sourceWeights, destinations, destWeights)
			return err
		})
		return d, err
	}
	return c.distGraphCreateAdjacent(sources, sourceWeights, destinations, destWeights)
}

func (c *Comm) distGraphCreateAdjacent(sources, sourceWeights, destinations, destWeights []int) (*Comm, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	// Bad arguments are reported after the collective steps below, so that
	// every rank takes them whatever another rank passed.
	var bad error
	for _, l := range []struct {
		what   string
		ranks  []int
		weight []int
	}{{"source", sources, sourceWeights}, {"destination", destinations, destWeights}} {
		for _, r := range l.ranks {
			if r < 0 || r >= c.size {
				bad = fmt.Errorf("%w: %s %d of DistGraphCreateAdjacent (communicator has %d ranks)", ErrRank, l.what, r, c.size)
			}
		}
		if l.weight != nil && len(l.weight) != len(l.ranks) {
			bad = fmt.Errorf("%w: %d %s weights for %d %ss", ErrArg, len(l.weight), l.what, len(l.ranks), l.what)
		}
	}
	// out[q] - in[q] per peer, exchanged: rank q receives what this rank
	// sends it and compares with the sources it listed.
	diff := make([]int64, c.size)
	if bad == nil {
		for _, q := range destinations {
			diff[q]++
		}
	}
	got := make([]int64, c.size)
	x, err := c.startColl(CallAlltoall, false)
	if err != nil {
		return nil, err
	}
	if err := alltoall(x, diff, got); err != nil {
		return nil, err
	}
	ok := int64(1)
	if bad != nil {
		ok = 0
	} else {
		for _, q := range sources {
			got[q]--
		}
		for _, v := range got {
			if v != 0 {
				ok = 0
			}
		}
	}
	all := make([]int64, 1)
	if x, err = c.startColl(CallAllreduce, false); err != nil {
		return nil, err
	}
	if err := allreduce(x, []int64{ok}, all, Min[int64]()); err != nil {
		return nil, err
	}
	d, err := c.dup()
	if err != nil {
		return nil, err
	}
	if bad != nil || all[0] == 0 {
		_ = d.free()
		if bad != nil {
			return nil, bad
		}
		return nil, fmt.Errorf("%w: DistGraphCreateAdjacent: the ranks' sources and destinations do not match (an edge named by one end only)", ErrTopology)
	}
	d.graph = &graphTopo{sources: slices.Clone(sources), sourceWeights: slices.Clone(sourceWeights),
		dests: slices.Clone(destinations), destWeights: slices.Clone(destWeights)}
	return d, nil
}

// DistGraphNeighborsCount returns the number of in-neighbors (sources) and
// out-neighbors (destinations) of the calling rank, and whether the graph
// has weights (MPI_Dist_graph_neighbors_count, MPI-4.1 §8.5.5). Errors:
// ErrComm, ErrTopology when c has no distributed graph topology.
func (c *Comm) DistGraphNeighborsCount() (indegree, outdegree int, weighted bool, err error) {
	g, err := c.graphOf("DistGraphNeighborsCount")
	if err != nil {
		return 0, 0, false, err
	}
	return len(g.sources), len(g.dests), g.sourceWeights != nil || g.destWeights != nil, nil
}

// DistGraphNeighbors returns the calling rank's in-neighbors and
// out-neighbors, as it gave them, with their weights (nil when unweighted)
// (MPI_Dist_graph_neighbors, MPI-4.1 §8.5.5), as fresh slices. Errors:
// ErrComm, ErrTopology when c has no distributed graph topology.
func (c *Comm) DistGraphNeighbors() (sources, sourceWeights, destinations, destWeights []int, err error) {
	g, err := c.graphOf("DistGraphNeighbors")
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return slices.Clone(g.sources), slices.Clone(g.sourceWeights), slices.Clone(g.dests), slices.Clone(g.destWeights), nil
}

func (c *Comm) graphOf(call string) (*graphTopo, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	if c.graph == nil {
		return nil, fmt.Errorf("%w: %s on a communicator without a distributed graph topology", ErrTopology, call)
	}
	return c.graph, nil
}

// neighbors returns the ranks a neighborhood collective on c receives from
// and sends to, in order (MPI-4.1 §8.6): a distributed graph's sources and
// destinations; a GraphCreate graph's neighbors of this rank, both ways
// (the graph must be symmetric); on a Cartesian grid, for each dimension the rank below and
// the rank above (CartShift(d, 1)), ProcNull past a non-periodic edge, for
// both lists. Errors: ErrTopology when c has no topology.
func (c *Comm) neighbors() (in, out []int, err error) {
	if err := c.valid(); err != nil {
		return nil, nil, err
	}
	switch {
	case c.graph != nil:
		return c.graph.sources, c.graph.dests, nil
	case c.ggraph != nil:
		if !c.ggraph.symmetric {
			return nil, nil, fmt.Errorf("%w: a neighborhood collective on a GraphCreate graph that is not symmetric (an edge a-b without b-a)", ErrTopology)
		}
		nb := c.ggraph.neighbors(c.rank)
		return nb, nb, nil
	case c.cart != nil:
		nb := c.cart.neighbors()
		return nb, nb, nil
	}
	return nil, nil, fmt.Errorf("%w: a neighborhood collective on a communicator without a topology", ErrTopology)
}

// NeighborAllgather sends send to every out-neighbor of the calling rank and
// receives the i-th in-neighbor's send into block i of recv
// (MPI_Neighbor_allgather, MPI-4.1 §8.6.1): len(recv) = indegree ×
// len(send), every rank sending the same count. The neighbors are those of
// c's distributed graph, or on a Cartesian grid the two neighbors along each
// dimension, below then above (a ProcNull neighbor's block is left as it
// is). Collective over c. Errors: ErrComm, ErrTopology when c has no
// topology, ErrCount for a recv of the wrong length, ErrTruncate when a
// neighbor sent another count, ErrType for element types that hold
// pointers.
func NeighborAllgather[T any](c *Comm, send, recv []T) error {
	if err := plain[T](); err != nil {
		return err
	}
	return c.runColl(CallNeighborAllgather, AnySource, len(raw(send)), func(x coll) error { return neighborAllgather(c, x, nil, send, recv) })
}

func neighborAllgather[T any](c *Comm, x coll, b *sched.Builder, send, recv []T) error {
	in, out, err := c.neighbors()
	if err != nil {
		return err
	}
	k := len(send)
	if len(recv) != len(in)*k {
		return fmt.Errorf("%w: NeighborAllgather of %d elements from %d in-neighbors into %d", ErrCount, k, len(in), len(recv))
	}
	return neighborExchangeEven(x, b, in, out, send, recv, k, true)
}

// NeighborAlltoall sends block i of send to the i-th out-neighbor and
// receives the i-th in-neighbor's block into block i of recv
// (MPI_Neighbor_alltoall, MPI-4.1 §8.6.2): len(send) = outdegree × k and
// len(recv) = indegree × k for one block size k on every rank. Neighbors as
// for NeighborAllgather. Collective over c. Errors: ErrComm, ErrTopology
// when c has no topology, ErrCount for lengths that do not fit the
// neighbors, ErrTruncate when a neighbor sent another count, ErrType for
// element types that hold pointers.
func NeighborAlltoall[T any](c *Comm, send, recv []T) error {
	if err := plain[T](); err != nil {
		return err
	}
	return c.runColl(CallNeighborAlltoall, AnySource, len(raw(send)), func(x coll) error { return neighborAlltoall(c, x, nil, send, recv) })
}

func neighborAlltoall[T any](c *Comm, x coll, b *sched.Builder, send, recv []T) error {
	in, out, err := c.neighbors()
	if err != nil {
		return err
	}
	var k int
	switch {
	case len(out) > 0:
		k = len(send) / len(out)
	case len(in) > 0:
		k = len(recv) / len(in)
	}
	if len(send) != len(out)*k || len(recv) != len(in)*k {
		return fmt.Errorf("%w: NeighborAlltoall of %d elements to %d out-neighbors and %d from %d in-neighbors (one block size for all)",
			ErrCount, len(send), len(out), len(recv), len(in))
	}
	return neighborExchangeEven(x, b, in, out, send, recv, k, false)
}

// neighborExchange posts a receive of rblocks[i] from in[i] for every i,
// sends sblocks[i] to out[i] for every i, and waits for the receives;
// ProcNull neighbors are skipped. Messages between one pair of ranks match
// in the order of the lists (MPI's non-overtaking order), which is what a
// multigraph's repeated edges need; the receives are posted in recvOrder. A block with a layout (datatypes that
// are not one run of bytes) is packed into its message and unpacked from
// it, with no staging copy.
func (x coll) neighborExchange(s *nbScratch, in []int, rblocks []typedArg, out []int, sblocks []typedArg) error {
	in, rblocks = x.c.recvOrder(s, in, rblocks)
	cc := x.cc
	reqs := s.reqs[:0]
	defer func() {
		for _, rr := range reqs {
			cc.p.states.put(rr)
		}
		s.reqs = reqs
	}()
	var first error
	for i, src := range in {
		if src == ProcNull {
			continue
		}
		src = x.peer(src)
		if err := cc.checkRecv(src, x.tag); err != nil {
			first = err
			break
		}
		rr, _ := cc.newRecv(rblocks[i].mem, src, x.tag, false)
		rr.lay = rblocks[i].lay
		if err := cc.p.startRecv(rr); err != nil {
			cc.p.states.put(rr)
			first = err
			break
		}
		reqs = append(reqs, rr)
	}
	for i, dst := range out {
		if first != nil {
			break
		}
		if dst == ProcNull {
			continue
		}
		if sb := sblocks[i]; sb.lay != nil {
			first = cc.sendLay(sb.mem, sb.lay, msgType{}, x.peer(dst), x.tag, Standard)
		} else {
			first = x.send(sb.mem, dst, 0)
		}
	}
	k := 0
	for i, src := range in {
		if src == ProcNull {
			continue
		}
		if k >= len(reqs) {
			break
		}
		rr := reqs[k]
		k++
		if first != nil {
			_ = rr.cancel()
		}
		st, err := rr.wait()
		x.observe(st)
		if want := rblocks[i].n(); err == nil && first == nil && st.Bytes != want {
			err = fmt.Errorf("%w: neighborhood collective expected %d bytes from rank %d, got %d (arguments differ across ranks?)",
				ErrTruncate, want, src, st.Bytes)
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// NeighborAllgatherv is NeighborAllgather with a count and displacement (in
// elements of recv) per in-neighbor (MPI_Neighbor_allgatherv, MPI-4.1
// §8.6.1): the i-th in-neighbor's send lands in recv[displs[i]:
// displs[i]+counts[i]], and send's length may differ between ranks.
// Collective over c. Errors: ErrComm, ErrTopology when c has no topology,
// ErrCount when counts and displs do not have one entry per in-neighbor or
// a block lies outside recv, ErrTruncate when a neighbor sent another
// count, ErrType for element types that hold pointers.
func NeighborAllgatherv[T any](c *Comm, send, recv []T, counts, displs []int) error {
	if err := plain[T](); err != nil {
		return err
	}
	return c.runColl(CallNeighborAllgatherv, AnySource, len(raw(send)), func(x coll) error { return neighborAllgatherv(c, x, nil, send, recv, counts, displs) })
}

func neighborAllgatherv[T any](c *Comm, x coll, b *sched.Builder, send, recv []T, counts, displs []int) error {
	in, out, err := c.neighbors()
	if err != nil {
		return err
	}
	if err := checkV(len(in), len(recv), counts, displs, "NeighborAllgatherv"); err != nil {
		return err
	}
	s := newNbScratch(b)
	defer s.release()
	for i := range in {
		s.rblocks = append(s.rblocks, typedArg{mem: raw(recv[displs[i] : displs[i]+counts[i]])})
	}
	for range out {
		s.sblocks = append(s.sblocks, typedArg{mem: raw(send)})
	}
	return x.neighborBlocks(b, s, in, out)
}

// NeighborAlltoallv is NeighborAlltoall with a count and displacement (in
// elements) per neighbor (MPI_Neighbor_alltoallv, MPI-4.1 §8.6.2): the
// block send[sdispls[i]:sdispls[i]+scounts[i]] goes to the i-th
// out-neighbor, and the i-th in-neighbor's block lands in
// recv[rdispls[i]:rdispls[i]+rcounts[i]]. Collective over c. Errors:
// ErrComm, ErrTopology when c has no topology, ErrCount when the counts and
// displacements do not have one entry per neighbor or a block lies outside
// its buffer, ErrTruncate when a neighbor sent another count, ErrType for
// element types that hold pointers.
func NeighborAlltoallv[T any](c *Comm, send []T, scounts, sdispls []int, recv []T, rcounts, rdispls []int) error {
	if err := plain[T](); err != nil {
		return err
	}
	return c.runColl(CallNeighborAlltoallv, AnySource, len(raw(send)), func(x coll) error {
		return neighborAlltoallv(c, x, nil, send, scounts, sdispls, recv, rcounts, rdispls)
	})
}

func neighborAlltoallv[T any](c *Comm, x coll, b *sched.Builder, send []T, scounts, sdispls []int, recv []T, rcounts, rdispls []int) error {
	in, out, err := c.neighbors()
	if err != nil {
		return err
	}
	if err := checkV(len(out), len(send), scounts, sdispls, "NeighborAlltoallv send"); err != nil {
		return err
	}
	if err := checkV(len(in), len(recv), rcounts, rdispls, "NeighborAlltoallv receive"); err != nil {
		return err
	}
	return neighborExchangeV(x, b, in, out, send, scounts, sdispls, recv, rcounts, rdispls)
}

// evenBlocks is n consecutive blocks of k elements.
func evenBlocks(n, k int) (counts, displs []int) {
	counts, displs = make([]int, n), make([]int, n)
	for i := range n {
		counts[i], displs[i] = k, i*k
	}
	return counts, displs
}

// neighborExchangeV is neighborExchange of the blocks of send and recv that
// the (checked) counts and displacements name, one per neighbor; with b,
// it adds the exchange to b's schedule instead.
func neighborExchangeV[T any](x coll, b *sched.Builder, in, out []int, send []T, scounts, sdispls []int, recv []T, rcounts, rdispls []int) error {
	s := newNbScratch(b)
	defer s.release()
	for i := range in {
		s.rblocks = append(s.rblocks, typedArg{mem: raw(recv[rdispls[i] : rdispls[i]+rcounts[i]])})
	}
	for i := range out {
		s.sblocks = append(s.sblocks, typedArg{mem: raw(send[sdispls[i] : sdispls[i]+scounts[i]])})
	}
	return x.neighborBlocks(b, s, in, out)
}

// neighborExchangeEven is neighborExchangeV with blocks of k elements:
// the i-th out-neighbor's is send's block i, or all of send when same (an
// allgather); the i-th in-neighbor's lands in recv's block i.
func neighborExchangeEven[T any](x coll, b *sched.Builder, in, out []int, send, recv []T, k int, same bool) error {
	s := newNbScratch(b)
	defer s.release()
	for i := range in {
		s.rblocks = append(s.rblocks, typedArg{mem: raw(recv[i*k : (i+1)*k])})
	}
	for i := range out {
		blk := send
		if !same {
			blk = send[i*k : (i+1)*k]
		}
		s.sblocks = append(s.sblocks, typedArg{mem: raw(blk)})
	}
	return x.neighborBlocks(b, s, in, out)
}

// neighborBlocks exchanges s's blocks with the neighbors (neighborExchange),
// or with b adds the exchange to b's schedule.
func (x coll) neighborBlocks(b *sched.Builder, s *nbScratch, in, out []int) error {
	if b != nil {
		neighborSchedule(b, x.c, in, s.rblocks, out, s.sblocks)
		return nil
	}
	return x.neighborExchange(s, in, s.rblocks, out, s.sblocks)
}

// nbScratch is the working memory of a neighborhood collective's exchange:
// its blocks, the receives in recvOrder and their states. A blocking call
// takes one from nbScratchPool and returns it, so that a halo exchange
// repeated every step allocates nothing (five allocations a call before);
// a nonblocking one, whose schedule keeps the blocks, gets its own.
type nbScratch struct {
	sblocks, rblocks []typedArg
	rin              []int      // in-neighbors in recvOrder
	rord             []typedArg // their blocks
	reqs             []*reqState
	pooled           bool // from nbScratchPool, to which release returns it
}

var nbScratchPool = sync.Pool{New: func() any { return &nbScratch{pooled: true} }}

// newNbScratch is a pooled scratch for a blocking call (b nil), a new one
// for a schedule (b not nil).
func newNbScratch(b *sched.Builder) *nbScratch {
	if b != nil {
		return &nbScratch{}
	}
	return nbScratchPool.Get().(*nbScratch)
}

// release returns a pooled scratch, holding no user buffer or state.
func (s *nbScratch) release() {
	if !s.pooled {
		return
	}
	clear(s.sblocks)
	clear(s.rblocks)
	clear(s.rord)
	clear(s.reqs)
	s.sblocks, s.rblocks, s.rin, s.rord, s.reqs = s.sblocks[:0], s.rblocks[:0], s.rin[:0], s.rord[:0], s.reqs[:0]
	nbScratchPool.Put(s)
}

// recvOrder returns in and rblocks in the order in which a neighborhood
// collective posts its receives (reordered into s's slices when the order
// changes): on a Cartesian communicator the two blocks of each dimension
// swapped, so that the block a neighbor sends in its negative direction
// lands in this rank's block of the positive direction and the other way
// round even when both neighbors along a dimension are one rank (a
// periodic dimension of 1 or 2 ranks): MPI-4.1 §8.6 and Example 8.10 (an
// erratum to MPI-3.1, MPI Forum issue 153); messages between one pair of
// ranks match in the order sent and received. Graph topologies keep list
// order: the k-th edge to a rank matches the k-th edge from it.
func (c *Comm) recvOrder(s *nbScratch, in []int, rblocks []typedArg) ([]int, []typedArg) {
	if c.graph != nil || c.ggraph != nil || c.cart == nil || len(in)%2 != 0 {
		return in, rblocks
	}
	sin, sb := s.rin[:0], s.rord[:0]
	for k := range in {
		sin, sb = append(sin, in[k^1]), append(sb, rblocks[k^1])
	}
	s.rin, s.rord = sin, sb
	return sin, sb
}

// startNeighbor starts a nonblocking neighborhood collective: a missing
// topology is reported at once; the exchange runs on the schedule engine
// as the other nonblocking collectives do (coll_sched.go).
func (c *Comm) startNeighbor(call Call, bytes int, build func(x coll, b *sched.Builder) error) (Request, error) {
	if _, _, err := c.neighbors(); err != nil {
		return Request{}, err
	}
	return c.startSched(call, AnySource, bytes, build)
}

// neighborSchedule is neighborExchange as one round of a schedule: every
// receive posted (in recvOrder), then every send, ProcNull neighbors
// skipped.
func neighborSchedule(b *sched.Builder, c *Comm, in []int, rblocks []typedArg, out []int, sblocks []typedArg) {
	in, rblocks = c.recvOrder(&nbScratch{}, in, rblocks)
	for i, src := range in {
		if src != ProcNull {
			b.RecvExt(src, 0, rblocks[i].mem, rblocks[i].ext())
		}
	}
	for i, dst := range out {
		if dst != ProcNull {
			b.SendExt(dst, 0, sblocks[i].mem, sblocks[i].ext())
		}
	}
	b.Fence()
}

// IneighborAllgather starts a NeighborAllgather (MPI_Ineighbor_allgather,
// MPI-4.1 §8.7): the request completes when it has. Buffers must not be
// touched until then. Errors at the call: ErrComm, ErrTopology, ErrType; the
// others of NeighborAllgather come with the request's completion.
func IneighborAllgather[T any](c *Comm, send, recv []T) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startNeighbor(CallIneighborAllgather, len(raw(send)), func(x coll, b *sched.Builder) error { return neighborAllgather(c, x, b, send, recv) })
}

// IneighborAlltoall starts a NeighborAlltoall (MPI_Ineighbor_alltoall,
// MPI-4.1 §8.7); errors as IneighborAllgather's.
func IneighborAlltoall[T any](c *Comm, send, recv []T) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startNeighbor(CallIneighborAlltoall, len(raw(send)), func(x coll, b *sched.Builder) error { return neighborAlltoall(c, x, b, send, recv) })
}

// IneighborAllgatherv starts a NeighborAllgatherv
// (MPI_Ineighbor_allgatherv, MPI-4.1 §8.7); errors as IneighborAllgather's.
func IneighborAllgatherv[T any](c *Comm, send, recv []T, counts, displs []int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startNeighbor(CallIneighborAllgatherv, len(raw(send)), func(x coll, b *sched.Builder) error {
		return neighborAllgatherv(c, x, b, send, recv, counts, displs)
	})
}

// IneighborAlltoallv starts a NeighborAlltoallv (MPI_Ineighbor_alltoallv,
// MPI-4.1 §8.7); errors as IneighborAllgather's.
func IneighborAlltoallv[T any](c *Comm, send []T, scounts, sdispls []int, recv []T, rcounts, rdispls []int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.startNeighbor(CallIneighborAlltoallv, len(raw(send)), func(x coll, b *sched.Builder) error {
		return neighborAlltoallv(c, x, b, send, scounts, sdispls, recv, rcounts, rdispls)
	})
}
