package mpiam

import (
	"fmt"
	"slices"
)

// Group is an ordered set of processes (MPI_Group, MPI-4.1 §7.3), named by
// their ranks in the world communicator. A group's rank i is its i-th member.
// Groups are values: operations return new groups.
type Group struct {
	world []int // world rank of each member, in group-rank order
	me    int   // this process's world rank
}

// GroupEmpty is the group with no members (MPI_GROUP_EMPTY).
var GroupEmpty = Group{}

// Comparison results of groups and communicators (MPI_IDENT, MPI_CONGRUENT,
// MPI_SIMILAR, MPI_UNEQUAL).
const (
	Ident     = 0
	Congruent = 1
	Similar   = 2
	Unequal   = 3
)

// Group returns c's group (MPI_Comm_group).
func (c *Comm) Group() (Group, error) {
	if err := c.valid(); err != nil {
		return Group{}, err
	}
	g := Group{world: make([]int, c.size), me: c.p.world.rank}
	for i := range g.world {
		g.world[i] = c.world(i)
	}
	return g, nil
}

// Size is the number of members (MPI_Group_size).
func (g Group) Size() int { return len(g.world) }

// Rank is the calling process's rank in g, or Undefined if it is not a member
// (MPI_Group_rank).
func (g Group) Rank() int {
	if i := slices.Index(g.world, g.me); i >= 0 {
		return i
	}
	return Undefined
}

func (g Group) check(ranks []int) error {
	seen := make(map[int]bool, len(ranks))
	for _, r := range ranks {
		if r < 0 || r >= len(g.world) {
			return fmt.Errorf("%w: %d (group has %d members)", ErrRank, r, len(g.world))
		}
		if seen[r] {
			return fmt.Errorf("%w: rank %d listed twice", ErrRank, r)
		}
		seen[r] = true
	}
	return nil
}

// Incl returns the group of g's members ranks[0], ranks[1], ... in that order
// (MPI_Group_incl). Errors: ErrRank for a rank outside g or listed twice.
func (g Group) Incl(ranks []int) (Group, error) {
	if err := g.check(ranks); err != nil {
		return Group{}, err
	}
	n := Group{world: make([]int, len(ranks)), me: g.me}
	for i, r := range ranks {
		n.world[i] = g.world[r]
	}
	return n, nil
}

// Excl returns g without the members ranks, the others in their order
// (MPI_Group_excl). Errors: ErrRank.
func (g Group) Excl(ranks []int) (Group, error) {
	if err := g.check(ranks); err != nil {
		return Group{}, err
	}
	n := Group{me: g.me}
	for i, w := range g.world {
		if !slices.Contains(ranks, i) {
			n.world = append(n.world, w)
		}
	}
	return n, nil
}

// Union returns g's members followed by h's members not in g (MPI_Group_union).
func (g Group) Union(h Group) Group {
	n := Group{world: slices.Clone(g.world), me: g.me}
	for _, w := range h.world {
		if !slices.Contains(g.world, w) {
			n.world = append(n.world, w)
		}
	}
	return n
}

// Intersection returns g's members that are also in h, in g's order
// (MPI_Group_intersection).
func (g Group) Intersection(h Group) Group {
	n := Group{me: g.me}
	for _, w := range g.world {
		if slices.Contains(h.world, w) {
			n.world = append(n.world, w)
		}
	}
	return n
}

// Difference returns g's members not in h, in g's order (MPI_Group_difference).
func (g Group) Difference(h Group) Group {
	n := Group{me: g.me}
	for _, w := range g.world {
		if !slices.Contains(h.world, w) {
			n.world = append(n.world, w)
		}
	}
	return n
}

// TranslateRanks returns, for each rank of g in ranks, the rank of the same
// process in h, or Undefined if it is not in h (MPI_Group_translate_ranks).
// ProcNull translates to ProcNull. Errors: ErrRank.
func (g Group) TranslateRanks(ranks []int, h Group) ([]int, error) {
	out := make([]int, len(ranks))
	for i, r := range ranks {
		if r == ProcNull {
			out[i] = ProcNull
			continue
		}
		if r < 0 || r >= len(g.world) {
			return nil, fmt.Errorf("%w: %d (group has %d members)", ErrRank, r, len(g.world))
		}
		out[i] = Undefined
		if j := slices.Index(h.world, g.world[r]); j >= 0 {
			out[i] = j
		}
	}
	return out, nil
}

// Compare returns Ident if g and h have the same members in the same order,
// Similar if the same members in another order, else Unequal (MPI_Group_compare).
func (g Group) Compare(h Group) int {
	if slices.Equal(g.world, h.world) {
		return Ident
	}
	if len(g.world) != len(h.world) {
		return Unequal
	}
	a, b := slices.Clone(g.world), slices.Clone(h.world)
	slices.Sort(a)
	slices.Sort(b)
	if slices.Equal(a, b) {
		return Similar
	}
	return Unequal
}

// Compare compares two communicators (MPI_Comm_compare): Ident for the same
// communicator, Congruent for the same group in the same order with another
// context, Similar for the same members in another order, else Unequal.
func (c *Comm) Compare(d *Comm) (int, error) {
	if err := c.valid(); err != nil {
		return Unequal, err
	}
	if err := d.valid(); err != nil {
		return Unequal, err
	}
	if c == d || c.ctx == d.ctx && c.p == d.p {
		return Ident, nil
	}
	g, _ := c.Group()
	h, _ := d.Group()
	switch g.Compare(h) {
	case Ident:
		return Congruent, nil
	case Similar:
		return Similar, nil
	}
	return Unequal, nil
}
