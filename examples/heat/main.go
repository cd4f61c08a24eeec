// Command heat solves the steady 2-D heat equation (Laplace's equation) on a
// rectangular plate by Jacobi iteration, distributed over the ranks of an MPI job
// with mpiam, and checks the distributed result against a serial solve.
//
// The plate is a grid of NX x NY unknowns (-nx, -ny) with fixed boundary
// values around it: the top edge is held at 1.0, the other three at 0.0, and
// the interior starts at 0.0. The ranks form a Px x Py process grid, as square
// as the number of ranks allows (any count works: a prime count gives a 1 x n
// or n x 1 grid, one rank the whole plate), and each rank owns a block of the
// grid (blocks differ by at most one row or column when the grid does not
// divide evenly), stored with one ghost layer around it. Every iteration
//
//   - exchanges halos: Irecv from and Isend to the four neighbours (ProcNull
//     beyond the plate's edges, where the ghost layer holds the boundary
//     values), rows sent in place and columns packed, completed by Waitall;
//   - updates every owned point to the mean of its four neighbours (Jacobi);
//   - every -k iterations, reduces the largest change over all ranks (the
//     residual) with Allreduce(Max) on a communicator Dup'ed for it, and stops
//     once it falls below -tol or after -iters iterations.
//
// Then rank 0 gathers the blocks with Send/Recv, runs the same number of
// iterations serially on the whole grid with the same update code (so the
// floating-point operations happen in the same order and the results agree
// exactly), and compares the solutions and the final residuals. It prints
// the grid, the process grid, the iteration count, the final residual, the
// times, the largest difference from the serial solution, and
// "heat: check PASSED" (difference at most 1e-12) or "heat: check FAILED"
// (and the program exits with status 1).
//
//	amrun -n 4 ./heat                 # 256 x 256 on a 2 x 2 process grid
//	amrun -n 4 ./heat -nx 512         # a wider plate
//	amrun -n 3 ./heat -iters 5000 -tol 1e-5
//	amrun -n 6 --transport loop ./heat   # goroutine ranks
//	./heat                            # one rank, no launcher
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/amgo-hpc/amgo/mpiam"
)

// Tags: a halo message's tag is the direction it travels.
const (
	tagNorth = 1 + iota // to the neighbour above (smaller y)
	tagSouth
	tagWest // to the neighbour on the left (smaller x)
	tagEast
	tagGather
)

// Boundary values.
const (
	topValue   = 1.0
	otherValue = 0.0
)

// maxDiff is the largest difference from the serial solution the check accepts.
const maxDiff = 1e-12

type params struct {
	nx, ny  int
	iters   int
	tol     float64
	k       int
	check   bool
	verbose bool
}

func main() {
	var p params
	flag.IntVar(&p.nx, "nx", 256, "grid points in x (columns), without the boundary")
	flag.IntVar(&p.ny, "ny", 256, "grid points in y (rows), without the boundary")
	flag.IntVar(&p.iters, "iters", 10000, "maximum number of iterations")
	flag.Float64Var(&p.tol, "tol", 5e-5, "stop when the largest change in an iteration is below this")
	flag.IntVar(&p.k, "k", 50, "compute the global residual every k iterations")
	flag.BoolVar(&p.check, "check", true, "compare with a serial solve on rank 0")
	flag.BoolVar(&p.verbose, "v", false, "print the residual at every check")
	flag.Parse()
	if p.nx < 1 || p.ny < 1 || p.iters < 1 || p.k < 1 || !(p.tol >= 0) {
		fmt.Fprintln(os.Stderr, "heat: need -nx, -ny, -iters, -k >= 1 and -tol >= 0")
		os.Exit(2)
	}
	if err := mpiam.Run(mpiam.Config{}, func(world *mpiam.Comm) error { return heat(world, p) }); err != nil {
		fmt.Fprintln(os.Stderr, "heat:", err)
		os.Exit(1)
	}
}

// procGrid splits n ranks into px x py = n, as square as possible: py is the
// largest divisor of n not above sqrt(n). The longer side of the process grid
// goes along the longer side of the plate; it fails if a side would have more
// ranks than grid points.
func procGrid(n, nx, ny int) (px, py int, err error) {
	py = 1
	for d := 1; d*d <= n; d++ {
		if n%d == 0 {
			py = d
		}
	}
	px = n / py
	if ny > nx {
		px, py = py, px
	}
	if px > nx || py > ny {
		px, py = py, px
	}
	if px > nx || py > ny {
		return 0, 0, fmt.Errorf("a %d x %d grid cannot be split over %d ranks (process grid %d x %d)", nx, ny, n, px, py)
	}
	return px, py, nil
}

// span is the part [off, off+len) of n points that block c of p owns: the first
// n%p blocks have one point more.
func span(n, p, c int) (off, length int) {
	q, r := n/p, n%p
	return c*q + min(c, r), q + btoi(c < r)
}

