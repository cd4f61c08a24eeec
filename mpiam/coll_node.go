package mpiam

import (
	"os"
)

// Node-aware (two-level) collectives. On a communicator whose ranks span
// several nodes with several ranks on some of them, Barrier, Bcast, Reduce,
// Allreduce, Allgather and Gather run in levels, as MPICH's SMP collectives
// and Open MPI's han do: among the ranks of each node (over shared memory),
// among one leader per node (over the network), and within each node again.
// A message crosses the network once per node rather than once per rank,
// and the flat algorithms' rounds between nodes shrink from log2(ranks) to
// log2(nodes). Each level runs the flat algorithm that its size and the
// message size choose (coll.go) over a group of the communicator's ranks
// (coll.view): the node's ranks in communicator order, or the nodes'
// leaders, each the lowest rank of its node, in node order.
//
// A rooted call whose root is not its node's leader adds one hop within the
// node (root to leader for Bcast; leader to root for Reduce and Gather).
// Reduce and Allreduce with a non-commutative operation use the levels only
// when every node's ranks are consecutive in the communicator (a block
// layout), where reducing within nodes and then across nodes in node order
// combines in rank order; otherwise they stay flat. AMGO_COLL_NODE_AWARE=0
// keeps every collective flat (for comparisons).

// nodeAware turns the node-aware algorithms on (AMGO_COLL_NODE_AWARE, "0"
// for off).
var nodeAware = os.Getenv("AMGO_COLL_NODE_AWARE") != "0"

// Steps of the levels: the first node level's algorithm uses steps from 0,
// the leaders' from leaderSteps, the second node level's from node2Steps;
// the hop between a root and its leader is hopStep. Each flat algorithm uses
// fewer than 40 steps, and a call's tags have 256 (collTag).
const (
	leaderSteps = 40
	node2Steps  = 80
	hopStep     = 120
)

// levels is how a communicator's ranks sit on nodes.
type levels struct {
	node      view  // this rank's node: its ranks of c, in c's order (the leader first)
	leaders   view  // one per node, the lowest rank of c there, in node order (me -1: not a leader)
	leaderOf  []int // by rank of c: its node's leader
	leaderIdx []int // by rank of c: its node's leader's index in leaders
	order     []int // the ranks of c node by node (leaders' order, each node in c's order)
	pos       []int // by rank of c: its place in order
	sizes     []int // by leader index: the node's number of ranks
	// contiguous: every node's ranks are consecutive in c (order is c's),
	// so node-by-node results are in rank order.
	contiguous bool
	// useful: more than one node, and some node with more than one rank.
	useful bool
}

// levels returns c's node levels, computed once from the job's layout
// (am.Endpoint.Node, which every rank knows alike).
func (c *Comm) levels() *levels {
	if l := c.lv.Load(); l != nil {
		return l
	}
	l := &levels{leaderOf: make([]int, c.size), leaderIdx: make([]int, c.size), pos: make([]int, c.size)}
	nodeIdx := map[int]int{} // job node -> index in leaders
	var members [][]int
	for r := 0; r < c.size; r++ {
		k := c.p.ep.Node(c.world(r))
		i, ok := nodeIdx[k]
		if !ok {
			i = len(members)
			nodeIdx[k] = i
			members = append(members, nil)
			l.leaders.ranks = append(l.leaders.ranks, r)
		}
		members[i] = append(members[i], r)
		l.leaderOf[r] = l.leaders.ranks[i]
		l.leaderIdx[r] = i
	}
	l.leaders.me = -1
	l.contiguous = true
	for i, m := range members {
		l.sizes = append(l.sizes, len(m))
		if len(m) > 1 {
			l.useful = len(members) > 1
		}
		if m[len(m)-1]-m[0] != len(m)-1 {
			l.contiguous = false
		}
		for _, r := range m {
			l.pos[r] = len(l.order)
			l.order = append(l.order, r)
			if r == c.rank {
				l.node = view{ranks: m, me: len(l.order) - 1 - l.pos[m[0]]}
				if r == m[0] {
					l.leaders.me = i
				}
			}
		}
	}
	c.lv.Store(l)
	return l
}

