package mpiam

import (
	"fmt"

	"github.com/amgo-hpc/amgo/internal/memcopy"
	"github.com/amgo-hpc/amgo/mpiam/internal/sched"
)

// Collectives with (buffer, count, datatype) arguments (MPI-4.1 chapter 6
// with the datatypes of chapter 5). A buffer whose instances are one run of
// bytes goes to the collective as it is; any other is packed into a staging
// buffer before the operation and unpacked from one after it, so the
// algorithms, and the matching with the slice forms (a BcastTyped on one
// rank matches a Bcast on another), are those of the slice forms. The
// packed bytes of each block must agree between sender and receiver as the
// slice forms' lengths must (ErrTruncate otherwise). Element types of the
// slices are any pointer-free type; counts are instances of the datatype.

// typedArg is one buffer argument of a typed collective: its bytes (mem,
// the packed bytes themselves when lay is nil) and its layout.
type typedArg struct {
	mem []byte
	lay *layout
}

// argOf checks count instances of d in buf.
func argOf[T any](buf []T, count int, d *Datatype) (typedArg, error) {
	mem, lay, err := typed(buf, count, d)
	return typedArg{mem, lay}, err
}

// ext is the argument's layout as a schedule step's Ext (nil when the
// bytes are the data).
func (a typedArg) ext() any {
	if a.lay == nil {
		return nil
	}
	return a.lay
}

// n is the argument's packed size in bytes.
func (a typedArg) n() int { return packedLen(a.mem, a.lay) }

// staged returns the bytes the collective works on: mem itself, or a new
// staging buffer aligned for any element type.
func (a typedArg) staged() []byte {
	if a.lay == nil {
		return a.mem
	}
	return stage(a.lay.n)
}

// startOrInit starts nonblocking collective call, or with init makes the
// persistent request of initCall, on the schedule build makes.
func (c *Comm) startOrInit(init bool, call, initCall Call, peer, bytes int, build func(x coll, b *sched.Builder) error) (Request, error) {
	if init {
		return c.initSched(initCall, peer, bytes, build)
	}
	return c.startSched(call, peer, bytes, build)
}

// stage is n bytes aligned for any element type (8 bytes).
func stage(n int) []byte { return sched.Alloc(n) }

// inPlace packs an in-place collective's receive buffer into its staging
// buffer (the data the operation takes from it): a typed gather, allgather
// or alltoall called with a nil send, whose arguments are (s, nil).
func inPlace(s typedArg, sst []byte, r typedArg, rst []byte) {
	if sst == nil && s.mem != nil {
		r.pack(rst)
	}
}

// inPlaceStep is inPlace as a schedule step.
func inPlaceStep(b *sched.Builder, s typedArg, sst []byte, r typedArg, rst []byte) {
	if sst == nil && s.mem != nil && r.lay != nil {
		b.Call(func() error { r.pack(rst); return nil })
	}
}

// pack fills staging buffer st from the buffer (nothing when contiguous).
func (a typedArg) pack(st []byte) {
	if a.lay != nil && st != nil {
		a.lay.pack(st, a.mem, 0)
	}
}

// unpack writes staging buffer st back into the buffer.
func (a typedArg) unpack(st []byte) {
	if a.lay != nil {
		a.lay.unpack(a.mem, st, 0)
	}
}

// packStep and unpackStep are pack and unpack as schedule steps.
func (a typedArg) packStep(b *sched.Builder, st []byte) {
	if a.lay != nil && st != nil {
		b.Call(func() error { a.pack(st); return nil })
	}
}

func (a typedArg) unpackStep(b *sched.Builder, st []byte) {
	if a.lay != nil {
		b.Fence()
		b.Call(func() error { a.unpack(st); return nil })
	}
}

// reductionType checks that count instances of d are a sequence of
// elements of T, as a reduction with an Op[T] needs (MPI-4.1 §6.9.1:
// predefined operations apply to the basic elements): the datatype's type
// signature must be that of whole instances of T's datatype.
func reductionType[T any](count int, d *Datatype) error {
	if err := d.usable(); err != nil {
		return err
	}
	et, err := DatatypeOf[T]()
	if err != nil {
		return err
	}
	per := et.t.Elements()
	total := int64(count) * d.t.Elements()
	if per == 0 || total%per != 0 || d.t.PackedHash(int64(count)) != et.t.PackedHash(total/per) {
		return fmt.Errorf("%w: %d instances of %s are not a sequence of %s elements for the reduction", ErrType, count, d.t, et.t)
	}
	return nil
}

