package am

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/loop"
	_ "github.com/amgo-hpc/amgo/am/transport/shm" // registers "shm"
	"github.com/amgo-hpc/amgo/internal/pmi"
)

// Environment variables read by Run and Open.
const (
	// EnvTransport names the network: "loop" (ranks as goroutines in this
	// process) or "shm" (one rank per process on this host). amrun sets it.
	// Default: shm under a launcher, loop for a program started alone.
	EnvTransport = "AMGO_TRANSPORT"
	// EnvLoopSize is the number of goroutine ranks of a loop job (default 1).
	EnvLoopSize = "AMGO_LOOP_SIZE"
	// EnvBufferBytes overrides Config.BufferBytes.
	EnvBufferBytes = "AMGO_BUFFER_BYTES"
)

// ErrRankFailed reports, to the other ranks of an in-process job, that one rank's
// function failed and the job was ended.
var ErrRankFailed = errors.New("am: another rank of the job failed")

func (c *Config) fromEnv() error {
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
// The error names the failing rank.
func Run(cfg Config, fn func(ep *Endpoint) error) error {
	if err := cfg.fromEnv(); err != nil {
		return err
	}
	boot, err := pmi.FromEnv()
	if err != nil {
		return fmt.Errorf("am: bootstrap: %w", err)
	}
	name := os.Getenv(EnvTransport)
	if name == "" {
		name = "shm"
		if boot.IsSingleton() {
			name = "loop"
		}
	}
	if name == "loop" {
		n := 1
		if v := os.Getenv(EnvLoopSize); v != "" {
			if n, err = strconv.Atoi(v); err != nil || n < 1 {
				return fmt.Errorf("%w: %s=%q", ErrConfig, EnvLoopSize, v)
			}
		}
		if boot.Size() != 1 {
			return fmt.Errorf("%w: loop runs ranks as goroutines of one process; this launcher started %d processes", ErrConfig, boot.Size())
		}
		err := RunLocal(n, cfg, fn)
		if ferr := boot.Finalize(); err == nil {
			err = ferr
		}
		return err
	}
	tr, err := transport.Open(name, boot, nil)
	if err != nil {
		_ = boot.Abort(1, "transport: "+oneLine(err))
		return fmt.Errorf("am: rank %d: %w", boot.Rank(), err)
	}
	ep, err := New(tr, cfg)
	if err != nil {
		_ = tr.Close()
		_ = boot.Abort(1, oneLine(err))
		return err
	}
	if err := fn(ep); err != nil {
		err = fmt.Errorf("rank %d: %w", ep.Rank(), err)
		_ = boot.Abort(1, oneLine(err))
		return err
	}
	err = ep.Barrier()
	if cerr := ep.Close(); err == nil {
		err = cerr
	}
	if ferr := boot.Finalize(); err == nil {
		err = ferr
	}
	return err
}

// RunLocal runs fn on n ranks that are goroutines of this process, over the
// loop network (tests, embedding). It returns when all have finished; see Run
// for how a failing rank ends the job.
func RunLocal(n int, cfg Config, fn func(ep *Endpoint) error) error {
	trs, err := loop.NewJob(n, nil)
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
				errs[ep.rank] = fmt.Errorf("rank %d: %w", ep.rank, err)
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
	for _, ep := range eps {
		if ep.closed.Load() {
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

func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}
