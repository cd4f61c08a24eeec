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
	if err != nil || n == 0 {
		return err
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
		return nil
	}
	if len(runs) == 1 {
		return w.getAt(buf, target, world, int(runs[0].off), nil, then)
	}
	// The target gathers the runs and stores them, packed, into buf: as
	// many runs per request as fit, each request's data landing at its
	// place in buf; the last to land unpacks.
	per := max(1, (w.p.ep.MaxMediumTo(world)-4)/runLen)
	parts := (len(runs) + per - 1) / per
	cookie, seg, err := w.startGet(buf, target, parts, nil)
	if err != nil {
		return err
	}
	w.p.mu.Lock()
	w.gets[cookie].then = then
	w.p.mu.Unlock()
	pos := 0
	for k := 0; k < len(runs); k += per {
		chunk := runs[k:min(k+per, len(runs))]
		req := binary.LittleEndian.AppendUint32(nil, uint32(len(chunk)))
		n := 0
		for _, r := range chunk {
			req = binary.LittleEndian.AppendUint64(req, r.off)
			req = binary.LittleEndian.AppendUint32(req, uint32(r.n))
			n += r.n
		}
		if err := w.p.ep.RequestMedium(world, hRMAGetV, req, uint64(w.id), seg.Addr+uint64(pos), cookie); err != nil {
			w.p.mu.Lock()
			for range (len(runs) - k + per - 1) / per {
				w.getDoneLocked(target, cookie, err)
			}
			w.p.mu.Unlock()
			return w.p.netErr(w.c, world, fmt.Sprintf("GetTyped from rank %d", target), err)
		}
		pos += n
	}
	return nil
}

// onRMAGetV runs at the target: gather a GetTyped's runs and store them,
// packed, into the origin's buffer.
func (p *proc) onRMAGetV(tok *handlers.Token, a []uint64, payload []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.winLocked(a[0])
	st := uint64(rmaOK)
	var runs []run
	if len(payload) >= 4 {
		k := int(binary.LittleEndian.Uint32(payload))
		if k >= 0 && k == (len(payload)-4)/runLen && (len(payload)-4)%runLen == 0 {
			runs = make([]run, k)
			for i := range runs {
				b := payload[4+runLen*i:]
				runs[i] = run{binary.LittleEndian.Uint64(b), int(binary.LittleEndian.Uint32(b[8:]))}
			}
		}
	}
	var data []byte
	switch {
	case w == nil:
		st = rmaNoWin
	case runs == nil:
		st = rmaBadOp
	default:
		for _, r := range runs {
			src := w.regionLocked(r.off, uint64(r.n))
			if src == nil {
				st, data = rmaRange, nil
				break
			}
			data = append(data, src...)
		}
	}
	p.storeBackLocked(tok.Source(), a[0], a[1], a[2], data, st)
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
	max := p.ep.MaxMediumTo(world)
	buf := make([]byte, 0, max)
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		w.begin(target)
		err := p.ep.RequestMedium(world, h, buf, uint64(w.id), code)
		buf = buf[:0]
		if err != nil {
			w.abandon(target)
			return p.netErr(w.c, world, fmt.Sprintf("%s to rank %d", call, target), err)
		}
		return nil
	}
	// A request holds a header of run count (4 bytes), the runs, then the
	// bytes; runs are filled until the next would not fit with its data.
	var hdr []run
	var body []byte
	emit := func() error {
		buf = binary.LittleEndian.AppendUint32(buf[:0], uint32(len(hdr)))
		for _, r := range hdr {
			buf = binary.LittleEndian.AppendUint64(buf, r.off)
			buf = binary.LittleEndian.AppendUint32(buf, uint32(r.n))
		}
		buf = append(buf, body...)
		hdr, body = hdr[:0], body[:0]
		return flush()
	}
	pos := 0
	for _, r := range runs {
		for r.n > 0 {
			room := (max - 4 - runLen*(len(hdr)+1) - len(body)) / es * es
			if room <= 0 {
				if err := emit(); err != nil {
					return err
				}
				continue
			}
			m := min(r.n, room)
			hdr = append(hdr, run{r.off, m})
			body = append(body, data[pos:pos+m]...)
			pos, r.off, r.n = pos+m, r.off+uint64(m), r.n-m
		}
	}
	return emit()
}

// parseRuns splits a runs request's payload into its runs and their bytes;
// false for a malformed one.
func parseRuns(payload []byte) ([]run, []byte, bool) {
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
	if total != len(data) {
		return nil, nil, false
	}
	return runs, data, true
}

// onRMARuns runs at the target: scatter (or, with an operation code, apply)
// the runs of a PutTyped or AccumulateTyped.
func (p *proc) onRMARuns(tok *handlers.Token, a []uint64, payload []byte, acc bool) {
	p.mu.Lock()
	w := p.winLocked(a[0])
	st := uint64(rmaOK)
	runs, data, ok := parseRuns(payload)
	switch {
	case w == nil:
		st = rmaNoWin
	case !ok:
		st = rmaBadOp
	default:
		// Check every run before changing anything.
		for _, r := range runs {
			if w.regionLocked(r.off, uint64(r.n)) == nil {
				st = rmaRange
				break
			}
		}
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
