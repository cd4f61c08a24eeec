package mpiam

import (
	"fmt"
	"slices"
)

// newContext agrees on a context id for a communicator being made from c:
// collective over c; every rank proposes the next id it has free and all take
// the largest, so the id is unused by every participant (no central server).
// Communicators made by one call share it: their groups are disjoint, and a
// message's (context, source) then names one communicator at its receiver.
func (c *Comm) newContext() (uint32, error) {
	p := c.p
	p.mu.Lock()
	mine := p.nextCtx
	p.mu.Unlock()
	agreed, err := c.allreduceMaxU32(mine)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	if p.nextCtx <= agreed {
		p.nextCtx = agreed + 2
	}
	p.mu.Unlock()
	return agreed, nil
}

// Split partitions c by color (MPI_Comm_split, MPI-4.1 §7.4.2): the ranks
// that pass the same color form a new communicator, ordered by key and then by
// their rank in c. A rank that passes Undefined as its color gets nil
// (MPI_COMM_NULL). Collective over c. Errors: ErrArg for a negative color other
// than Undefined.
func (c *Comm) Split(color, key int) (*Comm, error) {
	if c.hooked() {
		var d *Comm
		err := c.p.hookErr(&Event{Call: CallCommSplit, Comm: c, Tag: color}, func() (err error) { d, err = c.split(color, key); return err })
		return d, err
	}
	return c.split(color, key)
}

func (c *Comm) split(color, key int) (*Comm, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	if color < 0 && color != Undefined {
		return nil, fmt.Errorf("%w: color %d (non-negative or Undefined)", ErrArg, color)
	}
	x, err := c.startColl(CallCommSplit, false)
	if err != nil {
		return nil, err
	}
	all := make([]int64, 2*c.size)
	if err := allgather(x, []int64{int64(color), int64(key)}, all); err != nil {
		return nil, err
	}
	ctx, err := c.newContext()
	if err != nil {
		return nil, err
	}
	if color == Undefined {
		return nil, nil
	}
	return c.subComm(ctx, membersOf(all, 2, color)), nil
}

// membersOf returns the ranks whose (color, key, ...) record in all (stride
// words per rank) has the given color, ordered by key and then by rank:
// Split's order.
func membersOf(all []int64, stride, color int) []int {
	var members []int
	for r := 0; r*stride < len(all); r++ {
		if all[stride*r] == int64(color) {
			members = append(members, r)
		}
	}
	slices.SortStableFunc(members, func(a, b int) int {
		if ka, kb := all[stride*a+1], all[stride*b+1]; ka != kb {
			if ka < kb {
				return -1
			}
			return 1
		}
		return a - b
	})
	return members
}

// subComm makes the communicator of the given ranks of c (in that order).
func (c *Comm) subComm(ctx uint32, members []int) *Comm {
	ranks := make([]int, len(members))
	me := Undefined
	for i, r := range members {
		ranks[i] = c.world(r)
		if r == c.rank {
			me = i
		}
	}
	return c.p.newComm(ctx, me, len(ranks), ranks)
}

// Create makes a communicator of the members of g, a subset of c's group, in
// g's order (MPI_Comm_create). Collective over c: every rank of c calls it with
// the same group; ranks outside g get nil. Errors: ErrGroup when g has a
// process outside c.
func (c *Comm) Create(g Group) (*Comm, error) {
	if c.hooked() {
		var d *Comm
		err := c.p.hookErr(&Event{Call: CallCommCreate, Comm: c}, func() (err error) { d, err = c.create(g); return err })
		return d, err
	}
	return c.create(g)
}

func (c *Comm) create(g Group) (*Comm, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	cg, err := c.Group()
	if err != nil {
		return nil, err
	}
	members := make([]int, len(g.world))
	for i, w := range g.world {
		r := slices.Index(cg.world, w)
		if r < 0 {
			return nil, fmt.Errorf("%w: world rank %d is not in the communicator", ErrGroup, w)
		}
		members[i] = r
	}
	ctx, err := c.newContext()
	if err != nil {
		return nil, err
	}
	if !slices.Contains(members, c.rank) {
		return nil, nil
	}
	return c.subComm(ctx, members), nil
}

// CommType is a kind of split for SplitType (MPI-4.1 §7.4.2).
type CommType int

// Split types of SplitType.
const (
	// CommTypeShared (MPI_COMM_TYPE_SHARED): the ranks that can share
	// memory, those on one node. amgo learns the nodes at start-up (package
	// am/job: the node identity each rank publishes, or AMGO_NODE).
	CommTypeShared CommType = 1
)

// SplitType partitions c by the kind of hardware its ranks share
// (MPI_Comm_split_type, MPI-4.1 §7.4.2): with CommTypeShared, the ranks of c
// on one node form a new communicator, ordered by key and then by their rank
// in c. A rank that passes Undefined as splitType gets nil (MPI_COMM_NULL).
// Collective over c; MPI's info argument has no keys amgo reads and is
// omitted. Errors: ErrArg for a split type other than CommTypeShared and
// Undefined, and those of Split.
func (c *Comm) SplitType(splitType CommType, key int) (*Comm, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	color := Undefined
	switch splitType {
	case CommTypeShared:
		color = c.p.ep.Node(c.world(c.rank))
	case CommType(Undefined):
	default:
		return nil, fmt.Errorf("%w: split type %d (CommTypeShared or Undefined)", ErrArg, splitType)
	}
	return c.Split(color, key)
}
