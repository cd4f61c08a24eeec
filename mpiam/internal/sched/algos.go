package sched

import (
	"math/bits"
	"unsafe"
)

// The algorithms below append a collective's steps for one rank to a
// Builder. In a round that both receives and sends, the receive comes
// first, so that the peer's message finds it posted rather than waiting
// as unexpected (a copy and its bookkeeping). Buffers are bytes; counts and displacements are in bytes (the
// caller converts elements). Each algorithm uses tags tag..tag+3, so two
// algorithms in one schedule take tag bases 4 apart. Their costs use the
// usual model (α per message, β per byte, γ per byte reduced, p ranks, n
// bytes); docs/collectives.md lists them.

// Group is the ranks an algorithm runs over: member i is communicator rank
// Ranks[i] (nil Ranks: rank i), and this rank is member Me of Size.
type Group struct {
	Ranks []int
	Me    int
	Size  int
}

// Flat is the group of all ranks of a communicator of size ranks.
func Flat(me, size int) Group { return Group{Me: me, Size: size} }

func (g Group) peer(i int) int {
	if g.Ranks == nil {
		return i
	}
	return g.Ranks[i]
}

func unsafeBytes(w []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)
}

// BlockSpan splits n elements into k nearly equal blocks (the first n mod k
// one larger) and returns block i's elements [lo, hi).
func BlockSpan(n, k, i int) (lo, hi int) {
	q, r := n/k, n%k
	lo = i*q + min(i, r)
	hi = lo + q
	if i < r {
		hi++
	}
	return lo, hi
}

// span is block i of k of buf, split at element boundaries of elem bytes.
func span(buf []byte, elem, k, i int) []byte {
	lo, hi := BlockSpan(len(buf)/elem, k, i)
	return buf[lo*elem : hi*elem]
}

// Bcast broadcasts buf from member root by a binomial tree:
// ⌈log₂p⌉·(α + nβ). A rank receives from its parent in one round and sends
// to all its children in the next.
func Bcast(b *Builder, g Group, buf []byte, root, tag int) {
	p := g.Size
	if p == 1 {
		return
	}
	vr := (g.Me - root + p) % p
	mask := 1
	for mask < p && vr&mask == 0 {
		mask <<= 1
	}
	if vr != 0 {
		b.Recv(g.peer((vr-mask+root)%p), tag, buf)
		b.Fence()
	}
	for m := mask >> 1; m > 0; m >>= 1 {
		if vr+m < p {
			b.Send(g.peer((vr+m+root)%p), tag, buf)
		}
	}
	b.Fence()
}

// BcastScatterAllgather broadcasts buf from root by a binomial scatter of
// p blocks then a ring allgather (van de Geijn): (log₂p + p − 1)·α +
// 2·(p−1)/p·nβ, for long messages.
func BcastScatterAllgather(b *Builder, g Group, buf []byte, root, tag int) {
	p := g.Size
	if p == 1 {
		return
	}
	vr := (g.Me - root + p) % p
	blocks := func(lo, hi int) []byte { // blocks [lo, hi) of p, in relative ranks
		hi = min(hi, p)
		if lo >= hi {
			return nil
		}
		l, _ := BlockSpan(len(buf), p, lo)
		_, h := BlockSpan(len(buf), p, hi-1)
		return buf[l:h]
	}
	mask := 1
	for mask < p && vr&mask == 0 {
		mask <<= 1
	}
	if vr != 0 {
		if in := blocks(vr, vr+mask); len(in) > 0 {
			b.Recv(g.peer((vr-mask+root)%p), tag, in)
			b.Fence()
		}
	}
	for m := mask >> 1; m > 0; m >>= 1 {
		if out := blocks(vr+m, vr+2*m); len(out) > 0 {
			b.Send(g.peer((vr+m+root)%p), tag, out)
		}
	}
	b.Fence()
	left, right := g.peer((g.Me-1+p)%p), g.peer((g.Me+1)%p)
	for i := 0; i < p-1; i++ {
		if r := blocks((vr-i-1+p)%p, (vr-i-1+p)%p+1); len(r) > 0 {
			b.Recv(left, tag+1, r)
		}
		if s := blocks((vr-i+p)%p, (vr-i+p)%p+1); len(s) > 0 {
			b.Send(right, tag+1, s)
		}
		b.Fence()
	}
}

