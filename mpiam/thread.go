package mpiam

import (
	"fmt"
	"runtime"

	"github.com/amgo-hpc/amgo/internal/locks"
)

// ThreadLevel is a level of thread support (MPI-4.1 §11.6.1, MPI_THREAD_*).
// In Go the threads of the standard are goroutines: the "main thread" is the
// goroutine that called Init or InitThread, or that runs Run's function.
//
// The level is the program's promise, and amgo holds it to it:
//
//   - ThreadMultiple, the default of Init, Run and RunLocal (a zero
//     Config.Thread): any goroutine may call anything at any time. A Go
//     program starts goroutines as easily as it calls functions, and a
//     default that let two of them corrupt the matching state without a
//     word would be the wrong default.
//   - ThreadSingle, ThreadFunneled and ThreadSerialized: the rank makes one
//     MPI call at a time (from one goroutine, or from several in turn with a
//     happens-before edge between them: a channel, a mutex, a WaitGroup).
//     The rank then guards its matching state, its request stack and its
//     Active Messages endpoint with plain flags instead of locks (am's
//     Config.Seq, GASNet-EX's SEQ mode): no locked instruction on a
//     message's path. Unless Config.AM.Progress (or AMGO_PROGRESS) starts a
//     progress goroutine, which polls beside the program: then the locks
//     stay.
//
// A program that breaks a single-threaded promise (two goroutines inside
// the library at once) gets ErrThreadLevel from its calls once a lock has
// seen it, rather than silently corrupted state; what cannot be seen cheaply
// (both goroutines entering at the same instant) the race detector reports
// in a `go test -race` build.
type ThreadLevel int

// The four levels, in increasing order of thread support. The zero
// ThreadLevel is not a level: in Config it means "not declared", which is
// ThreadMultiple.
const (
	// ThreadSingle: only one goroutine will execute (MPI_THREAD_SINGLE).
	ThreadSingle ThreadLevel = iota + 1
	// ThreadFunneled: the process may be multi-threaded, but only the main
	// goroutine will make MPI calls (MPI_THREAD_FUNNELED).
	ThreadFunneled
	// ThreadSerialized: any goroutine may make MPI calls, but never two at
	// once (MPI_THREAD_SERIALIZED).
	ThreadSerialized
	// ThreadMultiple: any goroutine may make MPI calls at any time
	// (MPI_THREAD_MULTIPLE); the default.
	ThreadMultiple
)

var threadNames = [...]string{"single", "funneled", "serialized", "multiple"}

// String names the level as MPI does, without the prefix ("single", ...).
func (l ThreadLevel) String() string {
	if l.valid() {
		return threadNames[l-ThreadSingle]
	}
	return fmt.Sprintf("ThreadLevel(%d)", int(l))
}

func (l ThreadLevel) valid() bool { return l >= ThreadSingle && l <= ThreadMultiple }

// orDefault is l, or ThreadMultiple for the zero value (not declared).
func (l ThreadLevel) orDefault() ThreadLevel {
	if l == 0 {
		return ThreadMultiple
	}
	return l
}

// single reports whether l promises one MPI call at a time.
func (l ThreadLevel) single() bool { return l.orDefault() < ThreadMultiple }

// checkThreadLevel checks a Config's level (zero allowed: not declared).
func checkThreadLevel(l ThreadLevel) error {
	if l != 0 && !l.valid() {
		return fmt.Errorf("%w: thread level %d (want ThreadSingle %d .. ThreadMultiple %d, or 0 for the default)",
			ErrArg, int(l), ThreadSingle, ThreadMultiple)
	}
	return nil
}

// seqConfig returns cfg's endpoint configuration with am's one-call-at-a-time
// promise set from the declared level.
func seqConfig(cfg Config) Config {
	cfg.AM.Seq = cfg.Thread.single()
	return cfg
}

// InitThread is Init with a required level of thread support
// (MPI_Init_thread, MPI-4.1 §11.6.1): it returns the world communicator and
// the level provided, which is always the level required, since amgo
// supports every level (Open MPI and MPICH answer the same). It is Init with
// cfg.Thread set to required; Run and RunLocal take the level in
// Config.Thread. What a single-threaded level changes is in ThreadLevel's
// description. Errors: ErrArg for a level outside ThreadSingle ..
// ThreadMultiple (nothing is opened), otherwise Init's.
func InitThread(cfg Config, required ThreadLevel) (*Comm, ThreadLevel, error) {
	if !required.valid() {
		return nil, 0, checkThreadLevel(required)
	}
	cfg.Thread = required
	world, err := Init(cfg)
	if err != nil {
		return nil, 0, err
	}
	return world, required, nil
}

// QueryThread reports the level of thread support the calling rank provides
// (MPI_Query_thread, MPI-4.1 §11.6.1): the level its Init, InitThread or
// Config.Thread declared, ThreadMultiple if none did. It may be called on
// any communicator of the rank, before or after Finalize. Errors: ErrComm
// for a nil communicator.
func (c *Comm) QueryThread() (ThreadLevel, error) {
	if c == nil || c.p == nil {
		return 0, fmt.Errorf("%w: nil communicator", ErrComm)
	}
	return c.p.thread, nil
}

// IsThreadMain reports whether the calling goroutine is the rank's main
// "thread" (MPI_Is_thread_main, MPI-4.1 §11.6.1): the goroutine that called
// Init or InitThread, or that runs the function given to Run or RunLocal.
// Goroutines started by that goroutine are not it. The answer costs a stack
// trace header (about 3 microseconds on a 2-vCPU KVM guest); call it outside
// hot loops. Errors: ErrComm for a nil communicator.
func (c *Comm) IsThreadMain() (bool, error) {
	if c == nil || c.p == nil {
		return false, fmt.Errorf("%w: nil communicator", ErrComm)
	}
	return goroutineID() == c.p.mainG, nil
}

// setThread records the declared level and the calling goroutine as the main
// one; newProc's caller runs it on the goroutine that called Init or runs the
// rank's function, before the rank's first MPI call. At a single-threaded
// level whose endpoint took the promise too (no progress goroutine), the
// rank's own locks become plain flags.
func (p *proc) setThread(l ThreadLevel) {
	p.thread = l.orDefault()
	p.mainG = goroutineID()
	if p.thread.single() && p.ep.Sequential() {
		p.seq = locks.NewSeq()
		p.mu.SetSeq(p.seq)
		p.states.mu.SetSeq(p.seq)
		p.nbc.mu.SetSeq(p.seq)
		p.nbc.readyMu.SetSeq(p.seq)
		p.packMu.SetSeq(p.seq)
	}
}

// threadErr is the error of every call after two goroutines were seen
// inside the rank at once under a single-threaded level.
func (p *proc) threadErr() error {
	return fmt.Errorf("%w: rank %d declared %v", ErrThreadLevel, p.ep.Rank(), p.thread)
}

// goroutineID is the calling goroutine's id, read from the header line of its
// stack trace ("goroutine 18 [running]:"), the only place the runtime shows
// it; 0 if the line cannot be read.
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return 0
	}
	var id uint64
	for _, ch := range b[len(prefix):] {
		if ch < '0' || ch > '9' {
			break
		}
		id = id*10 + uint64(ch-'0')
	}
	return id
}
