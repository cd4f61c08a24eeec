package mpiam

import (
	"fmt"
	"unsafe"

	"github.com/amgo-hpc/amgo/handlers"
)

// GetAccumulate combines origin into target's window at displacement disp
// with op and returns the elements' previous values in result, which has
// origin's length (MPI_Get_accumulate, MPI-4.1 §12.3.5); with NoOp, origin
// may be empty and the call is an atomic read of len(result) elements. Each
// element is read and combined atomically with respect to the window's other
// accumulates. result must not be touched until a Flush, Unlock, Fence or
// Complete that follows returns. Errors as Accumulate's, plus ErrCount
// (lengths differ).
func GetAccumulate[T Number](w *Win, origin, result []T, target, disp int, op Op[T]) error {
	return getAccumulate(w, origin, result, target, disp, op, nil)
}

func getAccumulate[T Number](w *Win, origin, result []T, target, disp int, op Op[T], req *reqState) error {
	code, err := rmaOpCode(op)
	if err != nil {
		return err
	}
	if len(origin) != len(result) && !(len(origin) == 0 && op.Name == "no_op") {
		return fmt.Errorf("%w: GetAccumulate of %d elements into a result of %d", ErrCount, len(origin), len(result))
	}
	in, out := raw(origin), raw(result)
	off, world, err := w.access(target, disp, len(out), "GetAccumulate")
	if err != nil {
		return err
	}
	if w.local != nil && w.local[target] != nil && len(out) > 0 {
		w.lockPart(target) // applied here, through the node mapping
		getAccApply(w.local[target][off:off+len(out)], in, out, code)
		w.unlockPart(target)
		out = nil
	}
	if len(out) == 0 {
		if req != nil {
			req.complete(Status{})
		}
		return nil
	}
	var z T
	es := int(unsafe.Sizeof(z))
	chunk := w.p.ep.MaxMediumTo(world) / es * es
	parts := (len(out) + chunk - 1) / chunk
	cookie, seg, err := w.startGet(out, target, parts, req)
	if err != nil {
		return err
	}
	p := w.p
	for k := 0; k < len(out); k += chunk {
		n := min(chunk, len(out)-k)
		var operand []byte
		if len(in) > 0 {
			operand = in[k : k+n]
		}
		err := p.ep.RequestMedium(world, hRMAGetAcc, operand, uint64(w.id), uint64(off+k), code, seg.Addr+uint64(k), cookie<<32|uint64(n))
		if err != nil {
			// The pieces sent complete; the rest never will.
			p.mu.Lock()
			for range (len(out) - k + chunk - 1) / chunk {
				w.getDoneLocked(target, cookie, nil)
			}
			p.mu.Unlock()
			return p.netErr(w.c, world, fmt.Sprintf("GetAccumulate to rank %d", target), err)
		}
	}
	return nil
}

// getAccApply copies cur into old and combines in (none: NoOp) into cur
// with code's operation. false: an operation it does not know.
func getAccApply(cur, in, old []byte, code uint64) bool {
	copy(old, cur)
	return len(in) == 0 || rmaApply(code, in, cur)
}

// onRMAGetAcc runs at the target: read the range, combine the operands into
// it, and store the old values back into the origin's buffer.
func (p *proc) onRMAGetAcc(tok *handlers.Token, a []uint64, payload []byte) {
	id, off, code, addr := a[0], a[1], a[2], a[3]
	cookie, n := a[4]>>32, a[4]&(1<<32-1)
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.winLocked(id)
	st := uint64(rmaOK)
	switch {
	case w == nil:
		st = rmaNoWin
	case w.regionLocked(off, n) == nil:
		st = rmaRange
	case len(payload) != 0 && uint64(len(payload)) != n:
		st = rmaBadOp
	}
	var old []byte
	if st == rmaOK {
		cur := w.regionLocked(off, n)
		old = make([]byte, n)
		w.lockPart(w.c.rank)
		if !getAccApply(cur, payload, old, code) {
			st, old = rmaBadOp, nil
		}
		w.unlockPart(w.c.rank)
	}
	p.storeBackLocked(tok.Source(), id, addr, cookie, old, st)
}

// rmaRequest makes the request of a request-based one-sided operation on w
// (not complete).
func (w *Win) rmaRequest(target int) (*reqState, Request) {
	r, h := w.p.states.get(true)
	r.p, r.kind, r.comm, r.peer, r.tag = w.p, kindRMA, w.c, target, AnyTag
	return r, h
}

// passive reports ErrRMASync unless target is in a passive-target epoch:
// the request-based operations are for those only (MPI-4.1 §12.3.5).
func (w *Win) passive(target int, call string) error {
	if err := w.valid(); err != nil {
		return err
	}
	if target < 0 || target >= w.c.size {
		return fmt.Errorf("%w: %s target %d (window has %d ranks)", ErrRank, call, target, w.c.size)
	}
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	if w.locks[target] == 0 && !w.lockAll {
		return fmt.Errorf("%w: %s to rank %d outside a passive-target epoch (Lock or LockAll first)", ErrRMASync, call, target)
	}
	return nil
}

