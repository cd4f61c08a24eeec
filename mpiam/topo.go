package mpiam

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Topology is the kind of virtual topology a communicator carries (MPI-4.1
// §8.5.5, MPI_Topo_test).
type Topology int

// Topologies TopoTest reports.
const (
	// TopoNone: no topology (MPI_UNDEFINED).
	TopoNone Topology = iota
	// TopoCart: a Cartesian grid (MPI_CART), made by CartCreate or CartSub.
	TopoCart
	// TopoDistGraph: a distributed graph (MPI_DIST_GRAPH), made by
	// DistGraphCreate or DistGraphCreateAdjacent.
	TopoDistGraph
	// TopoGraph: a graph every rank knows whole (MPI_GRAPH), made by
	// GraphCreate.
	TopoGraph
)

// cartTopo is a Cartesian topology: the grid's extent and periodicity per
// dimension, and the calling rank's coordinates. Rank r of the
// communicator sits at the coordinates of r in row-major order (the last
// dimension varies fastest), as MPI-4.1 §8.5.1 numbers a grid.
type cartTopo struct {
	dims    []int
	periods []bool
	coords  []int

	nbrOnce sync.Once
	nbrs    []int // the neighborhood collectives' neighbors, once computed (neighbors)
}

// shift is the rank step positions from this rank along dimension
// direction: wrapped on a periodic dimension, ProcNull past the edge of
// another.
func (t *cartTopo) shift(direction, step int) int {
	r := 0
	for i, x := range t.coords {
		d := t.dims[i]
		if i == direction {
			x += step
			if t.periods[i] {
				x = ((x % d) + d) % d
			} else if x < 0 || x >= d {
				return ProcNull
			}
		}
		r = r*d + x
	}
	return r
}

// neighbors is, for each dimension, the rank below and the rank above
// (CartShift(d, 1)): the order MPI-4.1 §8.6 gives the neighbors of a
// Cartesian topology. Computed once; the caller must not modify it.
func (t *cartTopo) neighbors() []int {
	t.nbrOnce.Do(func() {
		t.nbrs = make([]int, 0, 2*len(t.dims))
		for d := range t.dims {
			t.nbrs = append(t.nbrs, t.shift(d, -1), t.shift(d, 1))
		}
	})
	return t.nbrs
}

// TopoTest returns the kind of topology c carries (MPI_Topo_test, MPI-4.1
// §8.5.5): TopoCart for a communicator from CartCreate or CartSub,
// TopoDistGraph for one from DistGraphCreate or DistGraphCreateAdjacent,
// TopoGraph for one from GraphCreate, TopoNone otherwise. Errors: ErrComm for a nil or freed communicator.
func (c *Comm) TopoTest() (Topology, error) {
	if err := c.valid(); err != nil {
		return TopoNone, err
	}
	switch {
	case c.cart != nil:
		return TopoCart, nil
	case c.graph != nil:
		return TopoDistGraph, nil
	case c.ggraph != nil:
		return TopoGraph, nil
	}
	return TopoNone, nil
}

// DimsCreate fills the zero entries of dims, the extents of a grid of
// len(dims) dimensions, so that the grid has nnodes points and its extents
// are as close to each other as possible (MPI_Dims_create, MPI-4.1 §8.5.2):
// among the factorizations of nnodes over the free dimensions, the one whose
// largest and smallest extents differ least, in non-increasing order over the
// free entries. Entries already positive are kept. Errors: ErrDims for
// nnodes < 1, a negative entry, or nnodes not a multiple of the product of
// the positive entries.
func DimsCreate(nnodes int, dims []int) error {
	if nnodes < 1 {
		return fmt.Errorf("%w: DimsCreate of %d nodes", ErrDims, nnodes)
	}
	fixed, free := 1, 0
	for i, d := range dims {
		switch {
		case d < 0:
			return fmt.Errorf("%w: dims[%d] = %d is negative", ErrDims, i, d)
		case d == 0:
			free++
		default:
			fixed *= d
			if fixed > nnodes {
				return fmt.Errorf("%w: the given extents %v already exceed %d nodes", ErrDims, dims, nnodes)
			}
		}
	}
	if nnodes%fixed != 0 {
		return fmt.Errorf("%w: %d nodes are not a multiple of the given extents' product %d (%v)", ErrDims, nnodes, fixed, dims)
	}
	if free == 0 {
		if fixed != nnodes {
			return fmt.Errorf("%w: extents %v make %d nodes, not %d", ErrDims, dims, fixed, nnodes)
		}
		return nil
	}
	best := balanced(nnodes/fixed, free)
	k := 0
	for i := range dims {
		if dims[i] == 0 {
			dims[i] = best[k]
			k++
		}
	}
	return nil
}

// balanced returns the factorization of n into k factors, in non-increasing
// order, whose largest and smallest factors differ least (the first found,
// in decreasing lexicographic order, among equals).
func balanced(n, k int) []int {
	var best []int
	cur := make([]int, 0, k)
	var search func(rest, slots, limit int)
	search = func(rest, slots, limit int) {
		if slots == 1 {
			if rest > limit {
				return
			}
			cand := append(cur, rest)
			if best == nil || cand[0]-rest < best[0]-best[k-1] {
				best = slices.Clone(cand)
			}
			return
		}
		// The largest remaining factor is at least the slots-th root of
		// rest; stop at it.
		for _, d := range divisorsDown(rest) {
			if d > limit {
				continue
			}
			if pow(d, slots) < rest {
				break // d and smaller cannot be the largest of slots factors
			}
			cur = append(cur, d)
			search(rest/d, slots-1, d)
			cur = cur[:len(cur)-1]
		}
	}
	search(n, k, n)
	return best
}

// divisorsDown returns the divisors of n in decreasing order (trial division
// up to its square root).
func divisorsDown(n int) []int {
	var lo, hi []int
	for d := 1; d*d <= n; d++ {
		if n%d == 0 {
			lo = append(lo, d)
			if d != n/d {
				hi = append(hi, n/d)
			}
		}
	}
	slices.Reverse(lo)
	return append(hi, lo...)
}

// pow is b^e, saturating at a value above any rank count.
func pow(b, e int) int {
	r := 1
	for range e {
		if r > 1<<40/max(b, 1) {
			return 1 << 40
		}
		r *= b
	}
	return r
}

// CartCreate makes a communicator with a Cartesian topology of len(dims)
// dimensions, dims[i] ranks along dimension i, periodic (a torus) along
// those where periods[i] is true (MPI_Cart_create, MPI-4.1 §8.5.1): the
// first prod(dims) ranks of c, in c's order, row-major over the grid (rank
// r's coordinates are r's digits in the mixed radix dims, the last
// dimension varying fastest). The other ranks of c get nil (MPI_COMM_NULL).
// reorder is accepted and not used: ranks are never reordered, which MPI
// allows (a rank's place on the grid follows its rank in c). Collective
// over c: every rank passes the same dims and periods. Errors: ErrArg when
// len(periods) != len(dims), ErrDims for an extent below 1 or a grid larger
// than c, ErrNotSame when the ranks of c passed different grids.
func (c *Comm) CartCreate(dims []int, periods []bool, reorder bool) (*Comm, error) {
	if c.hooked() {
		var d *Comm
		err := c.p.hookErr(&Event{Call: CallCartCreate, Comm: c}, func() (err error) { d, err = c.cartCreate(dims, periods); return err })
		return d, err
	}
	return c.cartCreate(dims, periods)
}

func (c *Comm) cartCreate(dims []int, periods []bool) (*Comm, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	// Bad arguments are reported after the collective step, so that every
	// rank takes it whatever another rank passed.
	var bad error
	n := 1
	if len(periods) != len(dims) {
		bad = fmt.Errorf("%w: CartCreate with %d extents and %d periods", ErrArg, len(dims), len(periods))
	}
	for i, d := range dims {
		if bad != nil {
			break
		}
		if d < 1 {
			bad = fmt.Errorf("%w: CartCreate extent dims[%d] = %d", ErrDims, i, d)
		} else if n *= d; n > c.size {
			bad = fmt.Errorf("%w: CartCreate grid %v has more points than the communicator's %d ranks", ErrDims, dims, c.size)
		}
	}
	color := 0
	sig := int64(-1)
	if bad == nil {
		sig = gridSig(dims, periods)
	}
	if c.rank >= n || bad != nil {
		color = Undefined
	}
	d, err := c.splitAgreeing(color, c.rank, sig, "CartCreate grid")
	if bad != nil {
		return nil, bad
	}
	if err != nil || d == nil {
		return nil, err
	}
	d.cart = &cartTopo{dims: slices.Clone(dims), periods: slices.Clone(periods)}
	d.cart.coords = d.cart.coordsOf(d.rank)
	return d, nil
}

// gridSig is a signature of a grid for checking that every rank passed the
// same one.
func gridSig(dims []int, periods []bool) int64 {
	h := uint64(14695981039346656037) // FNV-1a
	mix := func(v uint64) {
		for range 8 {
			h ^= v & 0xff
			h *= 1099511628211
			v >>= 8
		}
	}
	mix(uint64(len(dims)))
	for i, d := range dims {
		p := uint64(0)
		if periods[i] {
			p = 1
		}
		mix(uint64(d)<<1 | p)
	}
	return int64(h >> 1)
}

// splitAgreeing is Split(color, key) that also checks that every rank passed
// the same sig: all ranks then return ErrNotSame, naming what, when they did
// not.
func (c *Comm) splitAgreeing(color, key int, sig int64, what string) (*Comm, error) {
	x, err := c.startColl(CallCommSplit, false)
	if err != nil {
		return nil, err
	}
	all := make([]int64, 3*c.size)
	if err := allgather(x, []int64{int64(color), int64(key), sig}, all); err != nil {
		return nil, err
	}
	for r := 0; r < c.size; r++ {
		if all[3*r+2] != all[2] {
			return nil, fmt.Errorf("%w: %s differs between rank 0 and rank %d", ErrNotSame, what, r)
		}
	}
	ctx, err := c.newContext()
	if err != nil {
		return nil, err
	}
	if color == Undefined {
		return nil, nil
	}
	return c.subComm(ctx, membersOf(all, 3, color)), nil
}

// coordsOf returns rank r's coordinates on the grid.
func (t *cartTopo) coordsOf(r int) []int {
	coords := make([]int, len(t.dims))
	for i := len(t.dims) - 1; i >= 0; i-- {
		coords[i] = r % t.dims[i]
		r /= t.dims[i]
	}
	return coords
}

// cartOf returns c's Cartesian topology. Errors: ErrComm, and ErrTopology
// when c has none.
func (c *Comm) cartOf(call string) (*cartTopo, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	if c.cart == nil {
		return nil, fmt.Errorf("%w: %s on a communicator without a Cartesian topology", ErrTopology, call)
	}
	return c.cart, nil
}

// CartDim returns the number of dimensions of c's grid (MPI_Cartdim_get,
// MPI-4.1 §8.5.5). Errors: ErrComm, ErrTopology when c has no Cartesian
// topology.
func (c *Comm) CartDim() (int, error) {
	t, err := c.cartOf("CartDim")
	if err != nil {
		return 0, err
	}
	return len(t.dims), nil
}

// CartGet returns c's grid: the extent and periodicity of each dimension
// and the calling rank's coordinates (MPI_Cart_get, MPI-4.1 §8.5.5), as
// fresh slices. Errors: ErrComm, ErrTopology when c has no Cartesian
// topology.
func (c *Comm) CartGet() (dims []int, periods []bool, coords []int, err error) {
	t, err := c.cartOf("CartGet")
	if err != nil {
		return nil, nil, nil, err
	}
	return slices.Clone(t.dims), slices.Clone(t.periods), slices.Clone(t.coords), nil
}

// CartRank returns the rank at the given coordinates (MPI_Cart_rank,
// MPI-4.1 §8.5.5). Along a periodic dimension any coordinate is taken modulo
// the extent. Errors: ErrComm, ErrTopology when c has no Cartesian topology,
// ErrArg for the wrong number of coordinates, ErrRank for a coordinate
// outside 0..dims[i]-1 along a non-periodic dimension.
func (c *Comm) CartRank(coords []int) (int, error) {
	t, err := c.cartOf("CartRank")
	if err != nil {
		return 0, err
	}
	if len(coords) != len(t.dims) {
		return 0, fmt.Errorf("%w: CartRank with %d coordinates on a %d-dimensional grid", ErrArg, len(coords), len(t.dims))
	}
	r := 0
	for i, x := range coords {
		d := t.dims[i]
		if t.periods[i] {
			x = ((x % d) + d) % d
		} else if x < 0 || x >= d {
			return 0, fmt.Errorf("%w: coordinate %d along non-periodic dimension %d of extent %d", ErrRank, x, i, d)
		}
		r = r*d + x
	}
	return r, nil
}

// CartCoords returns the coordinates of rank r on c's grid
// (MPI_Cart_coords, MPI-4.1 §8.5.5). Errors: ErrComm, ErrTopology when c has
// no Cartesian topology, ErrRank for r outside 0..Size()-1.
func (c *Comm) CartCoords(r int) ([]int, error) {
	t, err := c.cartOf("CartCoords")
	if err != nil {
		return nil, err
	}
	if r < 0 || r >= c.size {
		return nil, fmt.Errorf("%w: CartCoords of rank %d in a grid of %d ranks", ErrRank, r, c.size)
	}
	return t.coordsOf(r), nil
}

// CartShift returns the ranks to receive from and to send to for a shift of
// disp steps along dimension direction (MPI_Cart_shift, MPI-4.1 §8.5.6):
// dest is the rank disp steps up from the calling rank, source the rank
// disp steps down, wrapping around a periodic dimension and ProcNull past
// the edge of a non-periodic one. Use them with Sendrecv. Errors: ErrComm,
// ErrTopology when c has no Cartesian topology, ErrDims for a direction
// outside 0..CartDim()-1.
func (c *Comm) CartShift(direction, disp int) (source, dest int, err error) {
	t, err := c.cartOf("CartShift")
	if err != nil {
		return ProcNull, ProcNull, err
	}
	if direction < 0 || direction >= len(t.dims) {
		return ProcNull, ProcNull, fmt.Errorf("%w: CartShift direction %d of a %d-dimensional grid", ErrDims, direction, len(t.dims))
	}
	return t.shift(direction, -disp), t.shift(direction, disp), nil
}

// CartSub partitions c's grid into subgrids of the dimensions where remain
// is true (MPI_Cart_sub, MPI-4.1 §8.5.7): the ranks that share their
// coordinates along the dropped dimensions form one communicator, a grid of
// the kept dimensions (in their order, with their periodicity). With no
// dimension kept each rank gets a communicator of itself, a grid of zero
// dimensions. Collective over c. Errors: ErrComm, ErrTopology when c has no
// Cartesian topology, ErrArg when len(remain) != CartDim(), ErrNotSame when
// the ranks passed different remain.
func (c *Comm) CartSub(remain []bool) (*Comm, error) {
	if c.hooked() {
		var d *Comm
		err := c.p.hookErr(&Event{Call: CallCartSub, Comm: c}, func() (err error) { d, err = c.cartSub(remain); return err })
		return d, err
	}
	return c.cartSub(remain)
}

func (c *Comm) cartSub(remain []bool) (*Comm, error) {
	t, err := c.cartOf("CartSub")
	if err != nil {
		return nil, err
	}
	if len(remain) != len(t.dims) {
		// Reported after the collective step, which every rank takes.
		bad := fmt.Errorf("%w: CartSub with %d flags on a %d-dimensional grid", ErrArg, len(remain), len(t.dims))
		if _, err := c.splitAgreeing(Undefined, 0, -1, "CartSub's remain"); err != nil && !errors.Is(err, ErrNotSame) {
			return nil, err
		}
		return nil, bad
	}
	// The color is the rank of this rank's coordinates along the dropped
	// dimensions, the key its rank along the kept ones: both row-major.
	color, key := 0, 0
	var dims []int
	var periods []bool
	for i, keep := range remain {
		if keep {
			key = key*t.dims[i] + t.coords[i]
			dims = append(dims, t.dims[i])
			periods = append(periods, t.periods[i])
		} else {
			color = color*t.dims[i] + t.coords[i]
		}
	}
	d, err := c.splitAgreeing(color, key, gridSig(t.dims, remain), "CartSub's remain")
	if err != nil {
		return nil, err
	}
	d.cart = &cartTopo{dims: dims, periods: periods}
	d.cart.coords = d.cart.coordsOf(d.rank)
	return d, nil
}
