package mpiam

import (
	"fmt"

	"github.com/amgo-hpc/amgo/handlers"
)

// Generalized active target synchronization (MPI-4.1 §12.5.2): a target opens
// an exposure epoch to a group of origins with Post, which sends each of them
// a notice; an origin's Start waits for the notices of the targets in its
// group and opens its access epoch to them; Complete waits until the
// origin's operations to those targets are acknowledged, then sends each a
// notice; the target's Wait (or Test) waits for the notices of every origin
// in its group. Notices are counted, not matched to epochs, so a Post may
// run ahead of the Start it opens.

// groupRanks maps g's members to ranks of the window, as a membership table.
// Errors: ErrGroup (a member not in the window, or one listed twice).
func (w *Win) groupRanks(g Group, call string) ([]bool, error) {
	in := make([]bool, w.c.size)
	for _, world := range g.world {
		r := commRankOf(w.c, world)
		if r < 0 {
			return nil, fmt.Errorf("%w: %s: world rank %d is not a rank of the window", ErrGroup, call, world)
		}
		if in[r] {
			return nil, fmt.Errorf("%w: %s: rank %d listed twice", ErrGroup, call, r)
		}
		in[r] = true
	}
	return in, nil
}

// Post opens an exposure epoch of this rank's window to the origins in g
// (MPI_Win_post, MPI-4.1 §12.5.2): they may access it between their Start
// and Complete. Wait or Test ends it. assert: Mode* bits (ModeNocheck,
// ModeNostore, ModeNoput are hints here). Errors: ErrWin, ErrGroup,
// ErrAssert, ErrRMASync (an exposure epoch is open already), ErrProcFailed.
func (w *Win) Post(g Group, assert int) error {
	if err := w.valid(); err != nil {
		return err
	}
	if assert&^(ModeNocheck|ModeNostore|ModeNoput) != 0 {
		return fmt.Errorf("%w: %#x (Post takes ModeNocheck, ModeNostore, ModeNoput)", ErrAssert, assert)
	}
	in, err := w.groupRanks(g, "Post")
	if err != nil {
		return err
	}
	p := w.p
	p.mu.Lock()
	if w.postOpen {
		p.mu.Unlock()
		return fmt.Errorf("%w: Post while an exposure epoch is open (Wait first)", ErrRMASync)
	}
	w.postGrp, w.postOpen = in, true
	p.mu.Unlock()
	for r, ok := range in {
		if !ok {
			continue
		}
		world := w.c.world(r)
		if err := p.ep.RequestShort(world, hRMAPost, uint64(w.id)); err != nil {
			return p.netErr(w.c, world, fmt.Sprintf("Post to rank %d", r), err)
		}
	}
	return nil
}

