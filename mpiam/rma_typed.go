package mpiam

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/mpiam/internal/dtype"
)

// One-sided operations with derived datatypes (MPI-4.1 §12.3): the origin's
// data is described by (buffer, count, datatype) and the target's by
// (displacement, count, datatype), as MPI_Put's arguments are. The origin's
// side is packed (or unpacked) at the origin; the target's datatype, which
// the origin holds too, is flattened there into runs of bytes (offset in the
// target's window, length), and the runs travel with the data: one medium
// request carries as many runs and their bytes as fit, and the target's
// handler scatters them (or applies the operation to them, or gathers them
// for a Get) after checking each against its window. Within a node mapping
// the runs are copies. The two sides must move the same number of bytes
// (the type signatures of MPI; ErrType otherwise).

// runLen is the size of one run in a request: offset (8 bytes), length (4).
const runLen = 12

// run is a piece of the target's data: its byte offset in the window and
// its length.
type run struct {
	off uint64
	n   int
}

// targetRuns flattens tcount instances of ttype at displacement disp of
// target's window into runs of byte offsets in that window, checking the
// span against the window (a dynamic window's target checks instead).
func (w *Win) targetRuns(target, disp, tcount int, ttype *Datatype, n int, call string) ([]run, int, error) {
	if err := ttype.usable(); err != nil {
		return nil, 0, err
	}
	if tcount < 0 {
		return nil, 0, fmt.Errorf("%w: target count %d", ErrCount, tcount)
	}
	if got := tcount * ttype.Size(); got != n {
		return nil, 0, fmt.Errorf("%w: %s moves %d bytes from the origin and %d at the target (the type signatures differ)", ErrType, call, n, got)
	}
	lo, hi := ttype.t.Span(int64(tcount))
	base, world, err := w.access(target, disp, 0, call)
	if err != nil {
		return nil, 0, err
	}
	if !w.dynamic && (int64(base)+lo < 0 || int64(base)+hi > int64(w.sizes[target])) {
		return nil, 0, fmt.Errorf("%w: %s: the target datatype spans [%d, %d) of rank %d's window of %d bytes",
			ErrRMARange, call, int64(base)+lo, int64(base)+hi, target, w.sizes[target])
	}
	var runs []run
	ttype.t.Walk(int64(tcount), 0, int64(n), func(off, m int64) bool {
		o := uint64(int64(base) + off)
		if k := len(runs) - 1; k >= 0 && runs[k].off+uint64(runs[k].n) == o {
			runs[k].n += int(m) // adjacent pieces are one run
		} else {
			runs = append(runs, run{o, int(m)})
		}
		return true
	})
	return runs, world, nil
}

// originBytes returns the packed bytes of (buf, count, d): the buffer
// itself when contiguous, else a packed copy.
func originBytes(mem []byte, count int, d *Datatype) ([]byte, *layout, error) {
	contig, lay, err := layoutOf(mem, count, d)
	if err != nil || lay == nil {
		return contig, nil, err
	}
	b := make([]byte, lay.n)
	lay.pack(b, mem, 0)
	return b, lay, nil
}

// PutTyped is Put with datatypes (MPI_Put's full form): ocount instances of
// otype from origin go to tcount instances of ttype at displacement disp of
// target's window. Errors as Put's, plus ErrType (unusable datatypes, or
// sides of different sizes) and ErrCount.
func PutTyped[T any](w *Win, origin []T, ocount int, otype *Datatype, target, disp, tcount int, ttype *Datatype) error {
	mem, err := memOf(origin)
	if err != nil {
		return err
	}
	data, _, err := originBytes(mem, ocount, otype)
	if err != nil {
		return err
	}
	runs, world, err := w.targetRuns(target, disp, tcount, ttype, len(data), "PutTyped")
	if err != nil {
		return err
	}
	if w.local != nil && w.local[target] != nil {
		for _, r := range runs { // copies through the node mapping
			copy(w.local[target][r.off:r.off+uint64(r.n)], data[:r.n])
			data = data[r.n:]
		}
		return nil
	}
	if len(runs) == 1 {
		return w.putAt(data, target, world, int(runs[0].off))
	}
	return w.sendRuns(runs, data, target, world, hRMAPutV, 0, 1, "PutTyped")
}

