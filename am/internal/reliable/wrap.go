package reliable

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// drainBudget bounds how many packets one Poll or Send takes from the
// underlying transport, so that a flood cannot starve the caller.
const drainBudget = 1024

// Wrap returns a transport with ordered, reliable, exactly-once delivery per
// peer over tr, which may lose, reorder and duplicate packets (its Caps().Ordered
// or Reliable is false), using an Engine configured by cfg. cfg.Peers and
// cfg.Self are taken from tr; zero fields take the defaults. clock reads the
// time (nil: the monotonic clock, read as time.Now's monotonic part).
//
// The result's Caps: Ordered and Reliable true, QueueBytes 0 (it edits packets' headers), MaxPacket tr's less the 8-byte sequence extension (wire.SeqExtLen), no Put, Name
// tr's name with "+reliable", Wakeup and BufferBytes tr's. Send returns transport.ErrWouldBlock when Window
// packets to dst are unacknowledged (after first taking in acknowledgements that
// have arrived). Poll takes in tr's arrivals, runs the timers, transmits and
// hands up in-order packets. A peer that acknowledges nothing for DeadAfter while
// packets to it are outstanding is dead: Send to it returns an error wrapping
// transport.ErrPeer and ErrPeerDead that names the rank, and the Poll that
// notices it returns that error once. When tr is a transport.Waker the result
// is one too: Wake wakes tr.
//
// Progress: Send, Poll and Wait run the protocol. When none of them has run
// for cfg.ProgressInterval (default 1 ms), a goroutine does it instead: it
// takes in arrivals (in-order packets wait for the next Poll, at most Window
// per peer), acknowledges, retransmits and detects dead peers, so that a rank
// that stops calling its transport (finished sending, or computing) neither
// leaves its last packets unrecovered nor looks dead to its peers. Close stops
// it. A negative ProgressInterval disables it: then a rank must keep polling.
//
// Errors: those of New for a bad cfg.
func Wrap(tr transport.Transport, cfg Config, clock func() time.Time) (transport.Transport, error) {
	cfg.Peers, cfg.Self = tr.Size(), tr.Rank()
	e, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if clock == nil {
		// time.Now reads the wall clock and the monotonic one; the engine
		// needs only the latter, and a busy poller reads it on every Poll.
		base := time.Now()
		clock = func() time.Time { return base.Add(time.Since(base)) }
	}
	c := tr.Caps()
	w := &wrapped{tr: tr, eng: e, clock: clock,
		caps: transport.Caps{Name: c.Name + "+reliable", Ordered: true, Reliable: true, MaxPacket: c.MaxPacket - wire.SeqExtLen,
			Wakeup: c.Wakeup, BufferBytes: c.BufferBytes},
		deadErr: make([]error, tr.Size())}
	w.feed.w = w
	w.waker, _ = tr.(transport.Waker)
	w.batcher, _ = tr.(transport.Batcher)
	if e.Config().ProgressInterval > 0 {
		w.interval = e.Config().ProgressInterval
		w.stop = make(chan struct{})
		w.done = make(chan struct{})
		go w.progress()
	}
	if w.waker != nil {
		return wakingWrapped{w}, nil
	}
	return w, nil
}

// wakingWrapped is the result of Wrap over a transport.Waker.
type wakingWrapped struct{ *wrapped }

// Wake makes a Wait in progress return, or else the next one return at once
// (transport.Waker): it wakes the underlying transport, whose Wait the
// wrapper's Wait sleeps in.
func (w wakingWrapped) Wake() {
	w.woken.Store(true)
	w.waker.Wake()
}

type wrapped struct {
	tr      transport.Transport
	waker   transport.Waker   // tr, when it is one
	batcher transport.Batcher // tr, when it is one
	woken   atomic.Bool       // Wake was called: Wait returns
	clock   func() time.Time
	caps    transport.Caps

	mu        sync.Mutex // guards everything below, and calls into tr
	eng       *Engine
	closed    bool
	feed      feeder
	now       time.Time
	batch     []Delivery
	deadErr   []error // per rank, once declared dead: wraps transport.ErrPeer
	deadNews  []error // deaths not yet returned by Poll
	txDropped uint64  // transmissions the underlying transport refused (ErrWouldBlock): left to retransmission
	lastCall  time.Time

	interval   time.Duration
	stop, done chan struct{}
}