// BcastTyped broadcasts count instances of d in buf from root (MPI_Bcast
// with a datatype); see Bcast. Errors: those of Bcast, ErrType, ErrCount,
// ErrBuffer (data outside buf).
func BcastTyped[T any](c *Comm, buf []T, count int, d *Datatype, root int) error {
	if err := checkRoot(c, root); err != nil {
		return err
	}
	a, err := argOf(buf, count, d)
	if err != nil {
		return err
	}
	st := a.staged()
	if c.rank == root {
		a.pack(st)
	}
	if err := Bcast(c, st, root); err != nil {
		return err
	}
	if c.rank != root {
		a.unpack(st)
	}
	return nil
}

// IbcastTyped starts a BcastTyped (MPI_Ibcast with a datatype); errors at
// the call as BcastTyped's.
func IbcastTyped[T any](c *Comm, buf []T, count int, d *Datatype, root int) (Request, error) {
	return ibcastTyped(c, buf, count, d, root, false)
}

// BcastInitTyped makes a persistent request of the same operation (MPI_Bcast_init
// with datatypes, MPI-4.1 §6.13): the staging and the schedule are set up
// once, each Start packs, runs and unpacks again. Errors as IbcastTyped's.
func BcastInitTyped[T any](c *Comm, buf []T, count int, d *Datatype, root int) (Request, error) {
	return ibcastTyped(c, buf, count, d, root, true)
}

func ibcastTyped[T any](c *Comm, buf []T, count int, d *Datatype, root int, init bool) (Request, error) {
	if err := checkRoot(c, root); err != nil {
		return Request{}, err
	}
	a, err := argOf(buf, count, d)
	if err != nil {
		return Request{}, err
	}
	st := a.staged()
	inner := bcastSched(st, root)
	return c.startOrInit(init, CallIbcast, CallBcastInit, root, len(st), func(x coll, b *sched.Builder) error {
		if c.rank == root {
			a.packStep(b, st)
		}
		if err := inner(x, b); err != nil {
			return err
		}
		if c.rank != root {
			a.unpackStep(b, st)
		}
		return nil
	})
}

// reduceArgs stages a typed reduction's buffers: send (nil: in place,
// recv's contents) and recv (used where want is set).
func reduceArgs[T any](send, recv []T, count int, d *Datatype, want bool) (s, r typedArg, sst, rst []byte, err error) {
	if err = reductionType[T](count, d); err != nil {
		return
	}
	if want {
		if r, err = argOf(recv, count, d); err != nil {
			return
		}
		rst = r.staged()
	}
	if send == nil {
		if !want {
			err = fmt.Errorf("%w: in place (nil send) on a rank without a receive buffer", ErrBuffer)
			return
		}
		s, sst = r, rst
		return
	}
	if s, err = argOf(send, count, d); err != nil {
		return
	}
	sst = s.staged()
	return
}

// ReduceTyped combines count instances of d from every rank's send with op
// into root's recv (MPI_Reduce with a datatype); the instances must be a
// sequence of T elements (a vector of float64s for an Op[float64], say).
// A nil send at root means in place. Errors: those of Reduce, ErrType
// (a datatype that is not a sequence of T), ErrCount, ErrBuffer.
func ReduceTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T], root int) error {
	if err := checkRoot(c, root); err != nil {
		return err
	}
	s, r, sst, rst, err := reduceArgs(send, recv, count, d, c.rank == root)
	if err != nil {
		return err
	}
	in := fromRaw[T](sst)
	if send == nil {
		in = nil // in place: recv, packed into rst, is the contribution
	}
	return runStaged(s, sst, r, rst, func() error { return Reduce(c, in, fromRaw[T](rst), op, root) })
}

// IreduceTyped starts a ReduceTyped (MPI_Ireduce with a datatype); errors
// at the call as ReduceTyped's.
func IreduceTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T], root int) (Request, error) {
	return ireduceTyped(c, send, recv, count, d, op, root, false)
}

