package mpiam

import (
	"fmt"
	"unsafe"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/handlers"
)

// Dynamic windows (MPI-4.1 §12.2.4): a window with no memory at creation, to
// which each rank attaches regions and from which it detaches them while the
// window lives. Origins name a target's bytes by their address there, which
// WinAttach returns and the program passes on (MPI_Get_address's role). The
// target checks every access against the regions attached at that moment, so
// a Put goes as medium requests copied by the target's handler rather than
// as a single-copy store, which would land before any check.

// attachment is one region attached to a dynamic window.
type attachment struct {
	mem []byte
	seg am.Segment
	own any // the user's slice, referenced while attached
}

// WinCreateDynamic makes a window over c's ranks with no memory yet
// (MPI_Win_create_dynamic, MPI-4.1 §12.2.4): WinAttach adds regions.
// Displacements in one-sided calls on it are addresses at the target (unit
// 1). Collective over c. Errors: ErrComm, ErrOther.
func WinCreateDynamic(c *Comm) (*Win, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	return c.winCreate(winMem{dynamic: true}, 1)
}

// WinAttach attaches mem, of this rank, to dynamic window w
// (MPI_Win_attach, MPI-4.1 §12.2.4) and returns the displacement by which
// origins name its first byte (its address; MPI_Get_address): origins may
// access [disp, disp+len(mem) bytes) until WinDetach. mem must not be empty
// and stays pinned while attached. Errors: ErrWin (freed, or not dynamic:
// ErrRMAFlavor), ErrRMAAttach (empty, or overlapping an attached region).
func WinAttach[T any](w *Win, mem []T) (int, error) {
	if err := plain[T](); err != nil {
		return 0, err
	}
	if err := w.dynamicCheck("WinAttach"); err != nil {
		return 0, err
	}
	b := raw(mem)
	if len(b) == 0 {
		return 0, fmt.Errorf("%w: an empty region", ErrRMAAttach)
	}
	p := w.p
	p.mu.Lock()
	lo, hi := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&b[0]))+uintptr(len(b))
	for _, a := range w.attached {
		alo := uintptr(unsafe.Pointer(&a.mem[0]))
		if lo < alo+uintptr(len(a.mem)) && alo < hi {
			p.mu.Unlock()
			return 0, fmt.Errorf("%w: region of %d bytes overlaps one attached already", ErrRMAAttach, len(b))
		}
	}
	p.mu.Unlock()
	seg, err := p.ep.RegisterSegment(b)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrRMAAttach, err)
	}
	p.mu.Lock()
	w.attached = append(w.attached, attachment{mem: b, seg: seg, own: mem})
	p.mu.Unlock()
	return int(seg.Addr), nil
}

// WinDetach detaches mem, attached by WinAttach, from w (MPI_Win_detach):
// accesses to it fail at the target with ErrRMARange from then on. Errors:
// ErrWin, ErrRMAFlavor, ErrRMAAttach (not attached).
func WinDetach[T any](w *Win, mem []T) error {
	if err := w.dynamicCheck("WinDetach"); err != nil {
		return err
	}
	b := raw(mem)
	p := w.p
	p.mu.Lock()
	for i, a := range w.attached {
		if len(b) > 0 && &a.mem[0] == &b[0] && len(a.mem) == len(b) {
			w.attached = append(w.attached[:i], w.attached[i+1:]...)
			p.mu.Unlock()
			return p.ep.UnregisterSegment(a.seg)
		}
	}
	p.mu.Unlock()
	return fmt.Errorf("%w: WinDetach of a region that is not attached", ErrRMAAttach)
}

// dynamicCheck reports ErrWin for a freed window and ErrRMAFlavor for one
// that is not dynamic.
func (w *Win) dynamicCheck(call string) error {
	if err := w.valid(); err != nil {
		return err
	}
	if !w.dynamic {
		return fmt.Errorf("%w: %s on a window that WinCreateDynamic did not make", ErrRMAFlavor, call)
	}
	return nil
}

// putChecked is Put into a dynamic window: medium requests whose handler
// copies each piece after checking it lies in an attached region.
func (w *Win) putChecked(data []byte, target, world, off int) error {
	return w.sendPieces(data, target, world, off, 1, hRMAPutMed, 0, "Put")
}

// onRMAPutMed runs at the target: copy a Put's piece into an attached
// region, or refuse it.
func (p *proc) onRMAPutMed(tok *handlers.Token, a []uint64, payload []byte) {
	p.mu.Lock()
	w := p.winLocked(a[0])
	st := uint64(rmaOK)
	if w == nil {
		st = rmaNoWin
	} else if dst := w.regionLocked(a[1], uint64(len(payload))); dst == nil {
		st = rmaRange
	} else {
		copy(dst, payload)
	}
	p.mu.Unlock()
	rmaAck(tok, a[0], st)
}