// Start opens an access epoch to the targets in g (MPI_Win_start, MPI-4.1
// §12.5.2) once each of them has posted. Complete ends it. Errors: ErrWin,
// ErrGroup, ErrAssert, ErrRMASync (an access epoch is open already),
// ErrProcFailed.
func (w *Win) Start(g Group, assert int) error {
	if err := w.valid(); err != nil {
		return err
	}
	if assert&^ModeNocheck != 0 {
		return fmt.Errorf("%w: %#x (Start takes ModeNocheck)", ErrAssert, assert)
	}
	in, err := w.groupRanks(g, "Start")
	if err != nil {
		return err
	}
	p := w.p
	p.mu.Lock()
	if w.startOpen || w.nlocks > 0 || w.lockAll {
		p.mu.Unlock()
		return fmt.Errorf("%w: Start while another access epoch is open", ErrRMASync)
	}
	p.mu.Unlock()
	err = p.waitColl(w.c, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for r, ok := range in {
			if ok && w.posted[r] == 0 {
				return false
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	for r, ok := range in {
		if ok {
			w.posted[r]--
		}
	}
	w.startGrp, w.startOpen = in, true
	w.fence = false // a fence epoch ends where another synchronization starts
	w.epochsLocked()
	p.mu.Unlock()
	return nil
}

// Complete ends the access epoch Start opened (MPI_Win_complete, MPI-4.1
// §12.5.2): every operation to its targets is done at origin and target when
// it returns, and each target learns it. Errors: ErrWin, ErrRMASync (no
// Start), a target's failure, ErrProcFailed.
func (w *Win) Complete() error {
	if err := w.valid(); err != nil {
		return err
	}
	p := w.p
	p.mu.Lock()
	in, open := w.startGrp, w.startOpen
	p.mu.Unlock()
	if !open {
		return fmt.Errorf("%w: Complete without Start", ErrRMASync)
	}
	werr := w.waitAll()
	p.mu.Lock()
	w.startGrp, w.startOpen = make([]bool, w.c.size), false
	w.epochsLocked()
	p.mu.Unlock()
	for r, ok := range in {
		if !ok {
			continue
		}
		world := w.c.world(r)
		if err := p.ep.RequestShort(world, hRMAComplete, uint64(w.id)); err != nil {
			return p.netErr(w.c, world, fmt.Sprintf("Complete to rank %d", r), err)
		}
	}
	return werr
}

// Wait ends the exposure epoch Post opened once every origin in its group
// has completed (MPI_Win_wait, MPI-4.1 §12.5.2). Errors: ErrWin, ErrRMASync
// (no Post), ErrProcFailed.
func (w *Win) Wait() error {
	if err := w.valid(); err != nil {
		return err
	}
	p := w.p
	if err := w.exposed("Wait"); err != nil {
		return err
	}
	if err := p.waitColl(w.c, w.allCompleted); err != nil {
		return err
	}
	w.endExposure()
	return nil
}

// Test is Wait that does not block (MPI_Win_test): it polls once and reports
// whether the epoch has ended (true: as Wait would have). Errors as Wait's.
func (w *Win) Test() (bool, error) {
	if err := w.valid(); err != nil {
		return false, err
	}
	if err := w.exposed("Test"); err != nil {
		return false, err
	}
	w.p.progress()
	if !w.allCompleted() {
		return false, nil
	}
	w.endExposure()
	return true, nil
}

// exposed reports ErrRMASync when no exposure epoch is open.
func (w *Win) exposed(call string) error {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	if !w.postOpen {
		return fmt.Errorf("%w: %s without Post", ErrRMASync, call)
	}
	return nil
}

// allCompleted reports whether every origin of the exposure epoch has sent
// its Complete.
func (w *Win) allCompleted() bool {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	for r, ok := range w.postGrp {
		if ok && w.complete[r] == 0 {
			return false
		}
	}
	return true
}

// endExposure takes the Complete notices of the epoch and closes it.
func (w *Win) endExposure() {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	for r, ok := range w.postGrp {
		if ok {
			w.complete[r]--
		}
	}
	w.postGrp, w.postOpen = make([]bool, w.c.size), false
}

// onRMAPost runs at an origin: a target posted.
func (p *proc) onRMAPost(tok *handlers.Token, a []uint64, _ []byte) {
	p.noticeLocked(tok.Source(), a[0], func(w *Win, r int) { w.posted[r]++ })
}

// onRMAComplete runs at a target: an origin completed.
func (p *proc) onRMAComplete(tok *handlers.Token, a []uint64, _ []byte) {
	p.noticeLocked(tok.Source(), a[0], func(w *Win, r int) { w.complete[r]++ })
}

// noticeLocked applies f to window id and src's rank in it, when both exist.
func (p *proc) noticeLocked(src int, id uint64, f func(w *Win, r int)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.winLocked(id)
	if w == nil {
		p.dropped(fmt.Errorf("one-sided notice for window %d from world rank %d: no such window", id, src))
		return
	}
	if r := commRankOf(w.c, src); r >= 0 {
		f(w, r)
	}
}
