package mpiam

import (
	"fmt"
	"unsafe"

	"github.com/amgo-hpc/amgo/mpiam/internal/sched"
)

// The v collectives and the prefix and reduce-scatter reductions with
// datatypes (MPI-4.1 §6.5-6.11 with chapter 5's datatypes). Counts are
// instances of the datatype and displacements are in extents of it, as in
// MPI; the blocks are staged packed, and the slice form runs on the packed
// bytes (coll_typed.go).

// vBlocks stages the blocks of a v collective's buffer: block i is
// counts[i] instances of d starting displs[i] extents of d into buf.
func vBlocks[T any](buf []T, counts, displs []int, d *Datatype, n int, what string) (blocksW, error) {
	if len(counts) != n || len(displs) != n {
		return blocksW{}, fmt.Errorf("%w: %s needs %d counts and displacements, got %d and %d", ErrCount, what, n, len(counts), len(displs))
	}
	_, ext, err := d.Extent()
	if err != nil {
		return blocksW{}, err
	}
	bd, types := make([]int, n), make([]*Datatype, n)
	for i := range n {
		if displs[i] < 0 {
			return blocksW{}, fmt.Errorf("%w: %s displacement %d of block %d", ErrCount, what, displs[i], i)
		}
		bd[i], types[i] = displs[i]*ext, d
	}
	return blocksOf(buf, counts, bd, types, n, what)
}

// GathervTyped is GatherTyped with a count and displacement per rank at
// root (MPI_Gatherv with datatypes): rank i's data lands as rcounts[i]
// instances of rd starting displs[i] extents of rd into recv. A nil send
// at root means in place. Errors: those of Gatherv, ErrType, ErrBuffer.
func GathervTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcounts, displs []int, rd *Datatype, root int) error {
	s, r, sst, err := gathervArgs(c, send, scount, sd, recv, rcounts, displs, rd, root)
	if err != nil {
		return err
	}
	if send == nil {
		r.pack()
	}
	s.pack(sst)
	if err := Gatherv(c, sst, r.st, r.counts, r.displs, root); err != nil {
		return err
	}
	r.unpack()
	return nil
}

// IgathervTyped starts a GathervTyped (MPI_Igatherv with datatypes);
// errors at the call as GathervTyped's.
func IgathervTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcounts, displs []int, rd *Datatype, root int) (Request, error) {
	return igathervTyped(c, send, scount, sd, recv, rcounts, displs, rd, root, false)
}

// GathervInitTyped makes a persistent request of the same operation (MPI_Gatherv_init
// with datatypes, MPI-4.1 §6.13); errors as IgathervTyped's.
func GathervInitTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcounts, displs []int, rd *Datatype, root int) (Request, error) {
	return igathervTyped(c, send, scount, sd, recv, rcounts, displs, rd, root, true)
}

func igathervTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcounts, displs []int, rd *Datatype, root int, init bool) (Request, error) {
	s, r, sst, err := gathervArgs(c, send, scount, sd, recv, rcounts, displs, rd, root)
	if err != nil {
		return Request{}, err
	}
	inner := gatherSched(sst, r.st, r.counts, r.displs, root, true)
	return c.startOrInit(init, CallIgatherv, CallGathervInit, root, len(sst), func(x coll, b *sched.Builder) error {
		if send == nil && r.args != nil {
			b.Call(func() error { r.pack(); return nil })
		}
		s.packStep(b, sst)
		return staged(blocksW{}, r, inner)(x, b)
	})
}

func gathervArgs[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcounts, displs []int, rd *Datatype, root int) (s typedArg, r blocksW, sst []byte, err error) {
	if err = checkRoot(c, root); err != nil {
		return
	}
	if c.rank == root {
		if r, err = vBlocks(recv, rcounts, displs, rd, c.size, "Gatherv receive"); err != nil {
			return
		}
		if send == nil {
			return // in place: the root's block is in recv (packed by the caller)
		}
	}
	if s, err = argOf(send, scount, sd); err != nil {
		return
	}
	sst = s.staged()
	return
}

