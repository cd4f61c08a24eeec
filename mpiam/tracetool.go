package mpiam

import (
	"fmt"
	"os"
	"sync"

	"github.com/amgo-hpc/amgo/trace"
)

// The built-in "trace" tool: every rank writes its MPI events to
// AMGO_TRACE/rank-N.amtr in the record kinds of OTF2 (Send, Isend,
// IsendComplete, Recv, IrecvRequest, Irecv, RequestCancelled, collective
// begin and end) plus the enter and leave of every call; cmd/amtrace turns the
// files into matched messages and Perfetto JSON. docs/tools.md describes the
// format.

type tracer struct {
	w     *trace.Writer
	mu    sync.Mutex
	ids   map[Request]uint64 // request ids of the trace
	next  uint64
	comms map[uint32]bool // communicators already defined
	enter map[*Event]uint64
}

func init() {
	_ = RegisterTool("trace", newTracer)
}

func newTracer(world *Comm) (Tool, error) {
	dir := os.Getenv(EnvTrace)
	if dir == "" {
		return nil, fmt.Errorf("%w: the trace tool needs %s=DIR", ErrArg, EnvTrace)
	}
	return NewTracer(world, dir)
}

// NewTracer returns the trace tool for world's rank, writing dir/rank-N.amtr.
// Attach it with AddTool; AMGO_TRACE does this for every rank.
func NewTracer(world *Comm, dir string) (Tool, error) {
	w, err := trace.Create(dir, trace.Definitions{Rank: uint32(world.Rank()), Size: uint32(world.Size()),
		Clock: trace.Clock{Resolution: 1}})
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	t := &tracer{w: w, ids: map[Request]uint64{}, next: 1, comms: map[uint32]bool{}, enter: map[*Event]uint64{}}
	t.defineComm(world)
	return t, nil
}

func (t *tracer) defineComm(c *Comm) {
	if c == nil || t.comms[c.ctx] {
		return
	}
	t.comms[c.ctx] = true
	g, err := c.Group()
	if err != nil {
		return
	}
	ranks := make([]uint32, len(g.world))
	for i, w := range g.world {
		ranks[i] = uint32(w)
	}
	_ = t.w.DefineComm(c.ctx, ranks)
}

func (t *tracer) id(r Request) uint64 {
	if id, ok := t.ids[r]; ok {
		return id
	}
	id := t.next
	t.next++
	t.ids[r] = id
	return id
}

func (t *tracer) region(c Call) uint32 {
	id, _ := t.w.Region(c.String())
	return id
}

func (t *tracer) Before(e *Event) {
	now := t.w.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.defineComm(e.Comm)
	t.enter[e] = now
	_ = t.w.Enter(now, t.region(e.Call))
	if e.Call.IsCollective() {
		_ = t.w.CollectiveBegin(now)
	}
}

func u32(v int) uint32 { return uint32(int32(v)) }

func (t *tracer) After(e *Event) {
	now := t.w.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	start := t.enter[e]
	delete(t.enter, e)
	ctx := uint32(0)
	if e.Comm != nil {
		ctx = e.Comm.ctx
	}
	ok := e.Err == nil
	switch e.Call {
	case CallSend, CallBsend, CallSsend, CallRsend:
		if ok && e.Peer != ProcNull {
			_ = t.w.Send(start, u32(e.Peer), ctx, u32(e.Tag), uint64(e.Bytes))
		}
	case CallIsend, CallIbsend, CallIssend, CallIrsend:
		if ok && !e.Request.IsNull() && e.Peer != ProcNull {
			_ = t.w.Isend(start, u32(e.Peer), ctx, u32(e.Tag), uint64(e.Bytes), t.id(e.Request))
		}
	case CallIrecv, CallImrecv:
		if ok && !e.Request.IsNull() && e.Peer != ProcNull {
			_ = t.w.IrecvRequest(start, t.id(e.Request))
		}
	case CallRecv, CallMrecv:
		if ok && e.Status.Source >= 0 {
			_ = t.w.Recv(now, u32(e.Status.Source), ctx, u32(e.Status.Tag), uint64(e.Status.Bytes))
		}
	case CallSendrecv, CallSendrecvReplace:
		if ok {
			if e.Peer != ProcNull {
				_ = t.w.Send(start, u32(e.Peer), ctx, u32(e.Tag), uint64(e.Bytes))
			}
			if e.Status.Source >= 0 {
				_ = t.w.Recv(now, u32(e.Status.Source), ctx, u32(e.Status.Tag), uint64(e.Status.Bytes))
			}
		}
	case CallStart:
		t.started(e.Request, start)
	case CallStartall:
		for _, r := range e.Requests {
			t.started(r, start)
		}
	}
	for i, idx := range e.Done {
		if idx < len(e.Requests) && i < len(e.Statuses) {
			t.completed(e.Requests[idx], e.Statuses[i], now)
		}
	}
	if e.Call.IsCollective() {
		root := trace.NoRoot
		if e.Peer >= 0 {
			root = uint32(e.Peer)
		}
		_ = t.w.CollectiveEnd(now, t.region(e.Call), ctx, root, uint64(e.Bytes), uint64(e.Bytes))
	}
	_ = t.w.Leave(now, t.region(e.Call))
}

// started records the start of a persistent request as its nonblocking kind.
func (t *tracer) started(r Request, at uint64) {
	s := r.state()
	if s == nil || s.peer == ProcNull {
		return
	}
	id := t.id(r)
	if s.kind == kindSend {
		_ = t.w.Isend(at, u32(s.peer), s.comm.ctx, u32(s.tag), uint64(s.size()), id)
	} else if s.kind == kindRecv {
		_ = t.w.IrecvRequest(at, id)
	}
}

// completed records the completion of a nonblocking request. With a tool
// attached, reported requests keep their state (Request.recycle).
func (t *tracer) completed(r Request, st Status, at uint64) {
	s := r.state()
	if s == nil || s.kind == kindColl {
		return
	}
	id, known := t.ids[r]
	if !known {
		return // not started through a traced call (or to ProcNull)
	}
	delete(t.ids, r) // a persistent request's restart gets a fresh id
	switch {
	case st.Cancelled:
		_ = t.w.RequestCancelled(at, id)
	case s.kind == kindSend:
		_ = t.w.IsendComplete(at, id)
	default:
		_ = t.w.Irecv(at, u32(st.Source), s.comm.ctx, u32(st.Tag), uint64(st.Bytes), id)
	}
}

// Close flushes and closes the rank's trace file.
func (t *tracer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.w.Close()
}
