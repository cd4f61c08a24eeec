package mpiam

import (
	"fmt"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/job"
)

// Config tunes the MPI layer's endpoint. The zero value gives the defaults.
type Config struct {
	// AM configures the Active Messages endpoint underneath (per-peer buffer
	// size and the like).
	AM am.Config
	// Thread is the level of thread support the program declares
	// (MPI_Init_thread's required, MPI-4.1 §11.6.1): Run, RunLocal and Init
	// record it for QueryThread, and a single-threaded level takes the
	// lock-free path that ThreadLevel describes. The zero value declares
	// nothing and provides ThreadMultiple, safe for any goroutine. Run,
	// RunLocal and Init return ErrArg for a value outside ThreadSingle ..
	// ThreadMultiple other than zero. The level also sets AM.Seq.
	Thread ThreadLevel
}

// Run runs fn on every rank of the job with its world communicator and
// returns when all have finished (MPI_Init and MPI_Finalize around a rank's
// program): one rank per process under amrun, MPICH's mpiexec or Slurm; goroutine
// ranks for `amrun --transport loop` or a program started alone
// (AMGO_LOOP_SIZE ranks). An error from fn on any rank ends the job (see
// job.Run) and is returned naming the rank.
func Run(cfg Config, fn func(world *Comm) error) error {
	if err := checkThreadLevel(cfg.Thread); err != nil {
		return err
	}
	cfg = seqConfig(cfg)
	return job.Run(cfg.AM, func(ep *am.Endpoint) error { return runRank(ep, cfg, fn) })
}

// RunLocal runs fn on n ranks that are goroutines of this process, over the
// loop network: for tests and for embedding MPI code in a Go program.
func RunLocal(n int, cfg Config, fn func(world *Comm) error) error {
	if err := checkThreadLevel(cfg.Thread); err != nil {
		return err
	}
	cfg = seqConfig(cfg)
	return job.RunLocal(n, cfg.AM, func(ep *am.Endpoint) error { return runRank(ep, cfg, fn) })
}

func runRank(ep *am.Endpoint, cfg Config, fn func(world *Comm) error) error {
	p, err := newProc(ep)
	if err != nil {
		return err
	}
	p.watchSignals()
	defer p.unwatch()
	p.setThread(cfg.Thread)
	if err := p.attachEnvTools(); err != nil {
		return err
	}
	if err := fn(p.world); err != nil {
		_ = p.closeTools()
		return err
	}
	err = p.finalize()
	if terr := p.closeTools(); err == nil {
		err = terr
	}
	return err
}

// finalize completes what MPI_Finalize must: buffered sends still in flight,
// rendezvous transfers under way (a send freed while active included: MPI-4.1
// §11.2.2, the finalize "will complete the send") and deferred protocol work,
// then releases the shared stages and marks the process finalized.
func (p *proc) finalize() error {
	err := p.waitFor(func() bool {
		p.mu.Lock()
		rndv := len(p.reqs)
		p.mu.Unlock()
		return rndv == 0 && p.bsend.pending() == 0 && !p.hasWork.Load()
	})
	p.closeStages()
	p.finalized.Store(true)
	return err
}

// Init attaches this process to its job (MPI_Init, the process-per-rank form)
// and returns the world communicator. Call Finalize before exiting. A job of
// goroutine ranks (AMGO_LOOP_SIZE > 1) needs Run or RunLocal instead. The
// calling goroutine becomes the rank's main one (IsThreadMain), and the level
// of thread support is cfg.Thread (ThreadMultiple unless set; see InitThread).
// Errors: ErrArg for an invalid cfg.Thread; bootstrap and network errors,
// wrapped in ErrOther.
func Init(cfg Config) (*Comm, error) {
	if err := checkThreadLevel(cfg.Thread); err != nil {
		return nil, err
	}
	cfg = seqConfig(cfg)
	ep, err := job.Open(cfg.AM)
	if err != nil {
		return nil, fmt.Errorf("%w: Init: %w", ErrOther, err)
	}
	p, err := newProc(ep)
	if err == nil {
		p.watchSignals()
		p.setThread(cfg.Thread)
		err = p.attachEnvTools()
	}
	if err != nil {
		if p != nil {
			p.unwatch()
		}
		_ = ep.Finalize()
		return nil, err
	}
	return p.world, nil
}

// Finalize ends the process's participation in the job (MPI_Finalize): it
// completes pending buffered sends, waits at a barrier with every rank, and
// closes the network. world is the communicator Init returned.
func Finalize(world *Comm) error {
	if world == nil || world.p == nil || world != world.p.world {
		return fmt.Errorf("%w: Finalize takes the world communicator from Init", ErrComm)
	}
	if world.p.finalized.Load() {
		return ErrFinalized
	}
	err := world.p.finalize()
	if terr := world.p.closeTools(); err == nil {
		err = terr
	}
	world.p.unwatch()
	if ferr := world.p.ep.Finalize(); err == nil && ferr != nil {
		err = fmt.Errorf("%w: Finalize: %v", ErrOther, ferr)
	}
	return err
}
