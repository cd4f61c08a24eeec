package mpiam

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
)

// Interposition: tools observe every MPI call, the PMPI idea (MPI-4.1 §15.2)
// without a second library: a Tool registered with a process gets Before and
// After with the call's arguments, its request and its completion status. With
// no tool registered, each call pays one predictable branch.

// Call names an MPI operation seen by tools.
type Call uint8

// The calls tools see. Their String is the MPI name without the MPI_ prefix.
const (
	CallSend Call = iota + 1
	CallBsend
	CallSsend
	CallRsend
	CallIsend
	CallIbsend
	CallIssend
	CallIrsend
	CallRecv
	CallIrecv
	CallSendrecv
	CallSendrecvReplace
	CallProbe
	CallIprobe
	CallMprobe
	CallImprobe
	CallMrecv
	CallImrecv
	CallStart
	CallStartall
	CallWait
	CallTest
	CallWaitall
	CallWaitany
	CallWaitsome
	CallTestall
	CallTestany
	CallTestsome
	CallCancel
	CallBarrier
	CallBcast
	CallReduce
	CallAllreduce
	CallGather
	CallGatherv
	CallScatter
	CallScatterv
	CallAllgather
	CallAllgatherv
	CallAlltoall
	CallAlltoallv
	CallReduceScatterBlock
	CallScan
	CallExscan
	CallIbarrier
	CallIbcast
	CallIreduce
	CallIallreduce
	CallIallgather
	CallIalltoall
	CallCommDup
	CallCommSplit
	CallCommCreate
	CallCommFree
	CallCartCreate
	CallCartSub
	CallDistGraphCreateAdjacent
	CallNeighborAllgather
	CallNeighborAlltoall
	CallNeighborAllgatherv
	CallNeighborAlltoallv
	CallIneighborAllgather
	CallIneighborAlltoall
	CallIneighborAllgatherv
	CallIneighborAlltoallv
	CallDistGraphCreate
	CallGraphCreate
	CallIgather
	CallIgatherv
	CallIscatter
	CallIscatterv
	CallIallgatherv
	CallIalltoallv
	CallIreduceScatterBlock
	CallIreduceScatter
	CallReduceScatter
	CallIscan
	CallIexscan
	CallBarrierInit
	CallBcastInit
	CallReduceInit
	CallAllreduceInit
	CallGatherInit
	CallScatterInit
	CallAllgatherInit
	CallAlltoallInit
	CallReduceScatterBlockInit
	CallIalltoallw
	CallIneighborAlltoallw
	CallNeighborAlltoallw
	CallGathervInit
	CallScattervInit
	CallAllgathervInit
	CallAlltoallvInit
	CallAlltoallwInit
	CallReduceScatterInit
	CallScanInit
	CallExscanInit
	CallNeighborAllgatherInit
	CallNeighborAllgathervInit
	CallNeighborAlltoallInit
	CallNeighborAlltoallvInit
	CallNeighborAlltoallwInit
	callEnd
)