// Reduce combines every member's send with red into root's recv by a
// binomial tree: ⌈log₂p⌉·(α + nβ + nγ). A rank receives from all its
// children at once and combines them in rank order. Commutative operations
// take ranks relative to root; others run in absolute order to member 0,
// which then sends the result to root. recv matters at root only; send may
// be recv there (in place).
func Reduce(b *Builder, g Group, send, recv []byte, red *Reduction, root, tag int) {
	p, n := g.Size, len(send)
	if p == 1 {
		b.Copy(recv, send)
		b.Fence()
		return
	}
	base := root
	if !red.Commutative {
		base = 0
	}
	vr := (g.Me - base + p) % p
	acc := b.Temp(n)
	b.Copy(acc, send)
	var kids [][]byte
	mask := 1
	for ; mask < p && vr&mask == 0; mask <<= 1 {
		if vr+mask < p {
			t := b.Temp(n)
			b.Recv(g.peer((vr+mask+base)%p), tag, t)
			kids = append(kids, t)
		}
	}
	b.Fence()
	for _, t := range kids {
		// acc holds ranks [vr, vr+m), t the next ones: t = acc ∘ t.
		b.Reduce(red, acc, t)
		acc = t
	}
	if vr != 0 {
		b.Send(g.peer((vr-mask+base)%p), tag, acc)
	} else if base == root {
		b.Copy(recv, acc)
	}
	b.Fence()
	if base != root {
		switch g.Me {
		case 0:
			b.Send(g.peer(root), tag+1, acc)
		case root:
			b.Recv(g.peer(0), tag+1, recv)
		}
		b.Fence()
	}
}

// Allreduce combines every member's send with red into every member's recv
// (send may be recv: in place). Commutative operations use recursive
// doubling (log₂p·(α + nβ + nγ)); non-power-of-two sizes fold the first
// 2·(p − 2^⌊log₂p⌋) ranks in pairs first and send them the result last.
// Non-commutative ones Reduce to member 0 in rank order, then Bcast.
func Allreduce(b *Builder, g Group, send, recv []byte, red *Reduction, tag int) {
	if !red.Commutative {
		Reduce(b, g, send, recv, red, 0, tag)
		Bcast(b, g, recv, 0, tag+2)
		return
	}
	b.Copy(recv, send)
	b.Fence()
	p, me, n := g.Size, g.Me, len(recv)
	if p == 1 || n == 0 {
		return
	}
	pof2 := 1 << (bits.Len(uint(p)) - 1)
	rem := p - pof2
	tmp := b.Temp(n)
	nr := me - rem
	if me < 2*rem {
		if me%2 == 0 {
			b.Send(g.peer(me+1), tag, recv)
			b.Fence()
			b.Recv(g.peer(me+1), tag+2, recv)
			b.Fence()
			return
		}
		b.Recv(g.peer(me-1), tag, tmp)
		b.Fence()
		b.Reduce(red, tmp, recv) // the lower rank's data first
		nr = me / 2
	}
	realRank := func(r int) int {
		if r < rem {
			return r*2 + 1
		}
		return r + rem
	}
	for mask := 1; mask < pof2; mask <<= 1 {
		partner := g.peer(realRank(nr ^ mask))
		out := recv
		if mask == 1 && rem == 0 {
			// The same bytes as recv now: sent from send, lines nobody
			// wrote since, which the partner reads faster than this
			// core's fresh copy.
			out = send
		}
		b.Recv(partner, tag+1, tmp)
		b.SendExchange(partner, tag+1, out)
		b.Fence()
		if nr^mask < nr {
			b.Reduce(red, tmp, recv)
		} else {
			// Lower first on every rank, so all get the same bits.
			b.Reduce(red, recv, tmp)
			b.Copy(recv, tmp)
		}
	}
	if me < 2*rem {
		b.Send(g.peer(me-1), tag+2, recv)
	}
	b.Fence()
}