// Rput is Put returning a request (MPI_Rput, MPI-4.1 §12.3.5) that completes
// when origin may be reused: at once, since Put returns then. Only in a
// passive-target epoch. Errors as Put's.
func Rput[T any](w *Win, origin []T, target, disp int) (Request, error) {
	if err := w.passive(target, "Rput"); err != nil {
		return Request{}, err
	}
	if err := Put(w, origin, target, disp); err != nil {
		return Request{}, err
	}
	r, h := w.rmaRequest(target)
	r.complete(Status{})
	return h, nil
}

// Rget is Get returning a request (MPI_Rget) that completes when result
// holds the data. Only in a passive-target epoch. Errors as Get's.
func Rget[T any](w *Win, result []T, target, disp int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	if err := w.passive(target, "Rget"); err != nil {
		return Request{}, err
	}
	r, h := w.rmaRequest(target)
	if err := w.get(raw(result), target, disp, r); err != nil {
		return Request{}, err
	}
	if len(result) == 0 {
		r.complete(Status{})
	}
	return h, nil
}

// Raccumulate is Accumulate returning a request (MPI_Raccumulate) that
// completes when origin may be reused: at once. Only in a passive-target
// epoch. Errors as Accumulate's.
func Raccumulate[T Number](w *Win, origin []T, target, disp int, op Op[T]) (Request, error) {
	if err := w.passive(target, "Raccumulate"); err != nil {
		return Request{}, err
	}
	if err := Accumulate(w, origin, target, disp, op); err != nil {
		return Request{}, err
	}
	r, h := w.rmaRequest(target)
	r.complete(Status{})
	return h, nil
}

// RgetAccumulate is GetAccumulate returning a request (MPI_Rget_accumulate)
// that completes when result holds the previous values. Only in a
// passive-target epoch. Errors as GetAccumulate's.
func RgetAccumulate[T Number](w *Win, origin, result []T, target, disp int, op Op[T]) (Request, error) {
	if err := w.passive(target, "RgetAccumulate"); err != nil {
		return Request{}, err
	}
	r, h := w.rmaRequest(target)
	if err := getAccumulate(w, origin, result, target, disp, op, r); err != nil {
		return Request{}, err
	}
	return h, nil
}

// RputTyped is PutTyped returning a request (MPI_Rput's full form) that
// completes when origin may be reused: at once. Only in a passive-target
// epoch. Errors as PutTyped's.
func RputTyped[T any](w *Win, origin []T, ocount int, otype *Datatype, target, disp, tcount int, ttype *Datatype) (Request, error) {
	if err := w.passive(target, "RputTyped"); err != nil {
		return Request{}, err
	}
	if err := PutTyped(w, origin, ocount, otype, target, disp, tcount, ttype); err != nil {
		return Request{}, err
	}
	r, h := w.rmaRequest(target)
	r.complete(Status{})
	return h, nil
}

// RgetTyped is GetTyped returning a request (MPI_Rget's full form) that
// completes when result holds the data. Only in a passive-target epoch.
// Errors as GetTyped's.
func RgetTyped[T any](w *Win, result []T, ocount int, otype *Datatype, target, disp, tcount int, ttype *Datatype) (Request, error) {
	if err := w.passive(target, "RgetTyped"); err != nil {
		return Request{}, err
	}
	r, h := w.rmaRequest(target)
	if err := getTyped(w, result, ocount, otype, target, disp, tcount, ttype, r); err != nil {
		return Request{}, err
	}
	return h, nil
}

// RaccumulateTyped is AccumulateTyped returning a request (MPI_Raccumulate's
// full form) that completes when origin may be reused: at once. Only in a
// passive-target epoch. Errors as AccumulateTyped's.
func RaccumulateTyped[T Number](w *Win, origin []T, ocount int, otype *Datatype, target, disp, tcount int, ttype *Datatype, op Op[T]) (Request, error) {
	if err := w.passive(target, "RaccumulateTyped"); err != nil {
		return Request{}, err
	}
	if err := AccumulateTyped(w, origin, ocount, otype, target, disp, tcount, ttype, op); err != nil {
		return Request{}, err
	}
	r, h := w.rmaRequest(target)
	r.complete(Status{})
	return h, nil
}

// RgetAccumulateTyped is GetAccumulateTyped returning a request
// (MPI_Rget_accumulate's full form) that completes when result holds the
// previous values. Only in a passive-target epoch. Errors as
// GetAccumulateTyped's.
func RgetAccumulateTyped[T Number](w *Win, origin []T, ocount int, otype *Datatype, result []T, rcount int, rtype *Datatype,
	target, disp, tcount int, ttype *Datatype, op Op[T]) (Request, error) {
	if err := w.passive(target, "RgetAccumulateTyped"); err != nil {
		return Request{}, err
	}
	r, h := w.rmaRequest(target)
	if err := getAccumulateTyped(w, origin, ocount, otype, result, rcount, rtype, target, disp, tcount, ttype, op, r); err != nil {
		return Request{}, err
	}
	return h, nil
}