// ReduceInitTyped makes a persistent request of the same operation (MPI_Reduce_init
// with datatypes, MPI-4.1 §6.13): the staging and the schedule are set up
// once, each Start packs, runs and unpacks again. Errors as IreduceTyped's.
func ReduceInitTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T], root int) (Request, error) {
	return ireduceTyped(c, send, recv, count, d, op, root, true)
}

func ireduceTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T], root int, init bool) (Request, error) {
	if err := checkRoot(c, root); err != nil {
		return Request{}, err
	}
	s, r, sst, rst, err := reduceArgs(send, recv, count, d, c.rank == root)
	if err != nil {
		return Request{}, err
	}
	return c.startOrInit(init, CallIreduce, CallReduceInit, root, len(sst), buildStaged(s, sst, r, rst, reduceSched(fromRaw[T](sst), fromRaw[T](rst), op, root)))
}

// AllreduceTyped combines count instances of d from every rank's send with
// op into every rank's recv (MPI_Allreduce with a datatype); see
// ReduceTyped. A nil send means in place.
func AllreduceTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T]) error {
	if err := c.valid(); err != nil {
		return err
	}
	s, r, sst, rst, err := reduceArgs(send, recv, count, d, true)
	if err != nil {
		return err
	}
	in := fromRaw[T](sst)
	if send == nil {
		in = nil // in place
	}
	return runStaged(s, sst, r, rst, func() error { return Allreduce(c, in, fromRaw[T](rst), op) })
}

// IallreduceTyped starts an AllreduceTyped (MPI_Iallreduce with a
// datatype); errors at the call as AllreduceTyped's.
func IallreduceTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T]) (Request, error) {
	return iallreduceTyped(c, send, recv, count, d, op, false)
}

// AllreduceInitTyped makes a persistent request of the same operation (MPI_Allreduce_init
// with datatypes, MPI-4.1 §6.13): the staging and the schedule are set up
// once, each Start packs, runs and unpacks again. Errors as IallreduceTyped's.
func AllreduceInitTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T]) (Request, error) {
	return iallreduceTyped(c, send, recv, count, d, op, true)
}

func iallreduceTyped[T any](c *Comm, send, recv []T, count int, d *Datatype, op Op[T], init bool) (Request, error) {
	if err := c.valid(); err != nil {
		return Request{}, err
	}
	s, r, sst, rst, err := reduceArgs(send, recv, count, d, true)
	if err != nil {
		return Request{}, err
	}
	return c.startOrInit(init, CallIallreduce, CallAllreduceInit, AnySource, len(rst), buildStaged(s, sst, r, rst, allreduceSched(fromRaw[T](sst), fromRaw[T](rst), op)))
}

// runStaged runs the slice form op of a typed collective whose staged
// buffers are (s, sst) and (r, rst): it packs the send side (and, in
// place, the receive side), runs op and unpacks the receive side.
func runStaged(s typedArg, sst []byte, r typedArg, rst []byte, op func() error) error {
	s.pack(sst)
	inPlace(s, sst, r, rst)
	if err := op(); err != nil {
		return err
	}
	r.unpack(rst)
	return nil
}

// buildStaged is runStaged as schedule steps around inner, which builds
// the slice form's schedule on the staged buffers.
func buildStaged(s typedArg, sst []byte, r typedArg, rst []byte, inner func(x coll, b *sched.Builder) error) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error {
		s.packStep(b, sst)
		inPlaceStep(b, s, sst, r, rst)
		if err := inner(x, b); err != nil {
			return err
		}
		r.unpackStep(b, rst)
		return nil
	}
}

// gatherArgs stages a typed gather's buffers: send (scount of sd; nil
// send: in place at root, its block already in recv) and, at root, recv
// (p blocks of rcount of rd, block i at i·rcount extents).
func gatherArgs[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, atRoot bool) (s, r typedArg, sst, rst []byte, err error) {
	if atRoot {
		if r, err = argOf(recv, rcount*c.size, rd); err != nil {
			return
		}
		rst = r.staged()
	}
	if send == nil {
		if !atRoot {
			err = fmt.Errorf("%w: in place (nil send) away from the root", ErrBuffer)
			return
		}
		s, sst = r, nil // the root's block is already in recv: packed with it (inPlace)
		return
	}
	if s, err = argOf(send, scount, sd); err != nil {
		return
	}
	sst = s.staged()
	return
}