// AllreduceRing combines like Allreduce by p−1 reduce-scatter steps around
// the ring, then p−1 allgather steps: 2·(p−1)·α + 2·(p−1)/p·nβ +
// (p−1)/p·nγ, for long vectors of at least p elements and commutative
// operations.
func AllreduceRing(b *Builder, g Group, send, recv []byte, red *Reduction, tag int) {
	p, me, e := g.Size, g.Me, red.Elem
	left, right := g.peer((me-1+p)%p), g.peer((me+1)%p)
	if p > 1 && len(recv) > 0 && !sameBytes(send, recv) {
		// Apart: no copy of send into recv. The first round sends this
		// rank's block straight from send; each reduce-scatter round
		// receives its block into recv, and the next round folds this
		// rank's own block of send into it (recv = send ∘ recv,
		// commutative) before sending it on.
		var got []byte // the block received in the previous round
		at := 0        // and its index
		for i := 0; i < p-1; i++ {
			out := span(send, e, p, me)
			if got != nil {
				b.Reduce(red, span(send, e, p, at), got)
				out = got
			}
			at = (me - i - 1 + p) % p
			got = span(recv, e, p, at)
			b.Recv(left, tag, got)
			b.Send(right, tag, out)
			b.Fence()
		}
		b.Reduce(red, span(send, e, p, at), got)
		ringAllgather(b, recv, e, p, me, left, right, tag+1)
		return
	}
	b.Copy(recv, send)
	b.Fence()
	if p == 1 || len(recv) == 0 {
		return
	}
	tmp := b.Temp(len(span(recv, e, p, 0)))
	var pending []byte // the block received in the previous step, to reduce
	for i := 0; i < p-1; i++ {
		if pending != nil {
			b.Reduce(red, tmp[:len(pending)], pending)
		}
		pending = span(recv, e, p, (me-i-1+p)%p)
		b.Recv(left, tag, tmp[:len(pending)])
		b.Send(right, tag, span(recv, e, p, (me-i+p)%p))
		b.Fence()
	}
	b.Reduce(red, tmp[:len(pending)], pending)
	ringAllgather(b, recv, e, p, me, left, right, tag+1)
}

// ringAllgather is the allgather half of AllreduceRing: p-1 rounds, each
// passing on to the right the block that came from the left the round
// before, starting with the block reduced here (me+1).
func ringAllgather(b *Builder, recv []byte, e, p, me, left, right, tag int) {
	for i := 0; i < p-1; i++ {
		b.Recv(left, tag, span(recv, e, p, (me-i+p)%p))
		b.Send(right, tag, span(recv, e, p, (me+1-i+p)%p))
		b.Fence()
	}
}

// sameBytes reports whether a and b start at the same byte (a buffer and
// itself: an operation in place).
func sameBytes(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}

// Gatherv collects block i of root's recv (bytes [displs[i],
// displs[i]+counts[i])) from member i's send: linear, root posts every
// receive at once. recv, counts and displs matter at root only; a nil send
// at root means its block is in place.
func Gatherv(b *Builder, g Group, send, recv []byte, counts, displs []int, root, tag int) {
	if g.Me != root {
		b.Send(g.peer(root), tag, send)
		b.Fence()
		return
	}
	if send != nil {
		b.Copy(recv[displs[root]:displs[root]+counts[root]], send)
	}
	for i := 1; i < g.Size; i++ {
		src := (root + i) % g.Size
		b.Recv(g.peer(src), tag, recv[displs[src]:displs[src]+counts[src]])
	}
	b.Fence()
}

// Scatterv sends block i of root's send (bytes [displs[i],
// displs[i]+counts[i])) to member i's recv: linear, root posts every send
// at once. A nil recv at root means its block stays in place.
func Scatterv(b *Builder, g Group, send []byte, counts, displs []int, recv []byte, root, tag int) {
	if g.Me != root {
		b.Recv(g.peer(root), tag, recv)
		b.Fence()
		return
	}
	if recv != nil {
		b.Copy(recv, send[displs[root]:displs[root]+counts[root]])
	}
	for i := 1; i < g.Size; i++ {
		dst := (root + i) % g.Size
		b.Send(g.peer(dst), tag, send[displs[dst]:displs[dst]+counts[dst]])
	}
	b.Fence()
}

// AllgatherRing gathers block i (bytes [displs[i], displs[i]+counts[i]) of
// recv) from member i into every member's recv, around a ring: (p−1)·α +
// (p−1)/p·nβ. A nil send means this member's block is in place.
func AllgatherRing(b *Builder, g Group, send, recv []byte, counts, displs []int, tag int) {
	p, me := g.Size, g.Me
	block := func(i int) []byte { return recv[displs[i] : displs[i]+counts[i]] }
	if send != nil {
		b.Copy(block(me), send)
		b.Fence()
	}
	left, right := g.peer((me-1+p)%p), g.peer((me+1)%p)
	for i := 0; i < p-1; i++ {
		b.Recv(left, tag, block((me-i-1+p)%p))
		b.Send(right, tag, block((me-i+p)%p))
		b.Fence()
	}
}

// AllgatherRecursiveDoubling is Allgather of blocks of k bytes for a
// power-of-two p: log₂p·α + (p−1)/p·nβ.
func AllgatherRecursiveDoubling(b *Builder, g Group, send, recv []byte, k, tag int) {
	p, me := g.Size, g.Me
	if send != nil {
		b.Copy(recv[me*k:(me+1)*k], send)
		b.Fence()
	}
	for mask := 1; mask < p; mask <<= 1 {
		partner := me ^ mask
		mine := (me &^ (mask - 1)) * k
		theirs := (partner &^ (mask - 1)) * k
		b.Recv(g.peer(partner), tag, recv[theirs:theirs+mask*k])
		b.SendExchange(g.peer(partner), tag, recv[mine:mine+mask*k])
		b.Fence()
	}
}

