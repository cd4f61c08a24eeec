package am

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
)

// ErrRankFailed reports, to the other ranks of an in-process job, that one rank's
// function failed and the job was ended.
var ErrRankFailed = errors.New("am: another rank of the job failed")

// Launcher is what started a rank process, as Abort, Fail and Finalize need
// it: package job sets the PMI client of a launched process (SetLauncher).
type Launcher interface {
	// Abort asks the launcher to end the whole job with exit code code.
	Abort(code int, msg string) error
	// Finalize tells the launcher that this rank has finished.
	Finalize() error
}

// SetLauncher records what started this rank's process; set it before
// communication starts.
func (ep *Endpoint) SetLauncher(l Launcher) { ep.launcher = l }

// Finalize ends an endpoint: a barrier with every rank, Close, and the
// launcher's finalize. Errors of each step, the first one returned.
func (ep *Endpoint) Finalize() error {
	err := ep.Barrier()
	if cerr := ep.Close(); err == nil {
		err = cerr
	}
	if ep.launcher != nil {
		if ferr := ep.launcher.Finalize(); err == nil {
			err = ferr
		}
	}
	return err
}

// Fail ends a launched job after this rank's function failed with the error
// msg: it asks the launcher to abort the job (exit code 1) and closes the
// endpoint without waiting for its peers. Unlike Abort it returns, so that
// the caller can return its error.
func (ep *Endpoint) Fail(msg string) {
	if ep.launcher != nil {
		_ = ep.launcher.Abort(1, msg)
	}
	ep.closed.Store(true)
	_ = ep.tr.Close()
}

// abortLinger is how long a launched rank that called Abort waits for its
// launcher to end it before it exits by itself.
const abortLinger = 5 * time.Second

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
// to kill every rank, waits (up to 5 s) for it to do so, and otherwise exits
// this process with code; in an in-process job it
// closes every rank's endpoint, so their blocked calls fail with ErrClosed, and
// returns an *AbortError (matching ErrAborted) for the caller to return from
// its rank function (job.Run then exits the process with code).
func (ep *Endpoint) Abort(code int, msg string) error {
	if ep.launcher != nil {
		if ep.launcher.Abort(code, msg) == nil {
			// Stay until the launcher ends the job (PMIx_Abort blocks so
			// too): were this process to exit at once, its peers would see
			// their connections to it break and could fail, and reach the
			// launcher, before its abort does.
			time.Sleep(abortLinger)
		}
		os.Exit(code)
	}
	if ep.abortJob != nil {
		ep.abortJob()
	} else {
		ep.closed.Store(true)
	}
	return &AbortError{Rank: ep.rank, Code: code, Msg: msg}
}

// RunJob runs fn on the ranks of an in-process job, one goroutine per
// transport of trs (rank i on trs[i], all of one job, as loop.NewJob or
// sim.NewJob open them), each rank followed by a Barrier (after which it
// polls until every rank has passed it); it returns when all have finished,
// and closes the transports. If fn fails on a rank (or the
// barrier does), every endpoint is marked closed so that the others' blocked
// calls return ErrClosed; the result joins the errors that are not ErrClosed,
// each naming its rank (if there are none, it wraps ErrRankFailed). A rank
// that called Abort yields its *AbortError alone. Package job's RunLocal opens
// the transports from the environment.
func RunJob(trs []transport.Transport, cfg Config, fn func(ep *Endpoint) error) error {
	n := len(trs)
	var err error
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
	var passed atomic.Int64 // ranks past the closing barrier
	for i := range eps {
		wg.Add(1)
		go func(ep *Endpoint) {
			defer wg.Done()
			err := fn(ep)
			if err == nil {
				err = ep.Barrier()
			}
			if err == nil {
				// Poll on until every rank is past the barrier, as a
				// process does in Close: a rank's last barrier message may
				// still wait in its network for a connection opened lazily
				// (tcp dials a peer at its first packet), which only its
				// own polls complete.
				passed.Add(1)
				err = ep.PollUntil(func() bool { return passed.Load() == int64(n) })
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