// GatherTyped collects scount instances of sd from every rank into root's
// recv, rank i's as rcount instances of rd starting i·rcount extents of rd
// in (MPI_Gather with datatypes). A nil send at root means in place.
// Errors: those of Gather, ErrType, ErrCount, ErrBuffer.
func GatherTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int) error {
	if err := checkRoot(c, root); err != nil {
		return err
	}
	s, r, sst, rst, err := gatherArgs(c, send, scount, sd, recv, rcount, rd, c.rank == root)
	if err != nil {
		return err
	}
	return runStaged(s, sst, r, rst, func() error { return Gather(c, sst, rst, root) })
}

// IgatherTyped starts a GatherTyped (MPI_Igather with datatypes); errors
// at the call as GatherTyped's.
func IgatherTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int) (Request, error) {
	return igatherTyped(c, send, scount, sd, recv, rcount, rd, root, false)
}

// GatherInitTyped makes a persistent request of the same operation (MPI_Gather_init
// with datatypes, MPI-4.1 §6.13): the staging and the schedule are set up
// once, each Start packs, runs and unpacks again. Errors as IgatherTyped's.
func GatherInitTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int) (Request, error) {
	return igatherTyped(c, send, scount, sd, recv, rcount, rd, root, true)
}

func igatherTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int, init bool) (Request, error) {
	if err := checkRoot(c, root); err != nil {
		return Request{}, err
	}
	s, r, sst, rst, err := gatherArgs(c, send, scount, sd, recv, rcount, rd, c.rank == root)
	if err != nil {
		return Request{}, err
	}
	return c.startOrInit(init, CallIgather, CallGatherInit, root, len(sst), buildStaged(s, sst, r, rst, gatherSched(sst, rst, nil, nil, root, false)))
}

// scatterArgs stages a typed scatter's buffers: at root send (p blocks of
// scount of sd), and recv (rcount of rd; nil at root: in place).
func scatterArgs[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, atRoot bool) (s, r typedArg, sst, rst []byte, err error) {
	if atRoot {
		if s, err = argOf(send, scount*c.size, sd); err != nil {
			return
		}
		sst = s.staged()
	}
	if recv == nil {
		if !atRoot {
			err = fmt.Errorf("%w: in place (nil recv) away from the root", ErrBuffer)
		}
		return
	}
	if r, err = argOf(recv, rcount, rd); err != nil {
		return
	}
	rst = r.staged()
	return
}

// ScatterTyped sends block i of root's send (scount instances of sd,
// starting i·scount extents in) to rank i's recv as rcount instances of rd
// (MPI_Scatter with datatypes). A nil recv at root means in place. Errors:
// those of Scatter, ErrType, ErrCount, ErrBuffer.
func ScatterTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int) error {
	if err := checkRoot(c, root); err != nil {
		return err
	}
	s, r, sst, rst, err := scatterArgs(c, send, scount, sd, recv, rcount, rd, c.rank == root)
	if err != nil {
		return err
	}
	return runStaged(s, sst, r, rst, func() error { return Scatter(c, sst, rst, root) })
}

// IscatterTyped starts a ScatterTyped (MPI_Iscatter with datatypes); errors
// at the call as ScatterTyped's.
func IscatterTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int) (Request, error) {
	return iscatterTyped(c, send, scount, sd, recv, rcount, rd, root, false)
}

// ScatterInitTyped makes a persistent request of the same operation (MPI_Scatter_init
// with datatypes, MPI-4.1 §6.13): the staging and the schedule are set up
// once, each Start packs, runs and unpacks again. Errors as IscatterTyped's.
func ScatterInitTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int) (Request, error) {
	return iscatterTyped(c, send, scount, sd, recv, rcount, rd, root, true)
}

func iscatterTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, root int, init bool) (Request, error) {
	if err := checkRoot(c, root); err != nil {
		return Request{}, err
	}
	s, r, sst, rst, err := scatterArgs(c, send, scount, sd, recv, rcount, rd, c.rank == root)
	if err != nil {
		return Request{}, err
	}
	return c.startOrInit(init, CallIscatter, CallScatterInit, root, len(rst), buildStaged(s, sst, r, rst, scatterSched(sst, nil, nil, rst, root, false)))
}

