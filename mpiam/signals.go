package mpiam

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/amgo-hpc/amgo/internal/release"
	"github.com/amgo-hpc/amgo/mpiam/internal/match"
)

// Signals a rank process reacts to, for every rank of the process that has
// not finalized:
//
//   - SIGUSR1 prints each rank's pending operations to standard error and the
//     job goes on (DiagSignal). amrun sends it to every rank before it ends a
//     job whose --timeout passed, and forwards its own SIGUSR1 to its ranks:
//     an erroneous program that hangs (a receive nobody matches, collectives
//     called in different orders) says what each rank waits for.
//   - SIGTERM, SIGINT and SIGHUP, once a tool with a Close method is attached
//     (the trace and profile tools), close the tools, so that a failed job's
//     trace is whole, then let the signal end the process as it would have.
//     A launcher ends the other ranks of a failed job with SIGTERM.
//
// A signal the program ignores is left alone.

// DiagSignal makes every rank of the process print its pending operations.
const DiagSignal = syscall.SIGUSR1

var toolSignals = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP}

// live is the process's ranks that have not finalized, and the watchers.
var live struct {
	mu      sync.Mutex
	procs   map[*proc]bool // value: its tools must be closed on a fatal signal
	diag    chan os.Signal
	closing chan os.Signal
}

// watchSignals makes p answer DiagSignal until it finalizes (unwatch).
func (p *proc) watchSignals() {
	live.mu.Lock()
	defer live.mu.Unlock()
	if live.procs == nil {
		live.procs = map[*proc]bool{}
	}
	if _, ok := live.procs[p]; !ok {
		live.procs[p] = false
	}
	if live.diag == nil && !signal.Ignored(DiagSignal) {
		live.diag = make(chan os.Signal, 1)
		signal.Notify(live.diag, DiagSignal)
		go printPendingOnSignal(live.diag)
	}
}

// watchToolsOnSignal has p's tools closed if the process is ended by a
// signal before p finalizes.
func (p *proc) watchToolsOnSignal() {
	p.watchSignals()
	live.mu.Lock()
	defer live.mu.Unlock()
	live.procs[p] = true
	if live.closing != nil {
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
	live.closing = make(chan os.Signal, 1)
	signal.Notify(live.closing, sigs...)
	go closeToolsAndReraise(live.closing)
}

// unwatch forgets p (finalized or aborted); the last rank stops the watchers.
func (p *proc) unwatch() {
	live.mu.Lock()
	defer live.mu.Unlock()
	if _, ok := live.procs[p]; !ok {
		return
	}
	delete(live.procs, p)
	if len(live.procs) > 0 {
		return
	}
	for _, ch := range []*chan os.Signal{&live.diag, &live.closing} {
		if *ch != nil {
			signal.Stop(*ch)
			close(*ch)
			*ch = nil
		}
	}
}

// liveProcs returns the process's live ranks in rank order; tools: only those
// whose tools must be closed on a fatal signal.
func liveProcs(tools bool) []*proc {
	live.mu.Lock()
	ps := make([]*proc, 0, len(live.procs))
	for p, closable := range live.procs {
		if closable || !tools {
			ps = append(ps, p)
		}
	}
	live.mu.Unlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i].ep.Rank() < ps[j].ep.Rank() })
	return ps
}

func printPendingOnSignal(ch chan os.Signal) {
	for range ch {
		var b strings.Builder
		for _, p := range liveProcs(false) {
			p.writePending(&b)
		}
		_, _ = io.WriteString(os.Stderr, b.String())
	}
}

func closeToolsAndReraise(ch chan os.Signal) {
	sig, ok := <-ch
	if !ok {
		return
	}
	for _, p := range liveProcs(true) {
		_ = p.closeTools()
	}
	signal.Reset(sig)
	_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
}

// activeColl is a collective call under way on this rank (runColl, startNB).
type activeColl struct {
	id    uint64
	call  Call
	ctx   uint32 // the communicator's context id
	peer  int    // root, or AnySource
	bytes int
}

// collBeginBlocking is collBegin for a blocking collective: at a
// single-threaded level, where only one goroutine is in the library, the
// outermost one goes into p.blocking without a lock (id 0).
func (p *proc) collBeginBlocking(call Call, c *Comm, peer, bytes int) uint64 {
	if p.seq != nil && !p.blocking.busy() {
		p.blocking.begin(call, c.ctx, peer, bytes)
		return 0
	}
	return p.collBegin(call, c, peer, bytes)
}

// collSlot records one collective call under way for a reader on another
// goroutine (writePending) without a lock, as a sequence lock: the writer
// makes gen odd, writes the words, makes gen even again; the reader takes
// the words only between two equal even readings of gen. Every word is
// written with a release store (a plain MOV on amd64, which keeps stores
// in order) and read with an atomic load; the odd count with release.Kept64,
// which the even one cannot make dead.
type collSlot struct {
	gen, on, call, ctx, peer, bytes uint64
}

// busy reports whether a call is recorded (the writer's own view).
func (s *collSlot) busy() bool { return atomic.LoadUint64(&s.on) != 0 }

func (s *collSlot) begin(call Call, ctx uint32, peer, bytes int) {
	g := atomic.LoadUint64(&s.gen)
	release.Kept64(&s.gen, g+1)
	release.Store64(&s.call, uint64(call))
	release.Store64(&s.ctx, uint64(ctx))
	release.Store64(&s.peer, uint64(peer))
	release.Store64(&s.bytes, uint64(bytes))
	release.Store64(&s.on, 1)
	release.Store64(&s.gen, g+2)
}