var callNames = [...]string{"", "Send", "Bsend", "Ssend", "Rsend", "Isend", "Ibsend", "Issend", "Irsend", "Recv", "Irecv", "Sendrecv", "SendrecvReplace", "Probe", "Iprobe", "Mprobe", "Improbe", "Mrecv", "Imrecv", "Start", "Startall", "Wait", "Test", "Waitall", "Waitany", "Waitsome", "Testall", "Testany", "Testsome", "Cancel", "Barrier", "Bcast", "Reduce", "Allreduce", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather", "Allgatherv", "Alltoall", "Alltoallv", "ReduceScatterBlock", "Scan", "Exscan", "Ibarrier", "Ibcast", "Ireduce", "Iallreduce", "Iallgather", "Ialltoall", "Comm_dup", "Comm_split", "Comm_create", "Comm_free", "Cart_create", "Cart_sub", "Dist_graph_create_adjacent", "Neighbor_allgather", "Neighbor_alltoall", "Neighbor_allgatherv", "Neighbor_alltoallv", "Ineighbor_allgather", "Ineighbor_alltoall", "Ineighbor_allgatherv", "Ineighbor_alltoallv", "Dist_graph_create", "Graph_create", "Igather", "Igatherv", "Iscatter", "Iscatterv", "Iallgatherv", "Ialltoallv", "Ireduce_scatter_block", "Ireduce_scatter", "Reduce_scatter", "Iscan", "Iexscan", "Barrier_init", "Bcast_init", "Reduce_init", "Allreduce_init", "Gather_init", "Scatter_init", "Allgather_init", "Alltoall_init", "Reduce_scatter_block_init", "Ialltoallw", "Ineighbor_alltoallw", "Neighbor_alltoallw", "Gatherv_init", "Scatterv_init", "Allgatherv_init", "Alltoallv_init", "Alltoallw_init", "Reduce_scatter_init", "Scan_init", "Exscan_init", "Neighbor_allgather_init", "Neighbor_allgatherv_init", "Neighbor_alltoall_init", "Neighbor_alltoallv_init", "Neighbor_alltoallw_init"}

// String is the call's MPI name without the MPI_ prefix ("Isend", "Comm_split").
func (c Call) String() string {
	if c > 0 && c < callEnd {
		return callNames[c]
	}
	return fmt.Sprintf("Call(%d)", uint8(c))
}

// IsCollective reports whether the call is a collective operation.
func (c Call) IsCollective() bool {
	return c >= CallBarrier && c <= CallIalltoall || c >= CallNeighborAllgather && c <= CallIneighborAlltoallv ||
		c >= CallIgather && c <= CallNeighborAlltoallwInit
}

// Event describes one MPI call to tools. Before sees the arguments; After sees
// the outcome too. Tools must not keep the Event after the hook returns, and
// must not call MPI from inside a hook.
type Event struct {
	Call Call
	Comm *Comm
	// Peer is the destination (sends), the source as given (receives, probes:
	// possibly AnySource) or the root (rooted collectives); ProcNull as given.
	Peer int
	// Tag is the tag as given (AnyTag possible on receives).
	Tag int
	// Bytes is the size of the data sent, or of the receive buffer, in bytes.
	Bytes int
	// Mode is the send mode of sends.
	Mode Mode
	// Request is the request a nonblocking call created (After), or the request
	// Wait, Test, Cancel or Start works on.
	Request Request
	// Requests are the requests of a multiple completion call or Startall, as
	// passed (After still names the ones the call set to the null Request).
	Requests []Request
	// Done (After of completion calls) lists the indices in Requests of the
	// requests that completed in this call, with their statuses in Statuses.
	Done     []int
	Statuses []Status
	// Status (After) is the completion status of a blocking receive, Wait,
	// Test, probe or collective; for collectives its Piggyback is the largest
	// value among the messages this rank received in the call.
	Status Status
	// Flag (After) reports whether Test/Iprobe/Improbe found completion or a message.
	Flag bool
	// Err (After) is the call's error.
	Err error
}

// Tool observes MPI calls. Before runs before the call, in the order tools
// were added; After runs after it, in the reverse order (as PMPI layers nest).
// Hooks run on the calling goroutine and may run concurrently for calls made
// by different goroutines.
type Tool interface {
	Before(e *Event)
	After(e *Event)
}

// Piggybacker is implemented by a tool that attaches one 64-bit value to every
// message this process sends: the value rides in
// the AM header of the message's own packet (eager data, rendezvous
// request-to-send and clear-to-send, collective traffic), never as an extra
// message and never by copying the user's buffer. It arrives in
// Status.Piggyback of the receive that takes the message (for Irecv, at the
// Wait/Test that completes it: tau-piggyback-async). PiggybackValue may be
// called from inside message handlers: it must be fast and must not block.
type Piggybacker interface {
	PiggybackValue() uint64
}

// ToolFactory makes a tool for one rank's world communicator.
type ToolFactory func(world *Comm) (Tool, error)

var (
	toolsMu   sync.Mutex
	toolsByID = map[string]ToolFactory{}
)

// EnvTrace names a directory: every rank writes a trace of its MPI events
// there (the built-in "trace" tool; read the files with cmd/amtrace).
const EnvTrace = "AMGO_TRACE"

// EnvProfile names a directory: every rank writes its profile (time per MPI
// routine, raw and overhead-compensated) there (the built-in "profile" tool;
// amrun --profile prints them).
const EnvProfile = "AMGO_PROFILE"

// EnvTools lists registered tools to attach to every rank, comma separated
// ("trace,profile"): a program needs no change to be observed.
const EnvTools = "AMGO_TOOLS"

// RegisterTool makes a tool available by name for AMGO_TOOLS (and for the
// built-in trace and profile tools, AMGO_TRACE and AMGO_PROFILE). Call it from
// an init function. Registering a name twice is an error.
func RegisterTool(name string, f ToolFactory) error {
	toolsMu.Lock()
	defer toolsMu.Unlock()
	if _, dup := toolsByID[name]; dup {
		return fmt.Errorf("%w: tool %q registered twice", ErrArg, name)
	}
	toolsByID[name] = f
	return nil
}

// AddTool attaches t to the process of world: from now on every MPI call of
// this process goes through its hooks. If t implements Piggybacker and no tool
// attached earlier does, its value rides on every outgoing message. Add tools
// before communicating: calls already under way are not observed. Errors:
// ErrComm.
func (c *Comm) AddTool(t Tool) error {
	if err := c.valid(); err != nil {
		return err
	}
	p := c.p
	p.tools = append(p.tools, t)
	if pb, ok := t.(Piggybacker); ok && p.pbTool == nil {
		p.pbTool = pb
	}
	if _, ok := t.(Closer); ok {
		p.watchToolsOnSignal()
	}
	return nil
}

// attachEnvTools instantiates the tools named by the environment for a new rank.
func (p *proc) attachEnvTools() error {
	var names []string
	if v := os.Getenv(EnvTools); v != "" {
		names = append(names, strings.Split(v, ",")...)
	}
	if os.Getenv(EnvTrace) != "" {
		names = append(names, "trace")
	}
	if os.Getenv(EnvProfile) != "" {
		names = append(names, "profile")
	}
	seen := map[string]bool{}
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "" || seen[n] {
			continue
		}
		seen[n] = true
		toolsMu.Lock()
		f, ok := toolsByID[n]
		toolsMu.Unlock()
		if !ok {
			return fmt.Errorf("%w: unknown tool %q in %s (registered: %s)", ErrArg, n, EnvTools, registeredTools())
		}
		t, err := f(p.world)
		if err != nil {
			return fmt.Errorf("tool %q: %w", n, err)
		}
		if err := p.world.AddTool(t); err != nil {
			return err
		}
	}
	return nil
}