// allArgs stages the buffers of a typed allgather or alltoall: send
// (sblocks blocks of scount of sd; nil: in place, recv's contents) and recv
// (p blocks of rcount of rd).
func allArgs[S, R any](c *Comm, send []S, scount, sblocks int, sd *Datatype, recv []R, rcount int, rd *Datatype) (s, r typedArg, sst, rst []byte, err error) {
	if r, err = argOf(recv, rcount*c.size, rd); err != nil {
		return
	}
	rst = r.staged()
	if send == nil {
		s, sst = r, nil // in place: recv is packed with it (inPlace)
		return
	}
	if s, err = argOf(send, scount*sblocks, sd); err != nil {
		return
	}
	sst = s.staged()
	return
}

// AllgatherTyped collects scount instances of sd from every rank into
// every rank's recv, rank i's as rcount instances of rd starting
// i·rcount extents in (MPI_Allgather with datatypes). A nil send means in
// place. Errors: those of Allgather, ErrType, ErrCount, ErrBuffer.
func AllgatherTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype) error {
	if err := c.valid(); err != nil {
		return err
	}
	s, r, sst, rst, err := allArgs(c, send, scount, 1, sd, recv, rcount, rd)
	if err != nil {
		return err
	}
	return runStaged(s, sst, r, rst, func() error { return Allgather(c, sst, rst) })
}

// IallgatherTyped starts an AllgatherTyped (MPI_Iallgather with
// datatypes); errors at the call as AllgatherTyped's.
func IallgatherTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype) (Request, error) {
	return iallgatherTyped(c, send, scount, sd, recv, rcount, rd, false)
}

// AllgatherInitTyped makes a persistent request of the same operation (MPI_Allgather_init
// with datatypes, MPI-4.1 §6.13): the staging and the schedule are set up
// once, each Start packs, runs and unpacks again. Errors as IallgatherTyped's.
func AllgatherInitTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype) (Request, error) {
	return iallgatherTyped(c, send, scount, sd, recv, rcount, rd, true)
}

func iallgatherTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, init bool) (Request, error) {
	if err := c.valid(); err != nil {
		return Request{}, err
	}
	s, r, sst, rst, err := allArgs(c, send, scount, 1, sd, recv, rcount, rd)
	if err != nil {
		return Request{}, err
	}
	return c.startOrInit(init, CallIallgather, CallAllgatherInit, AnySource, len(sst), buildStaged(s, sst, r, rst, allgatherSched(sst, rst, nil, nil, false)))
}

// AlltoallTyped sends block j of send (scount instances of sd, starting
// j·scount extents in) to rank j, which stores it as block i of its recv
// (rcount instances of rd) for this rank i (MPI_Alltoall with datatypes). A
// nil send means in place. Errors: those of Alltoall, ErrType, ErrCount,
// ErrBuffer.
func AlltoallTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype) error {
	if err := c.valid(); err != nil {
		return err
	}
	s, r, sst, rst, err := allArgs(c, send, scount, c.size, sd, recv, rcount, rd)
	if err != nil {
		return err
	}
	return runStaged(s, sst, r, rst, func() error { return Alltoall(c, sst, rst) })
}

// IalltoallTyped starts an AlltoallTyped (MPI_Ialltoall with datatypes);
// errors at the call as AlltoallTyped's.
func IalltoallTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype) (Request, error) {
	return ialltoallTyped(c, send, scount, sd, recv, rcount, rd, false)
}

// AlltoallInitTyped makes a persistent request of the same operation (MPI_Alltoall_init
// with datatypes, MPI-4.1 §6.13): the staging and the schedule are set up
// once, each Start packs, runs and unpacks again. Errors as IalltoallTyped's.
func AlltoallInitTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype) (Request, error) {
	return ialltoallTyped(c, send, scount, sd, recv, rcount, rd, true)
}

func ialltoallTyped[S, R any](c *Comm, send []S, scount int, sd *Datatype, recv []R, rcount int, rd *Datatype, init bool) (Request, error) {
	if err := c.valid(); err != nil {
		return Request{}, err
	}
	s, r, sst, rst, err := allArgs(c, send, scount, c.size, sd, recv, rcount, rd)
	if err != nil {
		return Request{}, err
	}
	return c.startOrInit(init, CallIalltoall, CallAlltoallInit, AnySource, len(sst), buildStaged(s, sst, r, rst, alltoallSched(sst, nil, nil, rst, nil, nil)))
}