// Alltoallv sends bytes [sdispls[j], sdispls[j]+scounts[j]) of send to
// member j, which stores them at [rdispls[i], rdispls[i]+rcounts[i]) of its
// recv for this member i: every message posted at once, in the order of
// pairwise exchange (to me+i, from me−i), so no rank is every rank's first
// target.
func Alltoallv(b *Builder, g Group, send []byte, scounts, sdispls []int, recv []byte, rcounts, rdispls []int, tag int) {
	p, me := g.Size, g.Me
	for i := 1; i < p; i++ {
		src := (me - i + p) % p
		b.Recv(g.peer(src), tag, recv[rdispls[src]:rdispls[src]+rcounts[src]])
	}
	for i := 1; i < p; i++ {
		dst := (me + i) % p
		b.SendExchangeBlocks(g.peer(dst), tag, send[sdispls[dst]:sdispls[dst]+scounts[dst]])
	}
	// The rank's own block last: the messages are on their way (a large
	// one's request-to-send with the peer, who can read this rank's data
	// meanwhile) while it copies.
	b.Copy(recv[rdispls[me]:rdispls[me]+rcounts[me]], send[sdispls[me]:sdispls[me]+scounts[me]])
	b.Fence()
}

// ReduceScatter combines every member's send (all p blocks, block i of
// counts[i] bytes, in order) with red and leaves block me of the result in
// recv. Commutative operations: around a ring, (p−1)·(α + nβ/p + nγ/p).
// Others: Reduce to member 0 in rank order, then Scatterv.
func ReduceScatter(b *Builder, g Group, send, recv []byte, counts []int, red *Reduction, tag int) {
	p, me := g.Size, g.Me
	displs := make([]int, p)
	most := 0
	for i := 1; i < p; i++ {
		displs[i] = displs[i-1] + counts[i-1]
	}
	for _, c := range counts {
		most = max(most, c)
	}
	if !red.Commutative {
		var all []byte
		if me == 0 {
			all = b.Temp(len(send))
		}
		Reduce(b, g, send, all, red, 0, tag)
		Scatterv(b, g, all, counts, displs, recv, 0, tag+2)
		return
	}
	acc := b.Temp(len(send))
	b.Copy(acc, send)
	block := func(i int) []byte { i = (i + 2*p) % p; return acc[displs[i] : displs[i]+counts[i]] }
	left, right := g.peer((me-1+p)%p), g.peer((me+1)%p)
	tmp := b.Temp(most)
	var pending []byte
	for i := 0; i < p-1; i++ {
		if pending != nil {
			b.Reduce(red, tmp[:len(pending)], pending)
		}
		pending = block(me - i - 2)
		b.Recv(left, tag, tmp[:len(pending)])
		b.Send(right, tag, block(me-i-1))
		b.Fence()
	}
	if pending != nil {
		b.Reduce(red, tmp[:len(pending)], pending)
	}
	b.Copy(recv, block(me))
	b.Fence()
}

// Scan leaves send_0 ∘ ... ∘ send_me in recv (inclusive) or send_0 ∘ ... ∘
// send_(me−1) (exclusive; member 0's recv untouched) by recursive doubling
// in rank order (Hillis–Steele): ⌈log₂p⌉·(α + nβ + nγ). send may be recv.
func Scan(b *Builder, g Group, send, recv []byte, red *Reduction, exclusive bool, tag int) {
	p, me, n := g.Size, g.Me, len(recv)
	partial := b.Temp(n) // the reduction of the ranks heard from, this one's included
	tmp := b.Temp(n)
	b.Copy(partial, send)
	have := !exclusive // whether recv holds a value yet
	if !exclusive {
		b.Copy(recv, send)
	}
	b.Fence()
	for mask := 1; mask < p; mask <<= 1 {
		partner := me ^ mask
		if partner >= p {
			continue
		}
		b.Recv(g.peer(partner), tag, tmp)
		b.SendExchange(g.peer(partner), tag, partial)
		b.Fence()
		if partner < me {
			// tmp covers lower ranks: it goes in front.
			b.Reduce(red, tmp, partial)
			if have {
				b.Reduce(red, tmp, recv)
			} else {
				b.Copy(recv, tmp)
				have = true
			}
		} else {
			b.Reduce(red, partial, tmp)
			b.Copy(partial, tmp)
		}
	}
	b.Fence()
}