// GetTyped is Get with datatypes (MPI_Get's full form): tcount instances of
// ttype at displacement disp of target's window arrive as ocount instances
// of otype in result. result must not be touched until a Flush, Unlock,
// Fence or Complete that follows returns. Errors as Get's, plus ErrType and
// ErrCount.
func GetTyped[T any](w *Win, result []T, ocount int, otype *Datatype, target, disp, tcount int, ttype *Datatype) error {
	return getTyped(w, result, ocount, otype, target, disp, tcount, ttype, nil)
}

// getTyped is GetTyped completing req (nil: none) once result holds the data.
func getTyped[T any](w *Win, result []T, ocount int, otype *Datatype, target, disp, tcount int, ttype *Datatype, req *reqState) error {
	mem, err := memOf(result)
	if err != nil {
		return err
	}
	contig, lay, err := layoutOf(mem, ocount, otype)
	if err != nil {
		return err
	}
	n := ocount * otype.Size()
	runs, world, err := w.targetRuns(target, disp, tcount, ttype, n, "GetTyped")
	if err != nil {
		return err
	}
	if n == 0 {
		if req != nil {
			req.complete(Status{})
		}
		return nil
	}
	buf, then := contig, func() {}
	if lay != nil {
		buf = make([]byte, n) // packed here, unpacked into result once complete
		then = func() { lay.unpack(mem, buf, 0) }
	}
	if w.local != nil && w.local[target] != nil {
		b := buf
		for _, r := range runs {
			copy(b[:r.n], w.local[target][r.off:r.off+uint64(r.n)])
			b = b[r.n:]
		}
		then()
		if req != nil {
			req.complete(Status{})
		}
		return nil
	}
	if len(runs) == 1 {
		return w.getAt(buf, target, world, int(runs[0].off), req, then)
	}
	// The target gathers the runs and stores them, packed, into buf: as
	// many runs per request as fit, each request's data landing at its
	// place in buf; the last to land unpacks.
	groups := chunkRuns(runs, w.p.ep.MaxMediumTo(world), 1, false)
	return w.gatherRuns(groups, nil, buf, target, world, hRMAGetV, nil, req, then, "GetTyped")
}

// gatherRuns sends each group of runs (with its operand bytes, from in in
// run order; none when in is empty) in a medium request of handler h to
// target, whose handler stores the group's bytes back, packed, at their
// place in buf; args go before the buffer address and cookie. The last
// store to land runs then and completes req (nil: none).
func (w *Win) gatherRuns(groups [][]run, in, buf []byte, target, world int, h handlers.Index, args []uint64, req *reqState, then func(), call string) error {
	p := w.p
	cookie, seg, err := w.startGet(buf, target, len(groups), req)
	if err != nil {
		return err
	}
	p.mu.Lock()
	w.gets[cookie].then = then
	p.mu.Unlock()
	pos := 0
	for k, g := range groups {
		n := runsLen(g)
		var data []byte
		if len(in) > 0 {
			data = in[pos : pos+n]
		}
		a := append(append([]uint64{uint64(w.id)}, args...), seg.Addr+uint64(pos), cookie)
		if err := p.ep.RequestMedium(world, h, encodeRuns(nil, g, data), a...); err != nil {
			p.mu.Lock()
			for range len(groups) - k { // the groups sent complete; the rest never will
				w.getDoneLocked(target, cookie, err)
			}
			p.mu.Unlock()
			return p.netErr(w.c, world, fmt.Sprintf("%s from rank %d", call, target), err)
		}
		pos += n
	}
	return nil
}

// runsLen is the bytes of runs.
func runsLen(runs []run) int {
	n := 0
	for _, r := range runs {
		n += r.n
	}
	return n
}