// blocksW stages the blocks of a w collective: block i is counts[i]
// instances of types[i] starting displs[i] bytes into buf; they are packed
// one after the other into one staging buffer, whose byte counts and
// displacements it returns.
type blocksW struct {
	args           []typedArg
	counts, displs []int // bytes in the staging buffer
	st             []byte
}

func blocksOf[T any](buf []T, counts, displs []int, types []*Datatype, n int, what string) (blocksW, error) {
	var w blocksW
	args, err := argsOf(buf, counts, displs, types, n, what)
	if err != nil {
		return w, err
	}
	w.args, w.counts, w.displs = args, make([]int, n), make([]int, n)
	total := 0
	for i, a := range args {
		w.counts[i], w.displs[i] = a.n(), total
		total += w.counts[i]
	}
	w.st = stage(total)
	return w, nil
}

// argsOf checks the n blocks of a w collective's buffer: block i is
// counts[i] instances of types[i] starting displs[i] bytes into buf.
func argsOf[T any](buf []T, counts, displs []int, types []*Datatype, n int, what string) ([]typedArg, error) {
	return argsInto(make([]typedArg, 0, n), buf, counts, displs, types, n, what)
}

// argsInto is argsOf appending the blocks to args.
func argsInto[T any](args []typedArg, buf []T, counts, displs []int, types []*Datatype, n int, what string) ([]typedArg, error) {
	if len(counts) != n || len(displs) != n || len(types) != n {
		return nil, fmt.Errorf("%w: %s needs %d counts, displacements and datatypes, got %d, %d and %d", ErrCount, what, n, len(counts), len(displs), len(types))
	}
	mem, err := memOf(buf)
	if err != nil {
		return nil, err
	}
	for i := range n {
		if displs[i] < 0 || displs[i] > len(mem) {
			return nil, fmt.Errorf("%w: %s block %d at byte %d of a buffer of %d", ErrBuffer, what, i, displs[i], len(mem))
		}
		m, lay, err := layoutOf(mem[displs[i]:], counts[i], types[i])
		if err != nil {
			return nil, fmt.Errorf("%s block %d: %w", what, i, err)
		}
		args = append(args, typedArg{m, lay})
	}
	return args, nil
}

func (w blocksW) pack() {
	for i, a := range w.args {
		if a.lay != nil {
			a.lay.pack(w.st[w.displs[i]:w.displs[i]+w.counts[i]], a.mem, 0)
		} else {
			memcopy.Copy(w.st[w.displs[i]:w.displs[i]+w.counts[i]], a.mem)
		}
	}
}

func (w blocksW) unpack() {
	for i, a := range w.args {
		if a.lay != nil {
			a.lay.unpack(a.mem, w.st[w.displs[i]:w.displs[i]+w.counts[i]], 0)
		} else {
			memcopy.Copy(a.mem, w.st[w.displs[i]:w.displs[i]+w.counts[i]])
		}
	}
}

