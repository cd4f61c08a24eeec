package am

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/loop"
	_ "github.com/amgo-hpc/amgo/am/transport/shm" // registers "shm"
	"github.com/amgo-hpc/amgo/am/transport/sim"
	_ "github.com/amgo-hpc/amgo/am/transport/tcp" // registers "tcp"
	_ "github.com/amgo-hpc/amgo/am/transport/udp" // registers "udp"
	"github.com/amgo-hpc/amgo/internal/pmi"
	"golang.org/x/sys/unix"
)

// Environment variables read by Run and Open.
const (
	// EnvTransport names the network: "shm" (one rank per process on this
	// host), "tcp" or "udp" (processes on any hosts), "loop" or "sim" (ranks as
	// goroutines of this process; sim injects faults). amrun sets it.
	// Default: shm under a launcher, loop for a program started alone.
	EnvTransport = "AMGO_TRANSPORT"
	// EnvLoopSize is the number of goroutine ranks of a loop job (default 1).
	EnvLoopSize = "AMGO_LOOP_SIZE"
	// EnvBindCPU, set by amrun when it binds ranks (amrun --bind-to), is the
	// CPU this rank's process runs on: Open binds every thread of the process
	// to it and, unless GOMAXPROCS is set, sets GOMAXPROCS to 1, as a C MPI
	// process bound to a core runs one thread there.
	EnvBindCPU = "AMGO_BIND_CPU"
	// EnvProgress sets Config.Progress (a Go duration): a progress goroutine
	// that polls when the program has not for that long.
	EnvProgress = "AMGO_PROGRESS"
	// EnvBufferBytes overrides Config.BufferBytes.
	EnvBufferBytes = "AMGO_BUFFER_BYTES"
)

// ErrRankFailed reports, to the other ranks of an in-process job, that one rank's
// function failed and the job was ended.
var ErrRankFailed = errors.New("am: another rank of the job failed")

func (c *Config) fromEnv() error {
	if v := os.Getenv(EnvProgress); v != "" && c.Progress == 0 {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("%w: %s=%q is not a duration", ErrConfig, EnvProgress, v)
		}
		c.Progress = d
	}
	if v := os.Getenv(EnvBufferBytes); v != "" && c.BufferBytes == 0 {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%w: %s=%q", ErrConfig, EnvBufferBytes, v)
		}
		c.BufferBytes = n
	}
	return nil
}

// Run runs fn on every rank of the job this process belongs to and returns
// when all of them have finished: under a launcher (amrun, MPICH mpiexec,
// Slurm) fn runs once, on this process's rank; for a loop job
// (AMGO_TRANSPORT=loop, as `amrun --transport loop` sets, or a program started
// alone) fn runs on AMGO_LOOP_SIZE goroutine ranks. Each rank's endpoint passes a
// barrier and is closed after fn returns. If fn fails on a rank, the job is
// ended: in-process, the other ranks' endpoints are closed so their blocked
// calls return ErrClosed; across processes, the launcher is asked to abort.
// The error names the failing rank. In an in-process job, a rank that called
// Abort makes Run print the abort and exit the process with its code, as
// Abort does itself under a launcher.
func Run(cfg Config, fn func(ep *Endpoint) error) error {
	if n, loop, err := loopSize(); err != nil {
		return err
	} else if loop {
		err := RunLocal(n, cfg, fn)
		// MPI_Abort's code is returned to the invoking environment
		// (MPI_Abort(3)), as a rank process under a launcher does in Abort.
		var ae *AbortError
		if errors.As(err, &ae) {
			fmt.Fprintln(os.Stderr, ae)
			os.Exit(ae.Code)
		}
		return err
	}
	ep, err := Open(cfg)
	if err != nil {
		return err
	}
	if err := fn(ep); err != nil {
		err = fmt.Errorf("rank %d: %w", ep.Rank(), err)
		_ = ep.boot.Abort(1, oneLine(err))
		ep.closed.Store(true)
		_ = ep.tr.Close()
		return err
	}
	return ep.Finalize()
}