// progress runs the protocol when the caller has not for w.interval.
func (w *wrapped) progress() {
	defer close(w.done)
	t := time.NewTimer(w.interval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		wait := w.interval
		w.mu.Lock()
		now := w.clock()
		if idle := now.Sub(w.lastCall); idle >= w.interval {
			w.now = now
			w.pump()
			w.transmit() // errors reach the caller through its own calls; deaths through Poll
			if w.waker != nil && w.eng.HasReady() {
				// A caller asleep in tr's Wait would see what was taken in
				// only at the end of its slice.
				w.waker.Wake()
			}
		} else {
			wait = w.interval - idle
		}
		w.mu.Unlock()
		t.Reset(wait)
	}
}

// feeder hands the underlying transport's arrivals to the engine (w.mu held).
type feeder struct{ w *wrapped }

func (f *feeder) Deliver(src int, pkt []byte) { f.w.eng.Receive(f.w.now, src, pkt) }

func (w *wrapped) Rank() int            { return w.tr.Rank() }
func (w *wrapped) Size() int            { return w.tr.Size() }
func (w *wrapped) Caps() transport.Caps { return w.caps }

// Send hands the packet to the engine and transmits what it has ready.
func (w *wrapped) Send(dst int, hdr, payload []byte) error {
	if uint(dst) >= uint(w.tr.Size()) {
		return transport.PeerErrorf(dst, "reliable: send from rank %d to rank %d of %d", w.tr.Rank(), dst, w.tr.Size())
	}
	if n := len(hdr) + len(payload); n > w.caps.MaxPacket {
		return fmt.Errorf("reliable: send %d bytes to rank %d, max %d: %w", n, dst, w.caps.MaxPacket, transport.ErrTooLarge)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return transport.ErrClosed
	}
	w.now = w.clock()
	w.lastCall = w.now
	err := w.eng.SendParts(w.now, dst, hdr, payload)
	var perr error
	if err == ErrWindowFull {
		// Take in the acknowledgements that may have arrived, then try once more.
		perr = w.pump()
		err = w.eng.SendParts(w.now, dst, hdr, payload)
	}
	if terr := w.transmit(); perr == nil {
		perr = terr
	}
	switch {
	case err == nil:
		return perr
	case err == ErrWindowFull:
		if perr != nil {
			return perr
		}
		return transport.ErrWouldBlock
	case errors.Is(err, ErrPeerDead):
		return w.deadError(dst, err)
	case err == ErrShortPacket:
		return fmt.Errorf("reliable: send %d bytes to rank %d: %w", len(hdr)+len(payload), dst, err)
	}
	return err
}

// pump takes in the underlying transport's arrivals and runs due timers (w.mu held).
func (w *wrapped) pump() error {
	for total := 0; total < drainBudget; {
		n, err := w.tr.Poll(&w.feed, min(64, drainBudget-total))
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		total += n
	}
	if d := w.eng.NextDeadline(); !d.IsZero() && !w.now.Before(d) {
		w.eng.Tick(w.now)
	}
	return nil
}

// transmit sends the engine's ready Messages and notes new deaths (w.mu held).
// A packet the underlying network refuses now (ErrWouldBlock) counts as lost:
// the engine retransmits it.
func (w *wrapped) transmit() error {
	rd := w.eng.ReadyUpTo(0)
	var first error
	for _, m := range rd.Messages {
		if err := w.tr.Send(m.To, m.Data, nil); err != nil {
			if errors.Is(err, transport.ErrWouldBlock) {
				w.txDropped++
			} else if first == nil && !errors.Is(err, transport.ErrPeer) {
				first = err
			}
		}
	}
	for _, d := range rd.Dead {
		var de *DeadPeerError
		if errors.As(d, &de) {
			w.deadNews = append(w.deadNews, w.deadError(de.Rank, d))
		}
	}
	w.eng.AdvanceMessages()
	return first
}