// ScattervTyped is ScatterTyped with a count and displacement per rank at
// root (MPI_Scatterv with datatypes): rank i gets scounts[i] instances of
// sd starting displs[i] extents of sd into root's send. A nil recv at root
// means in place. Errors: those of Scatterv, ErrType, ErrBuffer.
func ScattervTyped[S, R any](c *Comm, send []S, scounts, displs []int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int) error {
	s, r, rst, err := scattervArgs(c, send, scounts, displs, sd, recv, rcount, rd, root)
	if err != nil {
		return err
	}
	s.pack()
	if err := Scatterv(c, s.st, s.counts, s.displs, rst, root); err != nil {
		return err
	}
	r.unpack(rst)
	return nil
}

// IscattervTyped starts a ScattervTyped (MPI_Iscatterv with datatypes);
// errors at the call as ScattervTyped's.
func IscattervTyped[S, R any](c *Comm, send []S, scounts, displs []int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int) (Request, error) {
	return iscattervTyped(c, send, scounts, displs, sd, recv, rcount, rd, root, false)
}

// ScattervInitTyped makes a persistent request of the same operation (MPI_Scatterv_init
// with datatypes, MPI-4.1 §6.13); errors as IscattervTyped's.
func ScattervInitTyped[S, R any](c *Comm, send []S, scounts, displs []int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int) (Request, error) {
	return iscattervTyped(c, send, scounts, displs, sd, recv, rcount, rd, root, true)
}

func iscattervTyped[S, R any](c *Comm, send []S, scounts, displs []int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int, init bool) (Request, error) {
	s, r, rst, err := scattervArgs(c, send, scounts, displs, sd, recv, rcount, rd, root)
	if err != nil {
		return Request{}, err
	}
	inner := staged(s, blocksW{}, scatterSched(s.st, s.counts, s.displs, rst, root, true))
	return c.startOrInit(init, CallIscatterv, CallScattervInit, root, len(rst), func(x coll, b *sched.Builder) error {
		if err := inner(x, b); err != nil {
			return err
		}
		r.unpackStep(b, rst)
		return nil
	})
}

func scattervArgs[S, R any](c *Comm, send []S, scounts, displs []int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int) (s blocksW, r typedArg, rst []byte, err error) {
	if err = checkRoot(c, root); err != nil {
		return
	}
	if c.rank == root {
		if s, err = vBlocks(send, scounts, displs, sd, c.size, "Scatterv send"); err != nil {
			return
		}
		if recv == nil {
			return
		}
	}
	if r, err = argOf(recv, rcount, rd); err != nil {
		return
	}
	rst = r.staged()
	return
}

// AllgathervTyped is AllgatherTyped with a count and displacement per rank
// (MPI_Allgatherv with datatypes): rank i's data lands as rcounts[i]
// instances of rd starting displs[i] extents of rd into recv. A nil send
// means in place. Errors: those of Allgatherv, ErrType, ErrBuffer.
func AllgathervTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcounts, displs []int, rd *Datatype) error {
	s, r, sst, err := allgathervArgs(c, send, scount, sd, recv, rcounts, displs, rd)
	if err != nil {
		return err
	}
	if send == nil {
		r.pack()
	}
	s.pack(sst)
	if err := Allgatherv(c, sst, r.st, r.counts, r.displs); err != nil {
		return err
	}
	r.unpack()
	return nil
}

// IallgathervTyped starts an AllgathervTyped (MPI_Iallgatherv with
// datatypes); errors at the call as AllgathervTyped's.
func IallgathervTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcounts, displs []int, rd *Datatype) (Request, error) {
	return iallgathervTyped(c, send, scount, sd, recv, rcounts, displs, rd, false)
}

