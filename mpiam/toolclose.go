package mpiam

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// A trace or profile is wanted most from a job that failed. A rank ends
// without Finalize in three ways amgo can see: it calls Abort (its tools are
// closed first, in Comm.Abort), its launcher ends it with a signal after
// another rank failed (SIGTERM from amrun, mpiexec or Slurm; SIGINT and SIGHUP
// from a terminal), or it is killed outright (SIGKILL: nothing runs; the
// trace reader then keeps the records up to the cut). For the signals, the
// first rank of the process that attaches a tool with a Close method starts
// one watcher for the whole process: on a signal it closes the tools of every
// rank of the process that has not finalized, then lets the signal take its
// default course (the process ends as killed by it). A signal the program
// ignores is not watched.

var toolSignals = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP}

var closeOnSignal struct {
	mu    sync.Mutex
	procs map[*proc]bool
	ch    chan os.Signal
}

// watchToolsOnSignal has p's tools closed if the process is ended by a
// signal before p finalizes.
func (p *proc) watchToolsOnSignal() {
	s := &closeOnSignal
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.procs == nil {
		s.procs = map[*proc]bool{}
	}
	s.procs[p] = true
	if s.ch != nil {
		return
	}
	var sigs []os.Signal
	for _, sig := range toolSignals {
		if !signal.Ignored(sig) {
			sigs = append(sigs, sig)
		}
	}
	if len(sigs) == 0 {
		return
	}
	s.ch = make(chan os.Signal, 1)
	signal.Notify(s.ch, sigs...)
	go closeToolsAndReraise(s.ch)
}

// unwatchTools forgets p (its tools are closed); the last one stops the
// watcher.
func (p *proc) unwatchTools() {
	s := &closeOnSignal
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.procs[p] {
		return
	}
	delete(s.procs, p)
	if len(s.procs) == 0 && s.ch != nil {
		signal.Stop(s.ch)
		close(s.ch)
		s.ch = nil
	}
}

func closeToolsAndReraise(ch chan os.Signal) {
	sig, ok := <-ch
	if !ok {
		return
	}
	s := &closeOnSignal
	s.mu.Lock()
	procs := make([]*proc, 0, len(s.procs))
	for p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		_ = p.closeTools()
	}
	signal.Reset(sig)
	_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
}