// loopSize reports whether this process runs a loop job, and its size.
func loopSize() (int, bool, error) {
	name := os.Getenv(EnvTransport)
	if name != "loop" && name != "sim" && name != "" {
		return 0, false, nil
	}
	if name == "" && (os.Getenv("PMI_FD") != "" || os.Getenv("PMI_PORT") != "") {
		return 0, false, nil
	}
	n := 1
	if v := os.Getenv(EnvLoopSize); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			return 0, false, fmt.Errorf("%w: %s=%q", ErrConfig, EnvLoopSize, v)
		}
	}
	if size := os.Getenv("PMI_SIZE"); size != "" && size != "1" {
		return 0, false, fmt.Errorf("%w: loop runs ranks as goroutines of one process; this launcher started %s processes", ErrConfig, size)
	}
	return n, true, nil
}

// Open attaches this process to its job as one rank (the process-per-rank
// form, as MPI_Init): it connects to the launcher over PMI-1 (or runs as a
// singleton), opens the network named by AMGO_TRANSPORT (default shm under a
// launcher, loop alone) and returns the endpoint. Finalize ends it. A loop job
// of more than one rank cannot be opened this way: use Run or RunLocal.
// Errors: ErrConfig, bootstrap and transport errors.
func Open(cfg Config) (*Endpoint, error) {
	if err := cfg.fromEnv(); err != nil {
		return nil, err
	}
	if n, loop, err := loopSize(); err != nil {
		return nil, err
	} else if loop && n > 1 {
		return nil, fmt.Errorf("%w: %s=%d asks for goroutine ranks; use am.Run or am.RunLocal", ErrConfig, EnvLoopSize, n)
	}
	boot, err := pmi.FromEnv()
	if err != nil {
		return nil, fmt.Errorf("am: bootstrap: %w", err)
	}
	if err := bindFromEnv(); err != nil {
		_ = boot.Abort(1, oneLine(err))
		return nil, err
	}
	name := os.Getenv(EnvTransport)
	if name == "" {
		name = "shm"
		if boot.IsSingleton() {
			name = "loop"
		}
	}
	tr, err := transport.Open(name, boot, nil)
	if err != nil {
		_ = boot.Abort(1, oneLine(err))
		return nil, fmt.Errorf("am: rank %d: %w", boot.Rank(), err)
	}
	ep, err := New(tr, cfg)
	if err != nil {
		_ = tr.Close()
		_ = boot.Abort(1, oneLine(err))
		return nil, err
	}
	ep.boot = boot
	return ep, nil
}

// Finalize ends an endpoint made by Open: a barrier with every rank, Close, and
// the launcher's finalize. Errors of each step, the first one returned.
func (ep *Endpoint) Finalize() error {
	err := ep.Barrier()
	if cerr := ep.Close(); err == nil {
		err = cerr
	}
	if ep.boot != nil {
		if ferr := ep.boot.Finalize(); err == nil {
			err = ferr
		}
	}
	return err
}

// ErrAborted is returned by Abort in an in-process job; the error is an
// *AbortError.
var ErrAborted = errors.New("am: job aborted")

// AbortError reports that a rank ended the job with Abort (MPI_Abort): the
// rank, the exit code it asked for and its message. It matches ErrAborted.
type AbortError struct {
	Rank int    // the rank that called Abort
	Code int    // the exit code the job should end with
	Msg  string // what the rank said
}

func (e *AbortError) Error() string {
	return fmt.Sprintf("am: job aborted by rank %d with exit code %d: %s", e.Rank, e.Code, e.Msg)
}

// Is makes an *AbortError match ErrAborted.
func (e *AbortError) Is(target error) bool { return target == ErrAborted }

// Abort ends the whole job (MPI_Abort): under a launcher it asks the launcher
// to kill every rank and exits this process with code; in an in-process job it
// closes every rank's endpoint, so their blocked calls fail with ErrClosed, and
// returns an *AbortError (matching ErrAborted) for the caller to return from
// its rank function; Run then exits the process with code.
func (ep *Endpoint) Abort(code int, msg string) error {
	if ep.boot != nil {
		_ = ep.boot.Abort(code, msg)
		os.Exit(code)
	}
	if ep.abortJob != nil {
		ep.abortJob()
	} else {
		ep.closed.Store(true)
	}
	return &AbortError{Rank: ep.rank, Code: code, Msg: msg}
}