// AllgathervInitTyped makes a persistent request of the same operation (MPI_Allgatherv_init
// with datatypes, MPI-4.1 §6.13); errors as IallgathervTyped's.
func AllgathervInitTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcounts, displs []int, rd *Datatype) (Request, error) {
	return iallgathervTyped(c, send, scount, sd, recv, rcounts, displs, rd, true)
}

func iallgathervTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcounts, displs []int, rd *Datatype, init bool) (Request, error) {
	s, r, sst, err := allgathervArgs(c, send, scount, sd, recv, rcounts, displs, rd)
	if err != nil {
		return Request{}, err
	}
	inner := staged(blocksW{}, r, allgatherSched(sst, r.st, r.counts, r.displs, true))
	return c.startOrInit(init, CallIallgatherv, CallAllgathervInit, AnySource, len(sst), func(x coll, b *sched.Builder) error {
		if send == nil {
			b.Call(func() error { r.pack(); return nil })
		}
		s.packStep(b, sst)
		return inner(x, b)
	})
}

func allgathervArgs[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcounts, displs []int, rd *Datatype) (s typedArg, r blocksW, sst []byte, err error) {
	if err = c.valid(); err != nil {
		return
	}
	if r, err = vBlocks(recv, rcounts, displs, rd, c.size, "Allgatherv receive"); err != nil {
		return
	}
	if send == nil {
		return // in place: packed with recv by the caller
	}
	if s, err = argOf(send, scount, sd); err != nil {
		return
	}
	sst = s.staged()
	return
}

// AlltoallvTyped is AlltoallTyped with a count and displacement per rank
// (MPI_Alltoallv with datatypes): scounts[j] instances of sd starting
// sdispls[j] extents of sd into send go to rank j, and rank i's data lands
// as rcounts[i] instances of rd starting rdispls[i] extents of rd into
// recv. Errors: those of Alltoallv, ErrType, ErrBuffer.
func AlltoallvTyped[S, R any](c *Comm, send []S, scounts, sdispls []int, sd *Datatype, recv []R, rcounts, rdispls []int, rd *Datatype) error {
	s, r, err := alltoallvArgs(c, send, scounts, sdispls, sd, recv, rcounts, rdispls, rd)
	if err != nil {
		return err
	}
	s.pack()
	if err := Alltoallv(c, s.st, s.counts, s.displs, r.st, r.counts, r.displs); err != nil {
		return err
	}
	r.unpack()
	return nil
}

// IalltoallvTyped starts an AlltoallvTyped (MPI_Ialltoallv with
// datatypes); errors at the call as AlltoallvTyped's.
func IalltoallvTyped[S, R any](c *Comm, send []S, scounts, sdispls []int, sd *Datatype, recv []R, rcounts, rdispls []int, rd *Datatype) (Request, error) {
	return ialltoallvTyped(c, send, scounts, sdispls, sd, recv, rcounts, rdispls, rd, false)
}

// AlltoallvInitTyped makes a persistent request of the same operation (MPI_Alltoallv_init
// with datatypes, MPI-4.1 §6.13); errors as IalltoallvTyped's.
func AlltoallvInitTyped[S, R any](c *Comm, send []S, scounts, sdispls []int, sd *Datatype, recv []R, rcounts, rdispls []int, rd *Datatype) (Request, error) {
	return ialltoallvTyped(c, send, scounts, sdispls, sd, recv, rcounts, rdispls, rd, true)
}

func ialltoallvTyped[S, R any](c *Comm, send []S, scounts, sdispls []int, sd *Datatype, recv []R, rcounts, rdispls []int, rd *Datatype, init bool) (Request, error) {
	s, r, err := alltoallvArgs(c, send, scounts, sdispls, sd, recv, rcounts, rdispls, rd)
	if err != nil {
		return Request{}, err
	}
	return c.startOrInit(init, CallIalltoallv, CallAlltoallvInit, AnySource, len(s.st), staged(s, r, alltoallSched(s.st, s.counts, s.displs, r.st, r.counts, r.displs)))
}