// nodeLevels returns the levels x should run in, or nil for the flat
// algorithm: x already runs over a group, the levels are off, or they would
// not help.
func (x coll) nodeLevels() *levels {
	if x.v != nil || !nodeAware || x.c.size < 3 {
		return nil
	}
	if l := x.c.levels(); l.useful {
		return l
	}
	return nil
}

// phase returns x over v, with its steps from base.
func (x coll) phase(base int, v *view) coll {
	x.v = v
	x.tag += base
	return x
}

// isLeader reports whether this rank leads its node.
func (l *levels) isLeader() bool { return l.leaders.me >= 0 }

// bcastNodes: root to its leader, the leaders' Bcast, each node's Bcast
// from its leader.
func (x coll) bcastNodes(b []byte, root int, l *levels) error {
	me, rl := x.c.rank, l.leaderOf[root]
	if root != rl {
		switch me {
		case root:
			if err := x.send(b, rl, hopStep); err != nil {
				return err
			}
		case rl:
			if err := x.recv(b, root, hopStep); err != nil {
				return err
			}
		}
	}
	if l.isLeader() {
		if err := x.phase(leaderSteps, &l.leaders).bcast(b, l.leaderIdx[root]); err != nil {
			return err
		}
	}
	return x.phase(node2Steps, &l.node).bcast(b, 0)
}

// reduceNodes leaves the reduction of every rank's send in recv at root:
// each node reduces to its leader, the leaders to root's leader, which
// hands it to root. For a non-commutative op the caller checks that l is
// contiguous.
func reduceNodes[T any](x coll, send, recv []T, op Op[T], root int, l *levels) error {
	n := len(send)
	part, hp := tempBuf[T](x, n)
	defer x.putTemp(hp)
	if err := reduceBinomial(x.phase(0, &l.node), send, part, op, 0, 0); err != nil {
		return err
	}
	me, rl := x.c.rank, l.leaderOf[root]
	if l.isLeader() {
		out := recv
		if me != root {
			tmp, ht := tempBuf[T](x, n)
			defer x.putTemp(ht)
			out = tmp
		}
		if err := reduceBinomial(x.phase(leaderSteps, &l.leaders), part, out, op, l.leaderIdx[root], 0); err != nil {
			return err
		}
		if me == rl && me != root {
			return x.send(raw(out), root, hopStep)
		}
	}
	if me == root && root != rl {
		return x.recv(raw(recv), rl, hopStep)
	}
	return nil
}

// allreduceNodes: each node reduces to its leader, the leaders Allreduce,
// each leader broadcasts to its node. recv may alias send.
func allreduceNodes[T any](x coll, send, recv []T, op Op[T], l *levels) error {
	if err := reduceBinomial(x.phase(0, &l.node), send, recv, op, 0, 0); err != nil {
		return err
	}
	if l.isLeader() {
		if err := allreduce(x.phase(leaderSteps, &l.leaders), nil, recv, op); err != nil {
			return err
		}
	}
	return x.phase(node2Steps, &l.node).bcast(raw(recv), 0)
}

// gatherToLeader collects the node's blocks of k bytes (send at each rank)
// at its leader, in node order, into blk (len(node)·k bytes; the leader's
// own block is copied in).
func (x coll) gatherToLeader(send, blk []byte, k int, l *levels) error {
	xn := x.phase(0, &l.node)
	if l.node.me != 0 {
		return xn.send(send, 0, 0)
	}
	copyT(blk, send)
	for i := 1; i < len(l.node.ranks); i++ {
		if err := xn.recv(blk[i*k:(i+1)*k], i, 0); err != nil {
			return err
		}
	}
	return nil
}

// nodeBlocks returns the counts and displacements, in bytes, of the nodes'
// blocks of k bytes per rank in node-by-node order.
func nodeBlocks(l *levels, k int) (counts, displs []int) {
	counts, displs = make([]int, len(l.sizes)), make([]int, len(l.sizes))
	off := 0
	for i, n := range l.sizes {
		counts[i], displs[i] = n*k, off
		off += n * k
	}
	return counts, displs
}

