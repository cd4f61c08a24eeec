// Command halo3d runs a 3-D halo exchange: Jacobi sweeps of the 7-point
// stencil on an N x N x N grid split over a Cartesian process grid, the
// faces of each block exchanged every sweep with NeighborAlltoallw and
// subarray datatypes (or, with -mode isend, IsendTyped/IrecvTyped with the
// same datatypes), and checks the distributed result against a serial
// computation.
//
// The grid's unknowns start at ((7x + 13y + 17z) mod 101) / 100 and the
// boundary around the grid is held at 1.0. The ranks form a Px x Py x Pz grid
// chosen by DimsCreate, not periodic (the boundary is fixed), created with
// CartCreate; each rank owns a block (blocks differ by at most one plane
// when N does not divide evenly) stored with one ghost layer, and every
// sweep
//
//   - exchanges the six faces with the neighbours CartShift names (ProcNull
//     at the grid's edge, where the ghost layer keeps the boundary value):
//     face d-below of the block is the subarray of the first owned plane along
//     dimension d, received into the ghost plane of the neighbour above;
//   - sets every owned point to the mean of its six neighbours.
//
// It prints the process grid, the time per sweep, the part of it spent
// exchanging faces (which includes waiting for a neighbour still sweeping)
// and the time of an exchange only (before the sweeps, as many exchanges as
// sweeps, each after an untimed Barrier), each the slowest rank's mean in
// microseconds, in OSU's layout ("# Size", "Time per sweep (us)", "Exchange
// (us)", "Exchange only (us)") with -bench, one row per grid edge of -sizes
// (a comma-separated list; -n alone otherwise). With -check
// (on by default for N up to 96) rank 0 gathers the blocks, runs the same
// sweeps on the whole grid serially with the same arithmetic, and prints
// "halo3d: check PASSED" when they agree exactly (else FAILED, exit status 1).
// bench/ref/halo3d.c is the same program in C.
//
//	amrun -n 4 ./halo3d               # 48^3, 2 x 2 x 1 ranks
//	amrun -n 8 ./halo3d -n 96 -sweeps 50
//	amrun -n 2 ./halo3d -sizes 32,64,128 -sweeps 100 -bench
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/amgo-hpc/amgo/mpiam"
)

const boundary = 1.0