func alltoallvArgs[S, R any](c *Comm, send []S, scounts, sdispls []int, sd *Datatype, recv []R, rcounts, rdispls []int, rd *Datatype) (s, r blocksW, err error) {
	if err = c.valid(); err != nil {
		return
	}
	if s, err = vBlocks(send, scounts, sdispls, sd, c.size, "Alltoallv send"); err != nil {
		return
	}
	r, err = vBlocks(recv, rcounts, rdispls, rd, c.size, "Alltoallv receive")
	return
}

// ScanTyped is Scan with a datatype (MPI_Scan): count instances of d,
// which must be a sequence of T elements (see ReduceTyped). A nil send
// means in place. Errors: those of Scan, ErrType, ErrBuffer.
func ScanTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T]) error {
	return scanTyped(c, send, recv, count, d, op, false)
}

// ExscanTyped is Exscan with a datatype (MPI_Exscan); see ScanTyped. Rank
// 0's recv is left as it is.
func ExscanTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T]) error {
	return scanTyped(c, send, recv, count, d, op, true)
}

func scanTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T], exclusive bool) error {
	if err := c.valid(); err != nil {
		return err
	}
	s, r, sst, rst, err := reduceArgs(send, recv, count, d, true)
	if err != nil {
		return err
	}
	if exclusive {
		r.pack(rst) // rank 0's result is what recv held
	}
	in := fromRaw[T](sst)
	if send == nil {
		in = nil // in place
	}
	f := Scan[T]
	if exclusive {
		f = Exscan[T]
	}
	return runStaged(s, sst, r, rst, func() error { return f(c, in, fromRaw[T](rst), op) })
}

// IscanTyped starts a ScanTyped (MPI_Iscan with a datatype); errors at the
// call as ScanTyped's.
func IscanTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T]) (Request, error) {
	return iscanTyped(c, send, recv, count, d, op, false, false)
}

// ScanInitTyped makes a persistent ScanTyped request (MPI_Scan_init with a
// datatype, MPI-4.1 §6.13); errors as ScanTyped's.
func ScanInitTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T]) (Request, error) {
	return iscanTyped(c, send, recv, count, d, op, false, true)
}

// IexscanTyped starts an ExscanTyped (MPI_Iexscan with a datatype); errors
// at the call as ScanTyped's.
func IexscanTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T]) (Request, error) {
	return iscanTyped(c, send, recv, count, d, op, true, false)
}

// ExscanInitTyped makes a persistent ExscanTyped request (MPI_Exscan_init
// with a datatype); errors as ScanTyped's.
func ExscanInitTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T]) (Request, error) {
	return iscanTyped(c, send, recv, count, d, op, true, true)
}

func iscanTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T], exclusive, init bool) (Request, error) {
	if err := c.valid(); err != nil {
		return Request{}, err
	}
	s, r, sst, rst, err := reduceArgs(send, recv, count, d, true)
	if err != nil {
		return Request{}, err
	}
	call, initCall := CallIscan, CallScanInit
	if exclusive {
		call, initCall = CallIexscan, CallExscanInit
	}
	inner := scanSched(fromRaw[T](sst), fromRaw[T](rst), op, exclusive)
	return c.startOrInit(init, call, initCall, AnySource, len(rst), func(x coll, b *sched.Builder) error {
		s.packStep(b, sst)
		if exclusive && x.rank() == 0 {
			r.packStep(b, rst)
		}
		if err := inner(x, b); err != nil {
			return err
		}
		r.unpackStep(b, rst)
		return nil
	})
}