// allgatherNodes gathers every rank's k-byte block (already in recv at
// this rank's place) into recv everywhere: each node gathers at its
// leader, the leaders exchange their nodes' blocks (a ring), each leader
// broadcasts the whole to its node. Node by node is rank order when l is
// contiguous; otherwise it is put in rank order at the end.
func (x coll) allgatherNodes(recv []byte, k int, l *levels) error {
	all := recv
	var h *[]byte
	if !l.contiguous {
		all, h = tempBuf[byte](x, len(recv))
		defer x.putTemp(h)
	}
	me := x.c.rank
	first := l.pos[l.leaderOf[me]] * k // this node's block in all
	if err := x.gatherToLeader(recv[me*k:(me+1)*k], all[first:first+len(l.node.ranks)*k], k, l); err != nil {
		return err
	}
	if l.isLeader() {
		counts, displs := nodeBlocks(l, k)
		if err := allgatherRing(x.phase(leaderSteps, &l.leaders), all, counts, displs); err != nil {
			return err
		}
	}
	if err := x.phase(node2Steps, &l.node).bcast(all, 0); err != nil {
		return err
	}
	if !l.contiguous {
		for r := 0; r < x.c.size; r++ {
			copyT(recv[r*k:(r+1)*k], all[l.pos[r]*k:(l.pos[r]+1)*k])
		}
	}
	return nil
}

// gatherNodes gathers every rank's k-byte block into recv at root (in rank
// order): each node gathers at its leader, root's leader gathers the nodes'
// blocks, and hands them to root.
func (x coll) gatherNodes(send, recv []byte, k, root int, l *levels) error {
	me, rl := x.c.rank, l.leaderOf[root]
	var all []byte
	if l.isLeader() {
		var h *[]byte
		all, h = tempBuf[byte](x, len(l.order)*k)
		defer x.putTemp(h)
	}
	first := l.pos[l.leaderOf[me]] * k
	var blk []byte
	if l.isLeader() {
		blk = all[first : first+len(l.node.ranks)*k]
	}
	if err := x.gatherToLeader(send, blk, k, l); err != nil {
		return err
	}
	if l.isLeader() {
		xl := x.phase(leaderSteps, &l.leaders)
		if me != rl {
			if err := xl.send(blk, l.leaderIdx[root], 0); err != nil {
				return err
			}
		} else {
			counts, displs := nodeBlocks(l, k)
			if err := gathervRoot(xl, all, counts, displs); err != nil {
				return err
			}
			if root != rl {
				return x.send(all, root, hopStep)
			}
		}
	}
	if me == root {
		if root != rl {
			var h *[]byte
			all, h = tempBuf[byte](x, len(l.order)*k)
			defer x.putTemp(h)
			if err := x.recv(all, rl, hopStep); err != nil {
				return err
			}
		}
		for r := 0; r < x.c.size; r++ {
			copyT(recv[r*k:(r+1)*k], all[l.pos[r]*k:(l.pos[r]+1)*k])
		}
	}
	return nil
}

// barrierTags is the first tag of the node-aware barriers' messages, above
// every other collective's (collTag): a barrier's tags follow from its
// epoch, the same whether a rank calls Barrier or Ibarrier (amgo's barriers
// match across the two, as the flat barrier's counts do), and two Ibarriers
// in flight at once never take each other's messages.
const barrierTags = 1 << 29

// barrierNodes: each node's ranks report to their leader, the leaders run
// a dissemination barrier, each leader releases its node.
func (x coll) barrierNodes(l *levels) error {
	x.tag = barrierTags + int(x.epoch%(1<<20))<<8
	var one [1]byte
	xn := x.phase(0, &l.node)
	if l.node.me != 0 {
		if err := xn.send(one[:], 0, 0); err != nil {
			return err
		}
	} else {
		for i := 1; i < len(l.node.ranks); i++ {
			if err := xn.recv(one[:], i, 0); err != nil {
				return err
			}
		}
		xl := x.phase(leaderSteps, &l.leaders)
		p, me := xl.size(), xl.rank()
		var in [1]byte
		for r, dist := 0, 1; dist < p; r, dist = r+1, dist*2 {
			if err := xl.sendrecv(one[:], (me+dist)%p, in[:], (me-dist+p)%p, r); err != nil {
				return err
			}
		}
	}
	return x.phase(node2Steps, &l.node).bcastBinomial(one[:], 0, 0)
}
