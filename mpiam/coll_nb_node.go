package mpiam

import "github.com/amgo-hpc/amgo/mpiam/internal/sched"

// Node-aware schedules of the nonblocking and persistent Ibcast, Ireduce
// and Iallreduce: on a communicator whose ranks span several nodes with
// more than one rank on some node, the same levels as the blocking calls
// (coll_node.go) as rounds of one schedule: within each node over shared
// memory, among one leader per node, within each node again, with the same
// step numbers per level.

// groups returns l's node and, for a leader, the leaders as schedule groups.
func (l *levels) groups() (node, leaders sched.Group) {
	node = sched.Group{Ranks: l.node.ranks, Me: l.node.me, Size: len(l.node.ranks)}
	leaders = sched.Group{Ranks: l.leaders.ranks, Me: l.leaders.me, Size: len(l.leaders.ranks)}
	return node, leaders
}

// bcastNodesSched: root hands buf to its leader, the leaders broadcast,
// each leader broadcasts to its node.
func bcastNodesSched(b *sched.Builder, x coll, buf []byte, root int, l *levels) {
	me, rl := x.c.rank, l.leaderOf[root]
	if root != rl {
		switch me {
		case root:
			b.Send(rl, hopStep, buf)
			b.Fence()
		case rl:
			b.Recv(root, hopStep, buf)
			b.Fence()
		}
	}
	node, leaders := l.groups()
	if l.isLeader() {
		sched.Bcast(b, leaders, buf, l.leaderIdx[root], leaderSteps)
	}
	sched.Bcast(b, node, buf, 0, node2Steps)
}

// reduceNodesSched: each node reduces to its leader, the leaders to root's
// leader, which hands the result to root. For a non-commutative operation
// the caller checks that l is contiguous.
func reduceNodesSched(b *sched.Builder, x coll, send, recv []byte, red *sched.Reduction, root int, l *levels) {
	node, leaders := l.groups()
	part := b.Temp(len(send))
	sched.Reduce(b, node, send, part, red, 0, 0)
	me, rl := x.c.rank, l.leaderOf[root]
	if l.isLeader() {
		out := recv
		if me != root {
			out = b.Temp(len(send))
		}
		sched.Reduce(b, leaders, part, out, red, l.leaderIdx[root], leaderSteps)
		if me == rl && me != root {
			b.Send(root, hopStep, out)
			b.Fence()
		}
	}
	if me == root && root != rl {
		b.Recv(rl, hopStep, recv)
		b.Fence()
	}
}

// allreduceNodesSched: each node reduces to its leader, the leaders
// Allreduce, each leader broadcasts to its node.
func allreduceNodesSched(b *sched.Builder, send, recv []byte, red *sched.Reduction, l *levels) {
	node, leaders := l.groups()
	sched.Reduce(b, node, send, recv, red, 0, 0)
	if l.isLeader() {
		sched.Allreduce(b, leaders, recv, recv, red, leaderSteps)
	}
	sched.Bcast(b, node, recv, 0, node2Steps)
}

// nodeMembers is k-byte blocks for each of l's node members, at first,
// first+k, ...: where a leader gathers its node.
func nodeMembers(l *levels, first, k int) (counts, displs []int) {
	n := len(l.node.ranks)
	counts, displs = make([]int, n), make([]int, n)
	for i := range n {
		counts[i], displs[i] = k, first+i*k
	}
	return counts, displs
}

// allgatherNodesSched gathers every rank's k-byte block (in recv at this
// rank's place) into recv everywhere: each node gathers at its leader, the
// leaders exchange their nodes' blocks around a ring, each leader
// broadcasts the whole to its node; node by node is rank order when l is
// contiguous, otherwise a last step puts it in rank order.
func allgatherNodesSched(b *sched.Builder, x coll, recv []byte, k int, l *levels) {
	me := x.c.rank
	all := recv
	if !l.contiguous {
		all = b.Temp(len(recv))
	}
	node, leaders := l.groups()
	first := l.pos[l.leaderOf[me]] * k
	counts, displs := nodeMembers(l, first, k)
	sched.Gatherv(b, node, recv[me*k:(me+1)*k], all, counts, displs, 0, 0)
	if l.isLeader() {
		nc, nd := nodeBlocks(l, k)
		sched.AllgatherRing(b, leaders, nil, all, nc, nd, leaderSteps)
	}
	sched.Bcast(b, node, all, 0, node2Steps)
	if !l.contiguous {
		b.Call(func() error { l.toRankOrder(recv, all, k); return nil })
	}
}

// gatherNodesSched gathers every rank's k-byte block into recv at root:
// each node gathers at its leader, root's leader gathers the nodes' blocks
// and hands them to root, which puts them in rank order.
func gatherNodesSched(b *sched.Builder, x coll, send, recv []byte, k, root int, l *levels) {
	me, rl := x.c.rank, l.leaderOf[root]
	node, leaders := l.groups()
	first := l.pos[l.leaderOf[me]] * k
	var all, blk []byte
	if l.isLeader() {
		all = b.Temp(len(l.order) * k)
		blk = all[first : first+len(l.node.ranks)*k]
	}
	counts, displs := nodeMembers(l, first, k)
	sched.Gatherv(b, node, send, all, counts, displs, 0, 0)
	if l.isLeader() {
		nc, nd := nodeBlocks(l, k)
		mine := blk
		if me == rl {
			mine = nil // in place: its node's blocks are in all
		}
		sched.Gatherv(b, leaders, mine, all, nc, nd, l.leaderIdx[root], leaderSteps)
		if me == rl && root != rl {
			b.Send(root, hopStep, all)
			b.Fence()
		}
	}
	if me == root {
		if root != rl {
			all = b.Temp(len(l.order) * k)
			b.Recv(rl, hopStep, all)
			b.Fence()
		}
		b.Call(func() error { l.toRankOrder(recv, all, k); return nil })
	}
}

// toRankOrder copies node-by-node blocks of k bytes (all, in l.order) into
// recv in rank order.
func (l *levels) toRankOrder(recv, all []byte, k int) {
	if &recv[0] == &all[0] {
		return
	}
	for r := range l.pos {
		copyT(recv[r*k:(r+1)*k], all[l.pos[r]*k:(l.pos[r]+1)*k])
	}
}