// ReduceScatterTyped is ReduceScatter with a datatype
// (MPI_Reduce_scatter): send holds the sum of rcounts instances of d, rank
// i's result is rcounts[i] instances of d in its recv; d must be a
// sequence of T elements (see ReduceTyped). Errors: those of
// ReduceScatter, ErrType, ErrBuffer.
func ReduceScatterTyped[T any](c *Comm, send, recv []T, rcounts []int, d *Datatype, op Op[T]) error {
	s, r, sst, rst, counts, err := reduceScatterArgs(c, send, recv, rcounts, d)
	if err != nil {
		return err
	}
	return runStaged(s, sst, r, rst, func() error { return ReduceScatter(c, fromRaw[T](sst), fromRaw[T](rst), counts, op) })
}

// IreduceScatterTyped starts a ReduceScatterTyped (MPI_Ireduce_scatter
// with a datatype); errors at the call as ReduceScatterTyped's.
func IreduceScatterTyped[T any](c *Comm, send, recv []T, rcounts []int, d *Datatype, op Op[T]) (Request, error) {
	return ireduceScatterTyped(c, send, recv, rcounts, d, op, false)
}

// ReduceScatterInitTyped makes a persistent request of the same operation (MPI_Reduce_scatter_init
// with datatypes, MPI-4.1 §6.13); errors as IreduceScatterTyped's.
func ReduceScatterInitTyped[T any](c *Comm, send, recv []T, rcounts []int, d *Datatype, op Op[T]) (Request, error) {
	return ireduceScatterTyped(c, send, recv, rcounts, d, op, true)
}

func ireduceScatterTyped[T any](c *Comm, send, recv []T, rcounts []int, d *Datatype, op Op[T], init bool) (Request, error) {
	s, r, sst, rst, counts, err := reduceScatterArgs(c, send, recv, rcounts, d)
	if err != nil {
		return Request{}, err
	}
	return c.startOrInit(init, CallIreduceScatter, CallReduceScatterInit, AnySource, len(sst), buildStaged(s, sst, r, rst, reduceScatterSched(fromRaw[T](sst), fromRaw[T](rst), counts, op)))
}

// ReduceScatterBlockTyped is ReduceScatterTyped with rcount instances for
// every rank (MPI_Reduce_scatter_block with a datatype).
func ReduceScatterBlockTyped[T any](c *Comm, send, recv []T, rcount int, d *Datatype, op Op[T]) error {
	if err := c.valid(); err != nil {
		return err
	}
	counts := make([]int, c.size)
	for i := range counts {
		counts[i] = rcount
	}
	return ReduceScatterTyped(c, send, recv, counts, d, op)
}

// reduceScatterArgs stages a typed reduce-scatter: send (all blocks, in
// order) and recv (this rank's block); counts come back in elements of T.
func reduceScatterArgs[T any](c *Comm, send, recv []T, rcounts []int, d *Datatype) (s, r typedArg, sst, rst []byte, counts []int, err error) {
	if err = c.valid(); err != nil {
		return
	}
	if len(rcounts) != c.size {
		err = fmt.Errorf("%w: ReduceScatter needs %d counts, got %d", ErrCount, c.size, len(rcounts))
		return
	}
	if send == nil {
		err = fmt.Errorf("%w: the typed ReduceScatter needs a send buffer", ErrBuffer)
		return
	}
	total := 0
	for _, n := range rcounts {
		if n < 0 {
			err = fmt.Errorf("%w: ReduceScatter count %d", ErrCount, n)
			return
		}
		total += n
	}
	if err = reductionType[T](total, d); err != nil {
		return
	}
	if s, err = argOf(send, total, d); err != nil {
		return
	}
	if r, err = argOf(recv, rcounts[c.rank], d); err != nil {
		return
	}
	sst, rst = s.staged(), r.staged()
	// Each instance of d is size(d)/size(T) elements of T.
	var z T
	per := int(d.t.Size()) / max(int(unsafe.Sizeof(z)), 1)
	counts = make([]int, c.size)
	for i, n := range rcounts {
		counts[i] = n * per
	}
	return
}