// encodeRuns appends a runs request's payload to buf: the run count
// (uint32), the runs (offset uint64, length uint32 each), then data.
func encodeRuns(buf []byte, runs []run, data []byte) []byte {
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(runs)))
	for _, r := range runs {
		buf = binary.LittleEndian.AppendUint64(buf, r.off)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(r.n))
	}
	return append(buf, data...)
}

// chunkRuns groups runs into requests of at most max bytes: a header of 4
// bytes, runLen per run and, withData, the runs' bytes. A run that does
// not fit is split at a multiple of es bytes (whole elements).
func chunkRuns(runs []run, max, es int, withData bool) [][]run {
	var groups [][]run
	var cur []run
	size := 4
	for _, r := range runs {
		for r.n > 0 {
			room := max - size - runLen
			if withData {
				room = room / es * es
			} else if room >= 0 {
				room = r.n // no data: a run costs its header only
			}
			if room <= 0 {
				if len(cur) == 0 { // max cannot hold even one element
					room = es
				} else {
					groups, cur, size = append(groups, cur), nil, 4
					continue
				}
			}
			m := min(r.n, room)
			cur = append(cur, run{r.off, m})
			size += runLen
			if withData {
				size += m
			}
			r.off, r.n = r.off+uint64(m), r.n-m
		}
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	return groups
}

// onRMAGetV runs at the target: gather a GetTyped's runs and store them,
// packed, into the origin's buffer.
func (p *proc) onRMAGetV(tok *handlers.Token, a []uint64, payload []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, runs, in, st := p.runsAtTargetLocked(a[0], payload, true)
	if st == rmaOK && len(in) != 0 {
		st = rmaBadOp
	}
	var data []byte
	if st == rmaOK {
		data = make([]byte, 0, runsLen(runs))
		for _, r := range runs {
			data = append(data, w.regionLocked(r.off, uint64(r.n))...)
		}
	}
	p.storeBackLocked(tok.Source(), a[0], a[1], a[2], data, st)
}

// runsAtTargetLocked finds the window that a runs request (PutTyped,
// AccumulateTyped, GetTyped, GetAccumulateTyped) names and splits its
// payload into runs and their bytes (dataOptional: see parseRuns), checking
// every run against the window before the handler reads or changes
// anything. The status is rmaOK, rmaNoWin, rmaBadOp (a malformed payload)
// or rmaRange (a run outside the window).
func (p *proc) runsAtTargetLocked(id uint64, payload []byte, dataOptional bool) (*Win, []run, []byte, uint64) {
	w := p.winLocked(id)
	if w == nil {
		return nil, nil, nil, rmaNoWin
	}
	runs, data, ok := parseRuns(payload, dataOptional)
	if !ok {
		return w, nil, nil, rmaBadOp
	}
	for _, r := range runs {
		if w.regionLocked(r.off, uint64(r.n)) == nil {
			return w, nil, nil, rmaRange
		}
	}
	return w, runs, data, rmaOK
}

// AccumulateTyped is Accumulate with datatypes (MPI_Accumulate's full form):
// the origin's elements combine with op into the target's. The datatypes'
// elements must be of T. Errors as Accumulate's, plus ErrType and ErrCount.
func AccumulateTyped[T Number](w *Win, origin []T, ocount int, otype *Datatype, target, disp, tcount int, ttype *Datatype, op Op[T]) error {
	code, err := rmaOpCode(op)
	if err != nil {
		return err
	}
	if err := otype.usable(); err != nil {
		return err
	}
	if err := ttype.usable(); err != nil {
		return err
	}
	k := dtype.Kind(code & 0xff)
	if otype.t.Homogeneous() != k || ttype.t.Homogeneous() != k {
		return fmt.Errorf("%w: AccumulateTyped's datatypes must hold elements of %v only (origin %v, target %v)", ErrType, k, otype.t, ttype.t)
	}
	data, _, err := originBytes(raw(origin), ocount, otype)
	if err != nil {
		return err
	}
	runs, world, err := w.targetRuns(target, disp, tcount, ttype, len(data), "AccumulateTyped")
	if err != nil {
		return err
	}
	if w.local != nil && w.local[target] != nil {
		w.lockPart(target) // applied here, through the node mapping
		for _, r := range runs {
			rmaApply(code, data[:r.n], w.local[target][r.off:r.off+uint64(r.n)])
			data = data[r.n:]
		}
		w.unlockPart(target)
		return nil
	}
	var z T
	return w.sendRuns(runs, data, target, world, hRMAAccV, code, int(unsafe.Sizeof(z)), "AccumulateTyped")
}

// sendRuns sends runs and their bytes (data, in run order) to target in
// medium requests of handler h (its second argument: code), each as many
// runs as fit; a run longer than what fits is split at a multiple of es
// bytes (whole elements).
func (w *Win) sendRuns(runs []run, data []byte, target, world int, h handlers.Index, code uint64, es int, call string) error {
	p := w.p
	var buf []byte
	for _, g := range chunkRuns(runs, p.ep.MaxMediumTo(world), es, true) {
		n := runsLen(g)
		buf = encodeRuns(buf[:0], g, data[:n])
		data = data[n:]
		w.begin(target)
		if err := p.ep.RequestMedium(world, h, buf, uint64(w.id), code); err != nil {
			w.abandon(target)
			return p.netErr(w.c, world, fmt.Sprintf("%s to rank %d", call, target), err)
		}
	}
	return nil
}

// parseRuns splits a runs request's payload into its runs and their bytes
// (none allowed when dataOptional); false for a malformed one.
func parseRuns(payload []byte, dataOptional bool) ([]run, []byte, bool) {
	if len(payload) < 4 {
		return nil, nil, false
	}
	k := int(binary.LittleEndian.Uint32(payload))
	if k < 0 || k > (len(payload)-4)/runLen {
		return nil, nil, false
	}
	runs := make([]run, k)
	total := 0
	for i := range runs {
		b := payload[4+runLen*i:]
		runs[i] = run{binary.LittleEndian.Uint64(b), int(binary.LittleEndian.Uint32(b[8:]))}
		total += runs[i].n
	}
	data := payload[4+runLen*k:]
	if total != len(data) && !(dataOptional && len(data) == 0) {
		return nil, nil, false
	}
	return runs, data, true
}

// onRMARuns runs at the target: scatter (or, with an operation code, apply)
// the runs of a PutTyped or AccumulateTyped.
func (p *proc) onRMARuns(tok *handlers.Token, a []uint64, payload []byte, acc bool) {
	p.mu.Lock()
	w, runs, data, st := p.runsAtTargetLocked(a[0], payload, false)
	if st == rmaOK {
		if acc {
			w.lockPart(w.c.rank)
		}
		for i := 0; st == rmaOK && i < len(runs); i++ {
			r := runs[i]
			dst := w.regionLocked(r.off, uint64(r.n))
			if !acc {
				copy(dst, data[:r.n])
			} else if !rmaApply(a[1], data[:r.n], dst) {
				st = rmaBadOp
			}
			data = data[r.n:]
		}
		if acc {
			w.unlockPart(w.c.rank)
		}
	}
	p.mu.Unlock()
	rmaAck(tok, a[0], st)
}

func (p *proc) onRMAPutV(tok *handlers.Token, a []uint64, payload []byte) {
	p.onRMARuns(tok, a, payload, false)
}

func (p *proc) onRMAAccV(tok *handlers.Token, a []uint64, payload []byte) {
	p.onRMARuns(tok, a, payload, true)
}

// GetAccumulateTyped is GetAccumulate with datatypes (MPI_Get_accumulate's
// full form): ocount instances of otype from origin combine with op into
// tcount instances of ttype at displacement disp of target's window, whose
// previous values arrive as rcount instances of rtype in result. With NoOp
// origin is not read (it may be empty) and the call is an atomic read. The
// datatypes' elements must be of T; result must not be touched until a
// Flush, Unlock, Fence or Complete that follows returns. Errors as
// GetAccumulate's, plus ErrType (unusable datatypes, other elements than
// T's, or sides of different sizes) and ErrCount.
func GetAccumulateTyped[T Number](w *Win, origin []T, ocount int, otype *Datatype, result []T, rcount int, rtype *Datatype,
	target, disp, tcount int, ttype *Datatype, op Op[T]) error {
	return getAccumulateTyped(w, origin, ocount, otype, result, rcount, rtype, target, disp, tcount, ttype, op, nil)
}

// getAccumulateTyped is GetAccumulateTyped completing req (nil: none) once
// result holds the previous values.
func getAccumulateTyped[T Number](w *Win, origin []T, ocount int, otype *Datatype, result []T, rcount int, rtype *Datatype,
	target, disp, tcount int, ttype *Datatype, op Op[T], req *reqState) error {
	const call = "GetAccumulateTyped"
	code, err := rmaOpCode(op)
	if err != nil {
		return err
	}
	noop := op.Name == "no_op"
	k := dtype.Kind(code & 0xff)
	types := []*Datatype{rtype, ttype}
	if !noop {
		types = append(types, otype)
	}
	for _, d := range types {
		if err := d.usable(); err != nil {
			return err
		}
		if d.t.Homogeneous() != k {
			return fmt.Errorf("%w: %s's datatypes must hold elements of %v only (%v)", ErrType, call, k, d.t)
		}
	}
	mem := raw(result)
	contig, lay, err := layoutOf(mem, rcount, rtype)
	if err != nil {
		return err
	}
	n := rcount * rtype.Size()
	var in []byte
	if !noop {
		if in, _, err = originBytes(raw(origin), ocount, otype); err != nil {
			return err
		}
		if len(in) != n {
			return fmt.Errorf("%w: %s combines %d bytes from the origin into a result of %d", ErrType, call, len(in), n)
		}
	}
	runs, world, err := w.targetRuns(target, disp, tcount, ttype, n, call)
	if err != nil {
		return err
	}
	buf, then := contig, func() {}
	if lay != nil {
		buf = make([]byte, n) // packed here, unpacked into result once complete
		then = func() { lay.unpack(mem, buf, 0) }
	}
	if n == 0 {
		if req != nil {
			req.complete(Status{})
		}
		return nil
	}
	if w.local != nil && w.local[target] != nil {
		w.lockPart(target) // applied here, through the node mapping
		b, ops := buf, in
		for _, r := range runs {
			var operand []byte
			if len(ops) > 0 {
				operand, ops = ops[:r.n], ops[r.n:]
			}
			getAccApply(w.local[target][r.off:r.off+uint64(r.n)], operand, b[:r.n], code)
			b = b[r.n:]
		}
		w.unlockPart(target)
		then()
		if req != nil {
			req.complete(Status{})
		}
		return nil
	}
	var z T
	groups := chunkRuns(runs, w.p.ep.MaxMediumTo(world), int(unsafe.Sizeof(z)), len(in) > 0)
	return w.gatherRuns(groups, in, buf, target, world, hRMAGetAccV, []uint64{code}, req, then, call)
}

// onRMAGetAccV runs at the target: read a GetAccumulateTyped's runs,
// combine the operands into them (none: NoOp), and store the old values,
// packed, back into the origin's buffer.
func (p *proc) onRMAGetAccV(tok *handlers.Token, a []uint64, payload []byte) {
	id, code, addr, cookie := a[0], a[1], a[2], a[3]
	p.mu.Lock()
	defer p.mu.Unlock()
	w, runs, in, st := p.runsAtTargetLocked(id, payload, true)
	var old []byte
	if st == rmaOK {
		old = make([]byte, runsLen(runs))
		b := old
		w.lockPart(w.c.rank)
		for _, r := range runs {
			var operand []byte
			if len(in) > 0 {
				operand, in = in[:r.n], in[r.n:]
			}
			if !getAccApply(w.regionLocked(r.off, uint64(r.n)), operand, b[:r.n], code) {
				st, old = rmaBadOp, nil
				break
			}
			b = b[r.n:]
		}
		w.unlockPart(w.c.rank)
	}
	p.storeBackLocked(tok.Source(), id, addr, cookie, old, st)
}
