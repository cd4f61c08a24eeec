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
