// Package job starts the ranks of an amgo job and hands each its endpoint: it
// finds the launcher (PMI-1: amrun, MPICH's mpiexec, Slurm; or none, for a
// job of one), chooses and opens the network, and runs a function on every
// rank. It is the one package that knows every concrete network; package am
// itself knows only the transport interface.
//
// Run runs a function on every rank of the job this process belongs to; RunLocal
// runs n goroutine ranks in this process; Open attaches this process as one
// rank, as MPI_Init does. docs/architecture.md, "How a program starts",
// walks through the steps.
package job

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/loop"
	"github.com/amgo-hpc/amgo/am/transport/route"
	_ "github.com/amgo-hpc/amgo/am/transport/shm" // registers "shm"
	"github.com/amgo-hpc/amgo/am/transport/sim"
	_ "github.com/amgo-hpc/amgo/am/transport/tcp" // registers "tcp"
	_ "github.com/amgo-hpc/amgo/am/transport/udp" // registers "udp"
	_ "github.com/amgo-hpc/amgo/am/transport/xdp" // registers "xdp"
	"github.com/amgo-hpc/amgo/internal/pmi"
)

// Environment variables read by Run, RunLocal and Open.
const (
	// EnvTransport names the network: "shm" (one rank per process on this
	// host), "tcp", "udp" or "xdp" (processes on any hosts; xdp one per
	// interface), "loop" or "sim" (ranks as
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
	// EnvProgress sets am.Config.Progress (a Go duration): a progress
	// goroutine that polls when the program has not for that long.
	EnvProgress = "AMGO_PROGRESS"
	// EnvBufferBytes sets am.Config.BufferBytes.
	EnvBufferBytes = "AMGO_BUFFER_BYTES"
	// EnvYield sets am.Config.Yield: "1" yields the processor while
	// waiting, "0" never does; unset, a rank yields when its node has more
	// ranks than it may use processors (oversubscribed).
	EnvYield = "AMGO_YIELD"
	// EnvImmediate "0" sets am.Config.NoImmediate: eager messages go as
	// medium requests even where the network could take them immediately
	// ("1" or unset: immediate requests where the network carries them).
	EnvImmediate = "AMGO_IMMEDIATE"
)

// configFromEnv applies EnvProgress, EnvBufferBytes, EnvYield and
// EnvImmediate to the fields of cfg left 0. Errors wrap am.ErrConfig.
func configFromEnv(cfg *am.Config) error {
	if v := os.Getenv(EnvProgress); v != "" && cfg.Progress == 0 {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("%w: %s=%q is not a duration", am.ErrConfig, EnvProgress, v)
		}
		cfg.Progress = d
	}
	if v := os.Getenv(EnvBufferBytes); v != "" && cfg.BufferBytes == 0 {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%w: %s=%q", am.ErrConfig, EnvBufferBytes, v)
		}
		cfg.BufferBytes = n
	}
	if err := envFlag(EnvYield, "1", &cfg.Yield); err != nil {
		return err
	}
	return envFlag(EnvImmediate, "0", &cfg.NoImmediate)
}

// envFlag sets *flag when environment variable name is on ("0" or "1"),
// leaves it when the variable is the other value or unset, and refuses
// anything else with am.ErrConfig.
func envFlag(name, on string, flag *bool) error {
	switch v := os.Getenv(name); v {
	case "":
	case on:
		*flag = true
	case "0", "1":
	default:
		return fmt.Errorf("%w: %s=%q (0 or 1)", am.ErrConfig, name, v)
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
// calls return am.ErrClosed; across processes, the launcher is asked to
// abort. The error names the failing rank. In an in-process job, a rank that
// called Abort makes Run print the abort and exit the process with its code,
// as Abort does itself under a launcher.
func Run(cfg am.Config, fn func(ep *am.Endpoint) error) error {
	if n, loop, err := loopSize(); err != nil {
		return err
	} else if loop {
		err := RunLocal(n, cfg, fn)
		// MPI_Abort's code is returned to the invoking environment
		// (MPI_Abort(3)), as a rank process under a launcher does in Abort.
		var ae *am.AbortError
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
		ep.Fail(oneLine(err))
		return err
	}
	return ep.Finalize()
}

// RunLocal runs fn on n ranks that are goroutines of this process, over the
// loop network (tests, embedding), or over package sim's simulated faulty
// network when AMGO_TRANSPORT=sim (faults from AMGO_SIM_SEED, AMGO_SIM_LOSS,
// ...: sim.ParseOptions). It returns when all have finished; see am.RunJob for
// how a failing rank ends the job.
func RunLocal(n int, cfg am.Config, fn func(ep *am.Endpoint) error) error {
	if err := configFromEnv(&cfg); err != nil {
		return err
	}
	trs, err := localJob(n)
	if err != nil {
		return err
	}
	return am.RunJob(trs, cfg, fn)
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
			return 0, false, fmt.Errorf("%w: %s=%q", am.ErrConfig, EnvLoopSize, v)
		}
	}
	if size := os.Getenv("PMI_SIZE"); size != "" && size != "1" {
		return 0, false, fmt.Errorf("%w: loop runs ranks as goroutines of one process; this launcher started %s processes", am.ErrConfig, size)
	}
	return n, true, nil
}