// RunLocal runs fn on n ranks that are goroutines of this process, over the
// loop network (tests, embedding), or over package sim's simulated faulty
// network when AMGO_TRANSPORT=sim. It returns when all have finished; see Run
// for how a failing rank ends the job.
func RunLocal(n int, cfg Config, fn func(ep *Endpoint) error) error {
	if err := cfg.fromEnv(); err != nil {
		return err
	}
	trs, err := localJob(n)
	if err != nil {
		return err
	}
	eps := make([]*Endpoint, n)
	for i, tr := range trs {
		if eps[i], err = New(tr, cfg); err != nil {
			return err
		}
	}
	errs := make([]error, n)
	var once sync.Once
	fail := func() {
		once.Do(func() {
			for _, ep := range eps {
				ep.closed.Store(true)
			}
		})
	}
	for _, ep := range eps {
		ep.abortJob = fail
	}
	var wg sync.WaitGroup
	for i := range eps {
		wg.Add(1)
		go func(ep *Endpoint) {
			defer wg.Done()
			err := fn(ep)
			if err == nil {
				err = ep.Barrier()
			}
			if err != nil {
				if !errors.Is(err, ErrAborted) {
					err = fmt.Errorf("rank %d: %w", ep.rank, err)
				}
				errs[ep.rank] = err
				fail()
			}
		}(eps[i])
	}
	wg.Wait()
	var first []error
	for _, err := range errs {
		if err != nil && !errors.Is(err, ErrClosed) {
			first = append(first, err)
		}
	}
	// Send every credit return still owed before anyone drains: the ranks no
	// longer poll, so a rank waiting for its peers' acks would wait in vain.
	for _, ep := range eps {
		if !ep.closed.Load() {
			ep.flushPending()
		}
	}
	for _, ep := range eps {
		if ep.closed.Load() {
			ep.stopProgress()
			ep.unregisterAll()
			_ = ep.tr.Close()
		} else {
			ep.Drain(time.Second)
			_ = ep.Close()
		}
	}
	if len(first) == 0 {
		for _, err := range errs {
			if err != nil {
				return fmt.Errorf("%w: %w", ErrRankFailed, err)
			}
		}
		return nil
	}
	return errors.Join(first...)
}

// localJob opens the n goroutine ranks of an in-process job: over loop, or
// over the simulated faulty network of package sim when AMGO_TRANSPORT=sim
// (faults from AMGO_SIM_SEED, AMGO_SIM_LOSS, ...: sim.ParseOptions).
func localJob(n int) ([]transport.Transport, error) {
	if os.Getenv(EnvTransport) == "sim" {
		c, err := sim.ParseOptions(nil)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		return sim.NewJob(n, c)
	}
	return loop.NewJob(n, nil)
}

func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

// bindFromEnv binds every thread of this process to the CPU EnvBindCPU names
// (threads the Go runtime starts later inherit it) and, unless the user set
// GOMAXPROCS, runs Go code on one thread: several Ps on one CPU would only
// take turns with the polling thread. A CPU this process may not use is
// reported (ErrConfig); a thread that cannot be bound is skipped with a log
// line, since binding only steadies timings.
func bindFromEnv() error {
	v := os.Getenv(EnvBindCPU)
	if v == "" {
		return nil
	}
	cpu, err := strconv.Atoi(v)
	if err != nil || cpu < 0 || cpu >= 1024 {
		return fmt.Errorf("%w: %s=%q is not a CPU number", ErrConfig, EnvBindCPU, v)
	}
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err == nil && !allowed.IsSet(cpu) {
		return fmt.Errorf("%w: %s=%d: this process may not run on CPU %d", ErrConfig, EnvBindCPU, cpu, cpu)
	}
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		slog.Warn("am: binding to a CPU: cannot list this process's threads", "err", err)
		return nil
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			slog.Warn("am: binding a thread to a CPU", "tid", tid, "cpu", cpu, "err", err)
		}
	}
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	return nil
}