// rangeOf prints lo..hi, or lo when they are equal.
func rangeOf(lo, hi int) string {
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d..%d", lo, hi)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// block is a rank's part of the grid: lx x ly points at (x0, y0) of the
// global grid, stored with a ghost layer as (ly+2) rows of lx+2 values.
type block struct {
	x0, y0, lx, ly int
}

func (b block) stride() int { return b.lx + 2 }

// newField allocates a block's array with the boundary values in the ghost
// cells that lie on the plate's edges (top row at topValue), given whether the
// block touches each edge.
func newField(b block, top, bottom, left, right bool) []float64 {
	s := b.stride()
	u := make([]float64, (b.ly+2)*s)
	for j := 1; j <= b.lx; j++ {
		if top {
			u[j] = topValue
		}
		if bottom {
			u[(b.ly+1)*s+j] = otherValue
		}
	}
	for i := 1; i <= b.ly; i++ {
		if left {
			u[i*s] = otherValue
		}
		if right {
			u[i*s+b.lx+1] = otherValue
		}
	}
	return u
}

// sweep is one Jacobi update of b's points from u into v; it returns the
// largest change. The distributed and the serial solves both run it, so that
// every point's new value comes from the same operations in the same order.
func sweep(u, v []float64, b block) float64 {
	s := b.stride()
	var change float64
	for i := 1; i <= b.ly; i++ {
		row := i * s
		up, cur, down := u[row-s:row], u[row:row+s], u[row+s:row+2*s]
		out := v[row : row+s]
		for j := 1; j <= b.lx; j++ {
			nv := 0.25 * (up[j] + down[j] + cur[j-1] + cur[j+1])
			if d := math.Abs(nv - cur[j]); d > change {
				change = d
			}
			out[j] = nv
		}
	}
	return change
}

// halo holds a rank's neighbours and the buffers of the column exchange.
type halo struct {
	north, south, west, east   int // neighbour ranks or ProcNull
	sendW, sendE, recvW, recvE []float64
	reqs                       []mpiam.Request
}

// exchange fills u's ghost cells from the neighbours' edge points: rows are
// sent and received in place, columns through the pack buffers.
func (h *halo) exchange(c *mpiam.Comm, u []float64, b block) error {
	s, lx, ly := b.stride(), b.lx, b.ly
	h.reqs = h.reqs[:0]
	post := func(r mpiam.Request, err error) error {
		h.reqs = append(h.reqs, r)
		return err
	}
	// Receives first, so that the sends find them posted.
	if err := post(mpiam.Irecv(c, u[1:1+lx], h.north, tagSouth)); err != nil {
		return err
	}
	if err := post(mpiam.Irecv(c, u[(ly+1)*s+1:(ly+1)*s+1+lx], h.south, tagNorth)); err != nil {
		return err
	}
	if err := post(mpiam.Irecv(c, h.recvW, h.west, tagEast)); err != nil {
		return err
	}
	if err := post(mpiam.Irecv(c, h.recvE, h.east, tagWest)); err != nil {
		return err
	}
	for i := 1; i <= ly; i++ {
		h.sendW[i-1] = u[i*s+1]
		h.sendE[i-1] = u[i*s+lx]
	}
	if err := post(mpiam.Isend(c, u[s+1:s+1+lx], h.north, tagNorth)); err != nil {
		return err
	}
	if err := post(mpiam.Isend(c, u[ly*s+1:ly*s+1+lx], h.south, tagSouth)); err != nil {
		return err
	}
	if err := post(mpiam.Isend(c, h.sendW, h.west, tagWest)); err != nil {
		return err
	}
	if err := post(mpiam.Isend(c, h.sendE, h.east, tagEast)); err != nil {
		return err
	}
	if err := mpiam.Waitall(h.reqs, nil); err != nil {
		return err
	}
	for i := 1; i <= ly; i++ {
		if h.west != mpiam.ProcNull {
			u[i*s] = h.recvW[i-1]
		}
		if h.east != mpiam.ProcNull {
			u[i*s+lx+1] = h.recvE[i-1]
		}
	}
	return nil
}

// allreduceMax returns the largest v over c's ranks: every rank sends its value
// to rank 0, which takes the maximum and sends it back to all.
func allreduceMax(c *mpiam.Comm, v float64) (float64, error) {
	out := []float64{0}
	err := mpiam.Allreduce(c, []float64{v}, out, mpiam.Max[float64]())
	return out[0], err
}

func heat(world *mpiam.Comm, p params) error {
	n, me := world.Size(), world.Rank()
	px, py, err := procGrid(n, p.nx, p.ny)
	if err != nil {
		return err
	}
	cx, cy := me%px, me/px
	blockOf := func(cx, cy int) block {
		x0, lx := span(p.nx, px, cx)
		y0, ly := span(p.ny, py, cy)
		return block{x0: x0, y0: y0, lx: lx, ly: ly}
	}
	b := blockOf(cx, cy)
	rankAt := func(x, y int) int {
		if x < 0 || x >= px || y < 0 || y >= py {
			return mpiam.ProcNull
		}
		return y*px + x
	}
	h := &halo{
		north: rankAt(cx, cy-1), south: rankAt(cx, cy+1),
		west: rankAt(cx-1, cy), east: rankAt(cx+1, cy),
		sendW: make([]float64, b.ly), sendE: make([]float64, b.ly),
		recvW: make([]float64, b.ly), recvE: make([]float64, b.ly),
	}
	u := newField(b, cy == 0, cy == py-1, cx == 0, cx == px-1)
	v := newField(b, cy == 0, cy == py-1, cx == 0, cx == px-1)

	red, err := world.Dup() // the residual reduction's own communicator
	if err != nil {
		return err
	}
	if me == 0 {
		// Rank 0's block is the largest, the last rank's the smallest.
		small := blockOf(px-1, py-1)
		fmt.Printf("heat: grid %d x %d, process grid %d x %d (%d ranks), blocks of %s x %s points\n",
			p.nx, p.ny, px, py, n, rangeOf(small.lx, b.lx), rangeOf(small.ly, b.ly))
	}
	if err := world.Barrier(); err != nil {
		return err
	}
	start := time.Now()
	iters, residual := 0, math.Inf(1)
	for it := 1; it <= p.iters; it++ {
		if err := h.exchange(world, u, b); err != nil {
			return fmt.Errorf("iteration %d: halo exchange: %w", it, err)
		}
		change := sweep(u, v, b)
		u, v = v, u
		iters = it
		if it%p.k == 0 || it == p.iters {
			if residual, err = allreduceMax(red, change); err != nil {
				return fmt.Errorf("iteration %d: residual: %w", it, err)
			}
			if p.verbose && me == 0 {
				fmt.Printf("heat: iteration %6d: residual %.6e\n", it, residual)
			}
			if residual < p.tol {
				break
			}
		}
	}
	elapsed := time.Since(start)
	if err := red.Free(); err != nil {
		return err
	}

	// Gather the blocks on rank 0.
	if me != 0 {
		out := make([]float64, 0, b.lx*b.ly)
		s := b.stride()
		for i := 1; i <= b.ly; i++ {
			out = append(out, u[i*s+1:i*s+1+b.lx]...)
		}
		return mpiam.Send(world, out, 0, tagGather)
	}
	state := "converged"
	if residual >= p.tol {
		state = "not converged"
	}
	fmt.Printf("heat: %d iterations (max %d, tol %.1e, residual every %d): final residual %.6e, %s\n",
		iters, p.iters, p.tol, p.k, residual, state)
	fmt.Printf("heat: time %.3f s, %.1f us per iteration\n", elapsed.Seconds(), elapsed.Seconds()/float64(iters)*1e6)
	all := block{lx: p.nx, ly: p.ny}
	gs := all.stride()
	got := make([]float64, p.nx*p.ny) // the gathered solution, without the boundary
	place := func(bb block, vals []float64) {
		for i := 0; i < bb.ly; i++ {
			copy(got[(bb.y0+i)*p.nx+bb.x0:], vals[i*bb.lx:(i+1)*bb.lx])
		}
	}
	mine := make([]float64, 0, b.lx*b.ly)
	for i := 1; i <= b.ly; i++ {
		mine = append(mine, u[i*b.stride()+1:i*b.stride()+1+b.lx]...)
	}
	place(b, mine)
	for r := 1; r < n; r++ {
		bb := blockOf(r%px, r/px)
		vals := make([]float64, bb.lx*bb.ly)
		st, err := mpiam.Recv(world, vals, r, tagGather)
		if err != nil {
			return fmt.Errorf("gather from rank %d: %w", r, err)
		}
		if mpiam.GetCount[float64](st) != len(vals) {
			return fmt.Errorf("gather from rank %d: %d bytes, want %d values", r, st.Bytes, len(vals))
		}
		place(bb, vals)
	}
	if !p.check {
		return nil
	}

	// The serial solve: the same sweeps over the whole grid.
	sstart := time.Now()
	su, sv := newField(all, true, true, true, true), newField(all, true, true, true, true)
	var schange float64
	for it := 1; it <= iters; it++ {
		schange = sweep(su, sv, all)
		su, sv = sv, su
	}
	serial := time.Since(sstart)
	diff := 0.0
	for i := 0; i < p.ny; i++ {
		for j := 0; j < p.nx; j++ {
			d := math.Abs(got[i*p.nx+j] - su[(i+1)*gs+j+1])
			if !(d <= diff) { // also catches NaN
				diff = d
			}
		}
	}
	fmt.Printf("heat: serial check: %d iterations in %.3f s, residual %.6e; max |parallel - serial| = %.3e\n",
		iters, serial.Seconds(), schange, diff)
	if !(diff <= maxDiff) || math.Abs(schange-residual) > maxDiff {
		fmt.Println("heat: check FAILED")
		return fmt.Errorf("the distributed solution differs from the serial one by %.3e (residual %.6e vs %.6e)", diff, residual, schange)
	}
	fmt.Println("heat: check PASSED")
	return nil
}