func (w *wrapped) deadError(rank int, err error) error {
	if w.deadErr[rank] == nil {
		w.deadErr[rank] = transport.PeerErrorf(rank, "reliable: rank %d: %w", rank, err)
	}
	return w.deadErr[rank]
}

// Poll takes in arrivals, runs the timers, transmits, and hands up to maxPkts
// in-order packets to r. The handler runs without the lock held, so it may Send.
func (w *wrapped) Poll(r transport.Receiver, maxPkts int) (int, error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return 0, transport.ErrClosed
	}
	w.now = w.clock()
	w.lastCall = w.now
	err := w.pump()
	if w.eng.HasReady() {
		if terr := w.transmit(); err == nil {
			err = terr
		}
	}
	if err == nil && len(w.deadNews) > 0 {
		err = w.deadNews[0]
		w.deadNews = w.deadNews[:copy(w.deadNews, w.deadNews[1:])]
	}
	if maxPkts <= 0 || !w.eng.HasDeliveries() {
		w.mu.Unlock()
		return 0, err
	}
	rd := w.eng.ReadyUpTo(maxPkts)
	w.batch = append(w.batch[:0], rd.Deliveries...)
	batch := w.batch
	w.mu.Unlock()
	if len(batch) == 0 {
		return 0, err
	}
	// Only one Poll runs at a time, so batch and the engine's buffers behind it
	// stay ours until AdvanceDeliveries; concurrent Sends only advance Messages.
	for _, d := range batch {
		r.Deliver(d.From, d.Data)
	}
	w.mu.Lock()
	w.eng.AdvanceDeliveries()
	clear(w.batch)
	w.mu.Unlock()
	return len(batch), err
}

// Wait sleeps in the underlying transport until traffic may have arrived, for d
// at most and no later than the engine's next timer. It sleeps in slices of
// ProgressInterval, because the progress goroutine may take an arrival in
// before the underlying transport's Wait notices it.
func (w *wrapped) Wait(d time.Duration) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return transport.ErrClosed
	}
	if dl := w.eng.NextDeadline(); !dl.IsZero() {
		d = min(d, max(0, dl.Sub(w.clock())))
	}
	w.mu.Unlock()
	end := time.Now().Add(d)
	for {
		w.mu.Lock()
		ready := w.eng.HasReady()
		w.mu.Unlock()
		left := time.Until(end)
		if ready || left <= 0 {
			return nil
		}
		slice := left
		if w.interval > 0 {
			slice = min(slice, w.interval)
		}
		start := time.Now()
		if err := w.tr.Wait(slice); err != nil {
			return err
		}
		// A Wake ends the underlying Wait, but one late in a slice looks
		// like the slice's end: the flag tells.
		if w.woken.Swap(false) || time.Since(start) < slice {
			return nil // the underlying transport saw traffic, or a Wake
		}
	}
}

// Hold passes a Hold on to the underlying transport when it is a
// transport.Batcher (the packets this layer sends, acknowledgements
// included, are then kept until Flush), and does nothing otherwise.
func (w *wrapped) Hold() {
	if w.batcher != nil {
		w.batcher.Hold()
	}
}

// Flush ends a Hold (transport.Batcher). A Batcher's Flush is safe beside
// its Sends and Polls, so it runs without w.mu. Errors: the underlying
// Flush's.
func (w *wrapped) Flush() error {
	if w.batcher == nil {
		return nil
	}
	return w.batcher.Flush()
}

// Close closes the underlying transport; packets not yet acknowledged are lost.
func (w *wrapped) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	if w.stop != nil {
		close(w.stop)
		w.mu.Unlock()
		<-w.done // the goroutine may be waiting for w.mu
		w.mu.Lock()
	}
	return w.tr.Close()
}

// Stats returns the engine's counters. Package am can reach it through an
// interface{ Stats() reliable.Stats } assertion on Wrap's result.
func (w *wrapped) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.eng.Stats()
}
