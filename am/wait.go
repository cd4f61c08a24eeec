package am

import (
	"errors"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Waiting: the backoff of blocking calls, PollUntil, Drain, and the optional
// progress goroutine.

// osYield gives the processor to another runnable thread, if any
// (sched_yield(2)); a raw call, since it returns at once or after the other
// thread's turn and the Go scheduler need not know (Config.Yield). A
// variable so that tests can count the yields.
var osYield = func() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// backoff paces a blocking wait: poll hot, then poll and yield the processor
// now and then, for SpinTime, then sleep on the transport's wake-up so that a
// waiting rank gives its core away. A wait that ends must call end.
type backoff struct {
	spins     int
	yieldAt   int // the poll from which the wait yields every 16 polls
	long      bool
	start     time.Time
	stalled   time.Time // when the poll lock was first found busy with no poll finishing since
	lastPolls uint64
	asleep    time.Time // when this wait first slept: a long wait probes for dead peers
}

// Pacing of a blocking wait, in polls (a poll takes tens of nanoseconds): the
// first hotPolls run back to back. A wait that lasts longer counts itself in
// longWaiters; if fewer goroutines of the process wait so than GOMAXPROCS, it
// goes on polling without yielding up to soloPolls (a Gosched costs several
// polls' time and delays noticing an arrival, which shows in waits of about a
// microsecond); otherwise (ranks as goroutines, several
// waiting goroutines per rank) it yields every 16 polls from hotPolls on, so
// that the goroutine that will answer gets a processor.
const (
	hotPolls  = 64
	soloPolls = 512
)

// longWaiters counts the goroutines of this process in a wait that has lasted
// past hotPolls polls.
var longWaiters atomic.Int32

// end ends a wait: it stops counting as a long waiter.
func (b *backoff) end() {
	if b.long {
		b.long = false
		longWaiters.Add(-1)
	}
}

// progress polls once on behalf of a blocked caller and paces the retry.
func (ep *Endpoint) progress(b *backoff) error {
	if ep.closed.Load() {
		return ErrClosed
	}
	if ep.pollMu.TryLock() {
		n, err := ep.pollLocked()
		ep.pollMu.Unlock()
		if err != nil {
			return err
		}
		if n > 0 {
			b.spins = 0
			return nil
		}
		b.stalled = time.Time{}
	} else if polls := ep.polls.Load(); polls != b.lastPolls || b.stalled.IsZero() {
		b.lastPolls = polls
		b.stalled = time.Now()
	} else if b.spins%1024 == 0 && time.Since(b.stalled) > 2*time.Second {
		// The poll lock has been held for seconds by a poll that delivers
		// nothing more: this goroutine is inside a handler and asked for
		// something that needs a poll. Report it rather than hang.
		return ErrInHandler
	}
	b.spins++
	if b.spins < hotPolls {
		if ep.cfg.Yield {
			osYield() // oversubscribed: no hot polls, the awaited rank may need this processor
		}
		return nil
	}
	if b.spins == hotPolls {
		b.start = time.Now()
		if !b.long {
			b.long = true
			b.yieldAt = hotPolls
			if int(longWaiters.Add(1)) < runtime.GOMAXPROCS(0) {
				b.yieldAt = soloPolls
			}
		}
	}
	if b.spins%64 != 0 || time.Since(b.start) < ep.cfg.SpinTime || time.Now().UnixNano() < ep.expect.Load() {
		if ep.cfg.Yield {
			osYield() // another process's thread
		}
		if b.spins%16 == 0 && b.spins >= b.yieldAt {
			runtime.Gosched() // another goroutine of this one
		}
		return nil
	}
	if b.asleep.IsZero() {
		b.asleep = time.Now()
	} else if time.Since(b.asleep) >= probeEvery {
		if pe := ep.maybeProbe(); pe != nil {
			return pe
		}
	}
	if ep.pollMu.TryLock() {
		err := ep.sleep(time.Millisecond)
		ep.pollMu.Unlock()
		return err
	}
	time.Sleep(10 * time.Microsecond)
	return nil
}

// Relax is one turn of a wait that a layer above spins on memory of its own
// (a shared-memory collective's flags) rather than on the network: with
// Config.Yield it gives the processor to another runnable thread
// (sched_yield(2)), so that the rank it waits for, on the same processor,
// can run; otherwise it does nothing, and the spin stays hot.
func (ep *Endpoint) Relax() {
	if ep.cfg.Yield {
		osYield()
	}
}

// Expect tells the endpoint that traffic is due within d (a transfer of known
// size is under way): until then blocking waits keep polling instead of sleeping
// on the network's wake-up, which costs tens of microseconds on a halted
// virtual CPU. A layer that asked a peer for a large store calls it
// with the store's expected duration.
func (ep *Endpoint) Expect(d time.Duration) {
	until := time.Now().Add(d).UnixNano()
	for {
		old := ep.expect.Load()
		if old >= until || ep.expect.CompareAndSwap(old, until) {
			return
		}
	}
}

// PollUntil polls until cond returns true (GASNET_BLOCKUNTIL): hot at first,
// then sleeping on the network's wake-up. cond is evaluated on the calling
// goroutine between polls. Errors: ErrClosed, network errors, ErrInHandler,
// and a *PeerError (errors.Is ErrPeerDead) when a rank is found dead while it
// waits and cond still does not hold: every blocked PollUntil returns then,
// whichever goroutine noticed the death, so that a wait that depends on the
// dead rank cannot spin for ever; the caller decides whether to wait again.
// A PollUntil that starts after a death is not failed by it (DeadPeers lists
// the dead ranks).
func (ep *Endpoint) PollUntil(cond func() bool) error {
	if cond() {
		return nil
	}
	epoch := ep.deaths.Load()
	// The first hotPolls polls run without the pacing's bookkeeping (a
	// message's answer is usually found among them); errors, deaths and a
	// busy poll lock leave for the paced loop, which handles them.
	for range hotPolls {
		if !ep.pollMu.TryLock() {
			break
		}
		n, err := ep.pollLocked()
		ep.pollMu.Unlock()
		if err != nil || ep.deaths.Load() != epoch {
			break
		}
		if cond() {
			return nil
		}
		if n == 0 && ep.cfg.Yield {
			osYield() // oversubscribed: the awaited rank may need this processor now
		}
	}
	return ep.pollUntilPaced(cond, epoch)
}

// pollUntilPaced is PollUntil past its hot polls: paced by backoff.
func (ep *Endpoint) pollUntilPaced(cond func() bool, epoch int64) error {
	var b backoff
	defer b.end()
	for !cond() {
		err := ep.progress(&b)
		if err != nil && !errors.Is(err, ErrPeerDead) {
			return err
		}
		if err != nil || ep.deaths.Load() != epoch {
			if cond() {
				return nil
			}
			return ep.deadSince(epoch)
		}
	}
	return nil
}

// Drain polls until every request this endpoint sent has been answered (its
// buffer space at every peer is free again) or d passes. It returns the number
// of peers still holding space.
func (ep *Endpoint) Drain(d time.Duration) int {
	deadline := time.Now().Add(d)
	busy := func() int {
		n := 0
		for i := range ep.peers {
			if ep.dead[i].Load() != nil {
				continue // a dead rank returns no credit
			}
			p := &ep.peers[i]
			p.mu.Lock()
			if p.cr.InUse() > 0 || len(p.backlog) > 0 {
				n++
			}
			p.mu.Unlock()
		}
		return n
	}
	var b backoff
	defer b.end()
	for time.Now().Before(deadline) {
		if busy() == 0 {
			return 0
		}
		if err := ep.progress(&b); err != nil && !errors.Is(err, ErrPeerDead) {
			break
		}
	}
	return busy()
}

// OnProgress registers f to run after each poll of the progress goroutine
// (Config.Progress), outside any handler: a layer above am runs there the
// work its handlers deferred (in MPI over SP AM, the list of stores that any
// polling MPI call performs). Register before
// communication starts. f must not block for long.
func (ep *Endpoint) OnProgress(f func()) {
	ep.progressHooks = append(ep.progressHooks, f)
}

// startProgress starts the progress goroutine once, if configured.
func (ep *Endpoint) startProgress() {
	if ep.cfg.Progress <= 0 {
		return
	}
	ep.progressOnce.Do(func() {
		ep.progressStop = make(chan struct{})
		ep.progressDone = make(chan struct{})
		go ep.progressLoop(ep.cfg.Progress)
	})
}

func (ep *Endpoint) progressLoop(every time.Duration) {
	defer close(ep.progressDone)
	t := time.NewTicker(every)
	defer t.Stop()
	last := ep.polls.Load()
	for {
		select {
		case <-ep.progressStop:
			return
		case <-t.C:
		}
		if cur := ep.polls.Load(); cur != last {
			last = cur // someone is polling: nothing to do
			continue
		}
		for i := 0; i < 64; i++ {
			n, err := ep.Poll()
			if err != nil || n == 0 {
				break
			}
		}
		for _, f := range ep.progressHooks {
			f()
		}
		ep.flushPending()
		last = ep.polls.Load()
	}
}

// stopProgress ends the progress goroutine, if it runs.
func (ep *Endpoint) stopProgress() {
	ep.progressOnce.Do(func() {}) // no goroutine may start after this
	if ep.progressStop != nil {
		select {
		case <-ep.progressStop:
		default:
			close(ep.progressStop)
		}
		<-ep.progressDone
	}
}

// flushPending sends the credit returns this endpoint still owes its peers.
func (ep *Endpoint) flushPending() {
	ep.pollMu.Lock()
	defer ep.pollMu.Unlock()
	if ep.rx.credit.Pending() {
		ep.flushFrees()
	}
}