func main() {
	n := flag.Int("n", 48, "grid edge: N x N x N unknowns")
	sweeps := flag.Int("sweeps", 20, "Jacobi sweeps")
	mode := flag.String("mode", "neighbor", "halo exchange: neighbor (NeighborAlltoallw) or isend (IsendTyped/IrecvTyped)")
	check := flag.Bool("check", true, "compare with a serial computation on rank 0 (N up to 96 only)")
	bench := flag.Bool("bench", false, "print the time per sweep in OSU's layout")
	sizes := flag.String("sizes", "", "grid edges to run one after the other, comma-separated (with -bench; no check)")
	flag.Parse()
	edges := []int{*n}
	if *sizes != "" {
		edges = edges[:0]
		for _, f := range strings.Split(*sizes, ",") {
			e, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || e < 1 {
				fmt.Fprintf(os.Stderr, "halo3d: -sizes: bad edge %q\n", f)
				os.Exit(2)
			}
			edges = append(edges, e)
		}
		*check = false
	}
	if err := mpiam.Run(mpiam.Config{}, func(w *mpiam.Comm) error {
		for i, e := range edges {
			if err := run(w, e, *sweeps, *mode, *check && e <= 96, *bench, i == 0); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		fmt.Fprintln(os.Stderr, "halo3d:", err)
		os.Exit(1)
	}
}

// span is block i of k of n planes: [lo, hi).
func span(n, k, i int) (lo, hi int) {
	q, r := n/k, n%k
	lo = i*q + min(i, r)
	hi = lo + q
	if i < r {
		hi++
	}
	return lo, hi
}

// initial is the starting value of the unknown at global (x, y, z).
func initial(x, y, z int) float64 { return float64((7*x+13*y+17*z)%101) / 100 }

// block is a rank's part of the grid with its ghost layer: dims l, origin o
// (global coordinates of the first owned point), values in C order over
// (l[0]+2) x (l[1]+2) x (l[2]+2).
type block struct {
	l, o [3]int
	u, v []float64
}

func (b *block) at(i, j, k int) int { return (i*(b.l[1]+2)+j)*(b.l[2]+2) + k }

func newBlock(l, o [3]int) *block {
	b := &block{l: l, o: o}
	size := (l[0] + 2) * (l[1] + 2) * (l[2] + 2)
	b.u, b.v = make([]float64, size), make([]float64, size)
	for i := range b.u {
		b.u[i], b.v[i] = boundary, boundary
	}
	for i := 1; i <= l[0]; i++ {
		for j := 1; j <= l[1]; j++ {
			for k := 1; k <= l[2]; k++ {
				b.u[b.at(i, j, k)] = initial(o[0]+i-1, o[1]+j-1, o[2]+k-1)
			}
		}
	}
	return b
}

// sweep sets every owned point of dst to the mean of its six neighbours in src.
func (b *block) sweep(dst, src []float64) {
	sj, si, n := b.l[2]+2, (b.l[1]+2)*(b.l[2]+2), b.l[2]
	for i := 1; i <= b.l[0]; i++ {
		for j := 1; j <= b.l[1]; j++ {
			p := b.at(i, j, 1)
			// Row slices of equal length let the compiler drop the bounds
			// checks; the sum's order is the serial one's.
			out := dst[p : p+n]
			west, east := src[p-1:p-1+n], src[p+1:p+1+n]
			down, up := src[p-si:p-si+n], src[p+si:p+si+n]
			south, north := src[p-sj:p-sj+n], src[p+sj:p+sj+n]
			for k := range out {
				out[k] = (down[k] + up[k] + south[k] + north[k] + west[k] + east[k]) / 6
			}
		}
	}
}

// faces are the datatypes of the six faces, in the order of the Cartesian
// neighbours (dimension 0 below, above, dimension 1 below, ...): what is
// sent (the owned planes next to each face) and what is received (the ghost
// planes).
func (b *block) faces() (send, recv []*mpiam.Datatype, err error) {
	sizes := []int{b.l[0] + 2, b.l[1] + 2, b.l[2] + 2}
	for d := range 3 {
		for side := range 2 {
			sub := []int{b.l[0], b.l[1], b.l[2]}
			sub[d] = 1
			from := []int{1, 1, 1}
			to := []int{1, 1, 1}
			if side == 0 {
				from[d], to[d] = 1, 0
			} else {
				from[d], to[d] = b.l[d], b.l[d]+1
			}
			s, err := mpiam.TypeCreateSubarray(sizes, sub, from, mpiam.OrderC, mpiam.Float64)
			if err != nil {
				return nil, nil, err
			}
			r, err := mpiam.TypeCreateSubarray(sizes, sub, to, mpiam.OrderC, mpiam.Float64)
			if err != nil {
				return nil, nil, err
			}
			if err := s.Commit(); err != nil {
				return nil, nil, err
			}
			if err := r.Commit(); err != nil {
				return nil, nil, err
			}
			send, recv = append(send, s), append(recv, r)
		}
	}
	return send, recv, nil
}

func run(w *mpiam.Comm, n, sweeps int, mode string, check, bench, header bool) error {
	if mode != "neighbor" && mode != "isend" {
		return fmt.Errorf("-mode %q: neighbor or isend", mode)
	}
	dims := []int{0, 0, 0}
	if err := mpiam.DimsCreate(w.Size(), dims); err != nil {
		return err
	}
	cart, err := w.CartCreate(dims, []bool{false, false, false}, false)
	if err != nil {
		return err
	}
	coords, err := cart.CartCoords(cart.Rank())
	if err != nil {
		return err
	}
	var l, o [3]int
	for d := range 3 {
		lo, hi := span(n, dims[d], coords[d])
		l[d], o[d] = hi-lo, lo
		if l[d] == 0 {
			return fmt.Errorf("%d ranks along dimension %d for %d planes", dims[d], d, n)
		}
	}
	b := newBlock(l, o)
	send, recv, err := b.faces()
	if err != nil {
		return err
	}
	counts := []int{1, 1, 1, 1, 1, 1}
	displs := make([]int, 6)
	nbrs := make([]int, 0, 6)
	for d := range 3 {
		below, above, err := cart.CartShift(d, 1)
		if err != nil {
			return err
		}
		nbrs = append(nbrs, below, above)
	}
	exchange := func(u []float64) error {
		if mode == "neighbor" {
			return mpiam.NeighborAlltoallw(cart, u, counts, displs, send, u, counts, displs, recv)
		}
		reqs := make([]mpiam.Request, 0, 12)
		for f, nb := range nbrs {
			if nb == mpiam.ProcNull {
				continue
			}
			// The face received from the neighbour below travels up: tag by
			// the direction of travel, so that two faces between the same
			// pair never match each other.
			r, err := mpiam.IrecvTyped(cart, u, 1, recv[f], nb, f^1)
			if err != nil {
				return err
			}
			reqs = append(reqs, r)
		}
		for f, nb := range nbrs {
			if nb == mpiam.ProcNull {
				continue
			}
			s, err := mpiam.IsendTyped(cart, u, 1, send[f], nb, f)
			if err != nil {
				return err
			}
			reqs = append(reqs, s)
		}
		return mpiam.Waitall(reqs, nil)
	}
	// The exchange only: the ranks meet before each one, so that its time
	// is the faces' movement and not a neighbour's sweep. Exchanging the
	// initial grid again changes nothing the sweeps see.
	var alone time.Duration
	for range sweeps {
		if err := cart.Barrier(); err != nil {
			return err
		}
		x0 := time.Now()
		if err := exchange(b.u); err != nil {
			return err
		}
		alone += time.Since(x0)
	}
	if err := cart.Barrier(); err != nil {
		return err
	}
	t0 := time.Now()
	var inExchange time.Duration
	for range sweeps {
		x0 := time.Now()
		if err := exchange(b.u); err != nil {
			return err
		}
		inExchange += time.Since(x0)
		b.sweep(b.v, b.u)
		b.u, b.v = b.v, b.u
	}
	per := 1e6 / float64(max(sweeps, 1))
	el := []float64{time.Since(t0).Seconds() * per, inExchange.Seconds() * per, alone.Seconds() * per}
	slowest := []float64{0, 0, 0}
	if err := mpiam.Reduce(cart, el, slowest, mpiam.Max[float64](), 0); err != nil {
		return err
	}
	if cart.Rank() == 0 {
		if bench {
			if header {
				fmt.Printf("# amgo halo3d: %d ranks (%d x %d x %d), %s exchange, %d sweeps\n", w.Size(), dims[0], dims[1], dims[2], mode, sweeps)
				fmt.Printf("%-10s%20s%20s%20s\n", "# Size", "Time per sweep (us)", "Exchange (us)", "Exchange only (us)")
			}
			fmt.Printf("%-10d%20.2f%20.2f%20.2f\n", n, slowest[0], slowest[1], slowest[2])
		} else {
			fmt.Printf("halo3d: %d^3 on %d x %d x %d ranks, %s exchange: %d sweeps, %.1f us per sweep, %.1f us of it exchanging, %.1f us an exchange only\n",
				n, dims[0], dims[1], dims[2], mode, sweeps, slowest[0], slowest[1], slowest[2])
		}
	}
	if !check {
		return nil
	}
	return verify(cart, b, n, sweeps)
}

// verify gathers the blocks on rank 0 and compares them with the same
// sweeps run serially on the whole grid.
func verify(cart *mpiam.Comm, b *block, n, sweeps int) error {
	// Each rank sends its owned points (a subarray of its block), with its
	// origin and extents ahead.
	sizes := []int{b.l[0] + 2, b.l[1] + 2, b.l[2] + 2}
	owned, err := mpiam.TypeCreateSubarray(sizes, b.l[:], []int{1, 1, 1}, mpiam.OrderC, mpiam.Float64)
	if err != nil {
		return err
	}
	if err := owned.Commit(); err != nil {
		return err
	}
	const tagShape, tagData = 1, 2
	shape := []int{b.o[0], b.o[1], b.o[2], b.l[0], b.l[1], b.l[2]}
	if cart.Rank() != 0 {
		if err := mpiam.Send(cart, shape, 0, tagShape); err != nil {
			return err
		}
		return mpiam.SendTyped(cart, b.u, 1, owned, 0, tagData)
	}
	whole := newBlock([3]int{n, n, n}, [3]int{})
	for range sweeps {
		whole.sweep(whole.v, whole.u)
		whole.u, whole.v = whole.v, whole.u
	}
	worst := 0.0
	compare := func(shape []int, got []float64) {
		m := 0
		for i := range shape[3] {
			for j := range shape[4] {
				for k := range shape[5] {
					want := whole.u[whole.at(shape[0]+i+1, shape[1]+j+1, shape[2]+k+1)]
					if d := got[m] - want; d > worst || -d > worst {
						worst = max(d, -d)
					}
					m++
				}
			}
		}
	}
	mine := make([]float64, 0, b.l[0]*b.l[1]*b.l[2])
	for i := 1; i <= b.l[0]; i++ {
		for j := 1; j <= b.l[1]; j++ {
			for k := 1; k <= b.l[2]; k++ {
				mine = append(mine, b.u[b.at(i, j, k)])
			}
		}
	}
	compare(shape, mine)
	for r := 1; r < cart.Size(); r++ {
		sh := make([]int, 6)
		if _, err := mpiam.Recv(cart, sh, r, tagShape); err != nil {
			return err
		}
		got := make([]float64, sh[3]*sh[4]*sh[5])
		if _, err := mpiam.Recv(cart, got, r, tagData); err != nil {
			return err
		}
		compare(sh, got)
	}
	if worst != 0 {
		fmt.Printf("halo3d: check FAILED: largest difference from the serial result %g\n", worst)
		return fmt.Errorf("check failed")
	}
	fmt.Println("halo3d: check PASSED")
	return nil
}