// Open attaches this process to its job as one rank (the process-per-rank
// form, as MPI_Init): it connects to the launcher over PMI-1 (or runs as a
// singleton), opens its networks and returns the endpoint, whose Abort and Finalize
// then speak to the launcher. A loop job of more than one rank cannot be
// opened this way: use Run or RunLocal. Errors: am.ErrConfig, bootstrap and
// transport errors.
//
// Networks: AMGO_TRANSPORT names one network for every peer (shm, tcp, udp,
// ...). Unset, each rank publishes its NodeID through PMI and learns which
// ranks share its node: on one node the job uses shm; across nodes each
// rank reaches the ranks of its node over shm and the others over AMGO_NET
// (tcp by default, or udp), through package route. A singleton uses loop.
func Open(cfg am.Config) (*am.Endpoint, error) {
	if err := configFromEnv(&cfg); err != nil {
		return nil, err
	}
	if n, loop, err := loopSize(); err != nil {
		return nil, err
	} else if loop && n > 1 {
		return nil, fmt.Errorf("%w: %s=%d asks for goroutine ranks; use job.Run or job.RunLocal", am.ErrConfig, EnvLoopSize, n)
	}
	boot, err := pmi.FromEnv()
	if err != nil {
		return nil, fmt.Errorf("am: bootstrap: %w", err)
	}
	if err := bindFromEnv(); err != nil {
		_ = boot.Abort(1, oneLine(err))
		return nil, err
	}
	// Which ranks share a node: for the choice of networks, and for MPI's
	// CommSplitType and node-aware collectives whatever the network. Then
	// what amrun would have done for this rank, if another launcher
	// started it (tune.go).
	if err := tuneHeap(); err != nil {
		_ = boot.Abort(1, oneLine(err))
		return nil, err
	}
	var layout Layout
	if !boot.IsSingleton() {
		id, err := NodeID()
		if err == nil {
			layout, err = discover(boot, id)
		}
		if err == nil {
			err = tuneSlack()
		}
		if err != nil {
			_ = boot.Abort(1, oneLine(err))
			return nil, fmt.Errorf("am: rank %d: %w", boot.Rank(), err)
		}
		tuneBind(layout, boot.Rank())
		if os.Getenv(EnvYield) == "" && oversubscribed(layout, boot.Rank()) {
			cfg.Yield = true
		}
	}
	var tr transport.Transport
	switch name := os.Getenv(EnvTransport); {
	case name != "":
		tr, err = transport.Open(name, boot, nil) // one network for every peer
	case boot.IsSingleton():
		tr, err = transport.Open("loop", boot, nil)
	default:
		tr, err = openRouted(boot, layout) // shm within this node, AMGO_NET between nodes
		if _, routed := tr.(*route.Transport); routed && runtime.GOMAXPROCS(0) < 2 && os.Getenv("GOMAXPROCS") == "" {
			// route's waiter sleeps in the other network's system calls
			// (ppoll), holding a P while it does: with one P, the rank's
			// own goroutine, woken by shared memory, would wait for the
			// runtime to take that P back (20 us and more).
			runtime.GOMAXPROCS(2)
		}
	}
	if err != nil {
		_ = boot.Abort(1, oneLine(err))
		return nil, fmt.Errorf("am: rank %d: %w", boot.Rank(), err)
	}
	ep, err := am.New(tr, cfg)
	if err != nil {
		_ = tr.Close()
		_ = boot.Abort(1, oneLine(err))
		return nil, err
	}
	if layout.Node != nil {
		if err := ep.SetLayout(layout.Node); err != nil {
			_ = ep.Close()
			_ = boot.Abort(1, oneLine(err))
			return nil, err
		}
	}
	ep.SetLauncher(pmiLauncher{boot})
	return ep, nil
}

// pmiLauncher is the launcher of a rank process, reached over PMI.
type pmiLauncher struct{ c *pmi.Client }

// Abort asks the launcher to end the job with code.
func (l pmiLauncher) Abort(code int, msg string) error { return l.c.Abort(code, msg) }

// Finalize tells the launcher that this rank finished.
func (l pmiLauncher) Finalize() error { return l.c.Finalize() }

// localJob opens the n goroutine ranks of an in-process job: over loop, or
// over the simulated faulty network of package sim when AMGO_TRANSPORT=sim
// (faults from AMGO_SIM_SEED, AMGO_SIM_LOSS, ...: sim.ParseOptions).
func localJob(n int) ([]transport.Transport, error) {
	if os.Getenv(EnvTransport) == "sim" {
		c, err := sim.ParseOptions(nil)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", am.ErrConfig, err)
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
// reported (am.ErrConfig); a thread that cannot be bound is skipped with a log
// line, since binding only steadies timings.
func bindFromEnv() error {
	v := os.Getenv(EnvBindCPU)
	if v == "" {
		return nil
	}
	cpu, err := strconv.Atoi(v)
	if err != nil || cpu < 0 || cpu >= 1024 {
		return fmt.Errorf("%w: %s=%q is not a CPU number", am.ErrConfig, EnvBindCPU, v)
	}
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err == nil && !allowed.IsSet(cpu) {
		return fmt.Errorf("%w: %s=%d: this process may not run on CPU %d", am.ErrConfig, EnvBindCPU, cpu, cpu)
	}
	bindTo(cpu)
	return nil
}

// bindTo binds every thread of this process to cpu (see bindFromEnv).
func bindTo(cpu int) {
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		slog.Warn("am: binding to a CPU: cannot list this process's threads", "err", err)
		return
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
}