func registeredTools() string {
	toolsMu.Lock()
	defer toolsMu.Unlock()
	var ns []string
	for n := range toolsByID {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return strings.Join(ns, ", ")
}

// Closer is implemented by tools that have work to do when their rank
// finalizes (write a trace or a profile).
type Closer interface {
	Close() error
}

// closeTools runs the Close of every tool that has one, in reverse order,
// once: Abort, a fatal signal and Finalize may each ask.
func (p *proc) closeTools() error {
	if !p.toolsClosed.CompareAndSwap(false, true) {
		return nil
	}
	var first error
	for i := len(p.tools) - 1; i >= 0; i-- {
		if c, ok := p.tools[i].(Closer); ok {
			if err := c.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// hooked reports whether calls on c go through tools: the one branch.
func (c *Comm) hooked() bool { return c != nil && c.p != nil && c.p.tools != nil }

// around runs f between the tools' Before and After hooks.
func (p *proc) around(e *Event, f func(e *Event)) {
	for _, t := range p.tools {
		t.Before(e)
	}
	f(e)
	for i := len(p.tools) - 1; i >= 0; i-- {
		p.tools[i].After(e)
	}
}

// hookErr runs f, an operation that only returns an error, under the hooks.
func (p *proc) hookErr(e *Event, f func() error) error {
	p.around(e, func(e *Event) { e.Err = f() })
	return e.Err
}

// hookStatus runs f, an operation that returns a status, under the hooks.
func (p *proc) hookStatus(e *Event, f func() (Status, error)) (Status, error) {
	p.around(e, func(e *Event) { e.Status, e.Err = f() })
	return e.Status, e.Err
}

// hookReq runs f, an operation that starts a request, under the hooks.
func (p *proc) hookReq(e *Event, f func() (Request, error)) (Request, error) {
	p.around(e, func(e *Event) { e.Request, e.Err = f() })
	return e.Request, e.Err
}

// RequestInfo describes a request to tools.
type RequestInfo struct {
	Send       bool // a send (else a receive or a collective)
	Collective bool
	Mode       Mode
	Comm       *Comm
	Peer       int // destination or source as given
	Tag        int // as given
	Bytes      int // send size or receive buffer size
	Persistent bool
}

// Info describes the request (for tools). A null request has a zero Info.
func (r *Request) Info() RequestInfo {
	s := r.state()
	if s == nil {
		return RequestInfo{}
	}
	return RequestInfo{Send: s.kind == kindSend, Collective: s.kind == kindColl, Mode: s.mode, Comm: s.comm,
		Peer: s.peer, Tag: s.tag, Bytes: s.size(), Persistent: s.persistent}
}

// Wait blocks until the request completes (MPI_Wait) and returns its status;
// the error is the status's Err. It polls while it waits. A null or inactive
// request returns an empty status at once.
func (r *Request) Wait() (Status, error) {
	s := r.state()
	if s == nil || s.p == nil || s.p.tools == nil {
		// The status a field at a time: see copyStatus.
		var st Status
		err := r.waitInto(&st)
		return Status{Source: st.Source, Tag: st.Tag, Err: st.Err, Bytes: st.Bytes,
			Cancelled: st.Cancelled, Piggyback: st.Piggyback, HasPiggyback: st.HasPiggyback}, err
	}
	e := Event{Call: CallWait, Comm: s.comm, Request: *r, Requests: []Request{*r}}
	s.p.around(&e, func(e *Event) {
		active := !r.null()
		e.Status, e.Err = r.wait()
		if active {
			e.Done, e.Statuses = []int{0}, []Status{e.Status}
		}
	})
	return e.Status, e.Err
}

// Test reports whether the request has completed (MPI_Test), polling once.
// When it has, it returns its status as Wait would. A null request: true and
// an empty status.
func (r *Request) Test() (bool, Status, error) {
	s := r.state()
	if s == nil || s.p == nil || s.p.tools == nil {
		// The status a field at a time: see copyStatus.
		var st Status
		done, err := r.testInto(&st)
		return done, Status{Source: st.Source, Tag: st.Tag, Err: st.Err, Bytes: st.Bytes,
			Cancelled: st.Cancelled, Piggyback: st.Piggyback, HasPiggyback: st.HasPiggyback}, err
	}
	e := Event{Call: CallTest, Comm: s.comm, Request: *r, Requests: []Request{*r}}
	s.p.around(&e, func(e *Event) {
		active := !r.null()
		e.Flag, e.Status, e.Err = r.test()
		if active && e.Flag {
			e.Done, e.Statuses = []int{0}, []Status{e.Status}
		}
	})
	return e.Flag, e.Status, e.Err
}

// Cancel asks to cancel a pending request (MPI_Cancel, MPI-4.1 §3.8.4). A
// receive that has not been matched is cancelled: Wait then returns at once
// with Status.Cancelled set and the buffer untouched. A receive already matched
// completes normally (the cancel has no effect, as the standard allows).
// Send requests cannot be cancelled: Cancel returns ErrCancelSend and the send
// completes normally, so Wait never hangs on it.
func (r *Request) Cancel() error {
	s := r.state()
	if s == nil || s.p == nil || s.p.tools == nil {
		return r.cancel()
	}
	return s.p.hookErr(&Event{Call: CallCancel, Comm: s.comm, Request: *r}, r.cancel)
}

// multiEvent starts the event of a multiple completion call; nil when no tool
// is attached (the call then allocates nothing).
func multiEvent(call Call, reqs []Request) (*proc, *Event) {
	p := activeProc(reqs)
	if p == nil || p.tools == nil {
		return p, nil
	}
	return p, &Event{Call: call, Requests: append([]Request(nil), reqs...)}
}

// doneSince fills e.Done and e.Statuses with the requests that were active
// before the call and are null now.
func doneSince(e *Event, before []bool, reqs []Request, statuses func(i int) Status) {
	for i := range reqs {
		if before[i] && reqs[i].null() {
			e.Done = append(e.Done, i)
			e.Statuses = append(e.Statuses, statuses(i))
		}
	}
}

func activeFlags(reqs []Request) []bool {
	b := make([]bool, len(reqs))
	for i, r := range reqs {
		b[i] = !r.null()
	}
	return b
}

// Waitall waits for every request (MPI_Waitall). statuses, if not nil, must
// have len(reqs) elements and receives each status. Completed non-persistent
// requests are set to the zero (null) Request. If any failed, the error wraps
// ErrInStatus and statuses carry the individual errors.
func Waitall(reqs []Request, statuses []Status) error {
	p, e := multiEvent(CallWaitall, reqs)
	if e == nil {
		return waitall(reqs, statuses)
	}
	st := statuses
	if st == nil {
		st = make([]Status, len(reqs))
	}
	before := activeFlags(reqs)
	p.around(e, func(e *Event) {
		e.Err = waitall(reqs, st)
		doneSince(e, before, reqs, func(i int) Status { return st[i] })
	})
	return e.Err
}

// Testall reports whether all requests have completed (MPI_Testall); if so it
// fills statuses and sets the completed non-persistent requests to the null
// Request, as Waitall. If not, nothing is changed.
func Testall(reqs []Request, statuses []Status) (bool, error) {
	p, e := multiEvent(CallTestall, reqs)
	if e == nil {
		return testall(reqs, statuses)
	}
	st := statuses
	if st == nil {
		st = make([]Status, len(reqs))
	}
	before := activeFlags(reqs)
	p.around(e, func(e *Event) {
		e.Flag, e.Err = testall(reqs, st)
		if e.Flag {
			doneSince(e, before, reqs, func(i int) Status { return st[i] })
		}
	})
	return e.Flag, e.Err
}

// Waitany waits for one request to complete (MPI_Waitany) and returns its index
// and status; that request is set to the null Request unless persistent.
// With no active request it returns Undefined and an empty status at once.
func Waitany(reqs []Request) (int, Status, error) {
	p, e := multiEvent(CallWaitany, reqs)
	if e == nil {
		var st Status
		idx, err := waitany(reqs, &st)
		return idx, Status{Source: st.Source, Tag: st.Tag, Err: st.Err, Bytes: st.Bytes,
			Cancelled: st.Cancelled, Piggyback: st.Piggyback, HasPiggyback: st.HasPiggyback}, err
	}
	var idx int
	p.around(e, func(e *Event) {
		idx, e.Err = waitany(reqs, &e.Status)
		if idx != Undefined {
			e.Done, e.Statuses = []int{idx}, []Status{e.Status}
		}
	})
	return idx, e.Status, e.Err
}

// Testany polls once and reports one completed request (MPI_Testany): its
// index, true and its status. With no active request it returns Undefined,
// true and an empty status; with active but none completed, Undefined and false.
func Testany(reqs []Request) (int, bool, Status, error) {
	p, e := multiEvent(CallTestany, reqs)
	if e == nil {
		var st Status
		idx, flag, err := testany(reqs, &st)
		return idx, flag, Status{Source: st.Source, Tag: st.Tag, Err: st.Err, Bytes: st.Bytes,
			Cancelled: st.Cancelled, Piggyback: st.Piggyback, HasPiggyback: st.HasPiggyback}, err
	}
	var idx int
	p.around(e, func(e *Event) {
		idx, e.Flag, e.Err = testany(reqs, &e.Status)
		if idx != Undefined {
			e.Done, e.Statuses = []int{idx}, []Status{e.Status}
		}
	})
	return idx, e.Flag, e.Status, e.Err
}

// Waitsome waits until at least one request has completed (MPI_Waitsome) and
// returns the indices of all completed ones with their statuses; those are set
// to the null Request unless persistent. With no active request it returns nil
// indices at once: MPI's outcount of MPI_UNDEFINED.
func Waitsome(reqs []Request) (indices []int, statuses []Status, err error) {
	p, e := multiEvent(CallWaitsome, reqs)
	if e == nil {
		return waitsome(reqs)
	}
	p.around(e, func(e *Event) {
		indices, statuses, e.Err = waitsome(reqs)
		e.Done, e.Statuses = indices, statuses
	})
	return indices, statuses, e.Err
}

// Testsome polls once and returns the indices and statuses of the requests that
// have completed (MPI_Testsome). With active requests of which none has
// completed, indices is empty but not nil (MPI's outcount 0); with no active
// request it is nil (outcount MPI_UNDEFINED).
func Testsome(reqs []Request) (indices []int, statuses []Status, err error) {
	p, e := multiEvent(CallTestsome, reqs)
	if e == nil {
		return testsome(reqs)
	}
	p.around(e, func(e *Event) {
		indices, statuses, e.Err = testsome(reqs)
		e.Done, e.Statuses = indices, statuses
	})
	return indices, statuses, e.Err
}