// Alltoallw sends to each rank j scounts[j] instances of stypes[j]
// starting sdispls[j] bytes into send, and receives from each rank i
// rcounts[i] instances of rtypes[i] starting rdispls[i] bytes into recv
// (MPI_Alltoallw, MPI-4.1 §6.8): the most general exchange, each block
// with its own datatype; displacements are in bytes. Blocks are packed into
// one staging buffer each way and exchanged as Alltoallv does. Errors:
// those of Alltoallv, ErrType, ErrCount (argument slices of the wrong
// length), ErrBuffer.
func Alltoallw[S, R any](c *Comm, send []S, scounts, sdispls []int, stypes []*Datatype, recv []R, rcounts, rdispls []int, rtypes []*Datatype) error {
	if err := c.valid(); err != nil {
		return err
	}
	s, r, err := alltoallwArgs(c.size, send, scounts, sdispls, stypes, recv, rcounts, rdispls, rtypes)
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

func alltoallwArgs[S, R any](n int, send []S, scounts, sdispls []int, stypes []*Datatype, recv []R, rcounts, rdispls []int, rtypes []*Datatype) (s, r blocksW, err error) {
	if s, err = blocksOf(send, scounts, sdispls, stypes, n, "send"); err != nil {
		return
	}
	r, err = blocksOf(recv, rcounts, rdispls, rtypes, n, "receive")
	return
}

// Ialltoallw starts an Alltoallw (MPI_Ialltoallw); errors at the call as
// Alltoallw's.
func Ialltoallw[S, R any](c *Comm, send []S, scounts, sdispls []int, stypes []*Datatype, recv []R, rcounts, rdispls []int, rtypes []*Datatype) (Request, error) {
	if err := c.valid(); err != nil {
		return Request{}, err
	}
	s, r, err := alltoallwArgs(c.size, send, scounts, sdispls, stypes, recv, rcounts, rdispls, rtypes)
	if err != nil {
		return Request{}, err
	}
	return c.startSched(CallIalltoallw, AnySource, len(s.st), staged(s, r, alltoallSched(s.st, s.counts, s.displs, r.st, r.counts, r.displs)))
}

// staged wraps schedule builder inner, which works on s's and r's staging
// buffers, with a first step packing s's blocks and a last step unpacking
// r's.
func staged(s, r blocksW, inner func(x coll, b *sched.Builder) error) func(x coll, b *sched.Builder) error {
	return func(x coll, b *sched.Builder) error {
		if s.args != nil {
			b.Call(func() error { s.pack(); return nil })
		}
		if err := inner(x, b); err != nil {
			return err
		}
		if r.args != nil {
			b.Fence()
			b.Call(func() error { r.unpack(); return nil })
		}
		return nil
	}
}

// NeighborAlltoallw is NeighborAlltoallv with a datatype per neighbor and
// displacements in bytes (MPI_Neighbor_alltoallw, MPI-4.1 §8.6.2): block i
// of send (scounts[i] instances of stypes[i] at byte sdispls[i]) goes to
// the i-th out-neighbor, and the i-th in-neighbor's block lands as
// rcounts[i] instances of rtypes[i] at byte rdispls[i] of recv (a ProcNull
// neighbor's block is left as it is). Each block travels as one message,
// packed into it and unpacked from it with no staging copy (a halo
// exchange's faces). Collective over c. Errors: those of
// NeighborAlltoallv, ErrType, ErrBuffer.
func NeighborAlltoallw[S, R any](c *Comm, send []S, scounts, sdispls []int, stypes []*Datatype, recv []R, rcounts, rdispls []int, rtypes []*Datatype) error {
	s := newNbScratch(nil)
	defer s.release()
	in, out, err := neighborWArgs(c, s, send, scounts, sdispls, stypes, recv, rcounts, rdispls, rtypes)
	if err != nil {
		return err
	}
	return c.runColl(CallNeighborAlltoallw, AnySource, argsBytes(s.sblocks), func(x coll) error {
		return x.neighborExchange(s, in, s.rblocks, out, s.sblocks)
	})
}

// neighborWArgs checks a NeighborAlltoallw's blocks into s.sblocks and
// s.rblocks and returns the neighbors.
func neighborWArgs[S, R any](c *Comm, s *nbScratch, send []S, scounts, sdispls []int, stypes []*Datatype, recv []R, rcounts, rdispls []int, rtypes []*Datatype) (in, out []int, err error) {
	if in, out, err = c.neighbors(); err != nil {
		return
	}
	if s.sblocks, err = argsInto(s.sblocks[:0], send, scounts, sdispls, stypes, len(out), "NeighborAlltoallw send"); err != nil {
		return
	}
	s.rblocks, err = argsInto(s.rblocks[:0], recv, rcounts, rdispls, rtypes, len(in), "NeighborAlltoallw receive")
	return
}

// argsBytes is the packed bytes of blocks, for tools.
func argsBytes(args []typedArg) int {
	n := 0
	for _, a := range args {
		n += a.n()
	}
	return n
}

// IneighborAlltoallw starts a NeighborAlltoallw (MPI_Ineighbor_alltoallw);
// errors at the call as NeighborAlltoallw's.
func IneighborAlltoallw[S, R any](c *Comm, send []S, scounts, sdispls []int, stypes []*Datatype, recv []R, rcounts, rdispls []int, rtypes []*Datatype) (Request, error) {
	s := &nbScratch{}
	in, out, err := neighborWArgs(c, s, send, scounts, sdispls, stypes, recv, rcounts, rdispls, rtypes)
	if err != nil {
		return Request{}, err
	}
	return c.startNeighbor(CallIneighborAlltoallw, argsBytes(s.sblocks), func(x coll, b *sched.Builder) error {
		neighborSchedule(b, c, in, s.rblocks, out, s.sblocks)
		return nil
	})
}