func (s *collSlot) end() {
	g := atomic.LoadUint64(&s.gen)
	release.Kept64(&s.gen, g+1)
	release.Store64(&s.on, 0)
	release.Store64(&s.gen, g+2)
}

// read returns the recorded call, if any, as the reader sees it (false: none,
// or it kept changing).
func (s *collSlot) read() (activeColl, bool) {
	for range 1000 {
		g := atomic.LoadUint64(&s.gen)
		if g%2 == 1 {
			runtime.Gosched()
			continue
		}
		a := activeColl{call: Call(atomic.LoadUint64(&s.call)), ctx: uint32(atomic.LoadUint64(&s.ctx)),
			peer: int(int64(atomic.LoadUint64(&s.peer))), bytes: int(atomic.LoadUint64(&s.bytes))}
		on := atomic.LoadUint64(&s.on) != 0
		if atomic.LoadUint64(&s.gen) == g {
			return a, on
		}
	}
	return activeColl{}, false
}

// collBegin records a collective call under way, for writePending, and
// returns its id for collEnd, which forgets it. Neither allocates once the
// slice has grown to the number of collectives in flight.
func (p *proc) collBegin(call Call, c *Comm, peer, bytes int) uint64 {
	p.diagMu.Lock()
	p.collSeq++
	id := p.collSeq
	p.colls = append(p.colls, activeColl{id: id, call: call, ctx: c.ctx, peer: peer, bytes: bytes})
	p.diagMu.Unlock()
	return id
}

func (p *proc) collEnd(id uint64) {
	if id == 0 {
		p.blocking.end()
		return
	}
	p.diagMu.Lock()
	for i := range p.colls {
		if p.colls[i].id == id {
			p.colls = append(p.colls[:i], p.colls[i+1:]...)
			break
		}
	}
	p.diagMu.Unlock()
}

// writePending writes what rank p waits for: collective calls under way,
// posted receives, rendezvous transfers and the unexpected messages queued.
func (p *proc) writePending(w io.Writer) {
	var lines []string
	var colls []activeColl
	if a, ok := p.blocking.read(); ok {
		colls = append(colls, a)
	}
	p.diagMu.Lock()
	colls = append(colls, p.colls...)
	p.diagMu.Unlock()
	describe := func(a activeColl) string {
		l := fmt.Sprintf("%v on communicator %d", a.call, a.ctx)
		if a.peer != AnySource {
			l += fmt.Sprintf(", root %d", a.peer)
		}
		return l + fmt.Sprintf(", %d bytes", a.bytes)
	}
	for _, a := range colls {
		lines = append(lines, describe(a))
	}
	if n := atomic.LoadUint64(&p.directN); n > 0 {
		l := fmt.Sprintf("%d nonblocking collective(s) through a shared area", n)
		if a, ok := p.direct.read(); ok {
			l += ", the last started: " + describe(a)
		}
		lines = append(lines, l)
	}

	locked := false
	for deadline := time.Now().Add(100 * time.Millisecond); p.seq == nil && !locked && time.Now().Before(deadline); {
		if locked = p.mu.TryLock(); !locked {
			time.Sleep(time.Millisecond)
		}
	}
	if p.seq != nil {
		// The rank's locks are plain flags (a single-threaded level): this
		// goroutine cannot read its state safely while the rank runs.
		lines = append(lines, fmt.Sprintf("(thread level %v, without locks: receives not listed; ThreadMultiple lists them)", p.thread))
	} else if !locked {
		lines = append(lines, "(the rank's matching state stayed locked; receives not listed)")
	} else {
		p.eng.Posted(func(s match.Spec, r *reqState) bool {
			lines = append(lines, "receive "+describeRecv(s, r))
			return true
		})
		ids := make([]uint64, 0, len(p.reqs))
		for id := range p.reqs {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		for _, id := range ids {
			r := p.reqs[id]
			what := "rendezvous send to"
			if r.kind == kindRecv {
				what = "rendezvous receive from"
			}
			lines = append(lines, fmt.Sprintf("%s rank %d, tag %d, communicator %d, %d bytes (transfer under way)",
				what, r.peer, r.tag, r.comm.ctx, r.size()))
		}
		st := p.eng.Stats()
		if st.Unexpected > 0 || st.Held > 0 {
			lines = append(lines, fmt.Sprintf("%d unexpected messages waiting for a receive, %d arrivals held for an earlier one", st.Unexpected, st.Held))
		}
		p.mu.Unlock()
	}
	fmt.Fprintf(w, "amgo: rank %d: %d pending operation(s)\n", p.ep.Rank(), len(lines))
	for _, l := range lines {
		fmt.Fprintf(w, "amgo: rank %d:   %s\n", p.ep.Rank(), l)
	}
}

// describeRecv says which message a posted receive waits for: source, tag,
// communicator (a collective's traffic runs on its communicator's context
// plus one) and buffer size.
func describeRecv(s match.Spec, r *reqState) string {
	src := fmt.Sprintf("rank %d", s.Source)
	if s.Source == match.AnySource {
		src = "any source"
	}
	tag := fmt.Sprintf("tag %d", s.Tag)
	if s.Tag == match.AnyTag {
		tag = "any tag"
	}
	comm := fmt.Sprintf("communicator %d", s.Context)
	if s.Context&1 == 1 {
		comm = fmt.Sprintf("communicator %d (a collective's traffic)", s.Context&^1)
	}
	size := 0
	if r != nil {
		size = r.size()
	}
	return fmt.Sprintf("from %s, %s, %s, %d bytes", src, tag, comm, size)
}
