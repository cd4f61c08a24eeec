package mpiam

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// recorder is a tool that records every event and piggybacks a value that
// identifies the sending rank.
type recorder struct {
	mu     sync.Mutex
	before []Event
	after  []Event
	value  uint64
}

func (t *recorder) Before(e *Event) {
	t.mu.Lock()
	t.before = append(t.before, *e)
	t.mu.Unlock()
}

func (t *recorder) After(e *Event) {
	t.mu.Lock()
	t.after = append(t.after, *e)
	t.mu.Unlock()
}

func (t *recorder) PiggybackValue() uint64 { return t.value }

func (t *recorder) calls() []Call {
	t.mu.Lock()
	defer t.mu.Unlock()
	var cs []Call
	for _, e := range t.after {
		cs = append(cs, e.Call)
	}
	return cs
}

func (t *recorder) last(c Call) Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(t.after) - 1; i >= 0; i-- {
		if t.after[i].Call == c {
			return t.after[i]
		}
	}
	return Event{}
}

// Hooks run before and after every call with its arguments and outcome, and
// the piggybacked value of the sender arrives with every kind of receive.
func TestToolSeesCallsAndPiggyback(t *testing.T) {
	tools := make([]*recorder, 2)
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		me := w.Rank()
		rec := &recorder{value: uint64(1000 + me)}
		tools[me] = rec
		r.NoError(w.AddTool(rec))
		peer := 1 - me
		big := make([]byte, r.eagerLimit(w)+100)
		if me == 0 {
			r.NoError(Send(w, []byte("hello"), peer, 1))
			r.NoError(Ssend(w, []byte("sync"), peer, 2))
			s, err := Isend(w, big, peer, 3)
			r.NoError(err)
			st, err := s.Wait()
			r.NoError(err)
			// The rendezvous handshake carried the receiver's value back.
			r.True(st.HasPiggyback)
			r.EqualValues(1001, st.Piggyback)
			r.NoError(Send(w, []int64{1, 2}, peer, 4))
			r.NoError(Send(w, []int64{3}, peer, 5))
		} else {
			buf := make([]byte, 16)
			st, err := Recv(w, buf, 0, 1)
			r.NoError(err)
			r.True(st.HasPiggyback)
			r.EqualValues(1000, st.Piggyback)
			ev := rec.last(CallRecv)
			r.Equal(0, ev.Peer)
			r.Equal(1, ev.Tag)
			r.Equal(16, ev.Bytes)
			r.EqualValues(1000, ev.Status.Piggyback)
			st, err = Recv(w, buf, 0, 2)
			r.NoError(err)
			r.EqualValues(1000, st.Piggyback, "synchronous send")
			rr, err := Irecv(w, big, 0, 3)
			r.NoError(err)
			st, err = rr.Wait()
			r.NoError(err)
			r.EqualValues(1000, st.Piggyback, "rendezvous Irecv: the value arrives at the Wait (tau-piggyback-async)")
			a, err := Irecv(w, make([]int64, 2), 0, 4)
			r.NoError(err)
			b, err := Irecv(w, make([]int64, 1), 0, 5)
			r.NoError(err)
			sts := make([]Status, 2)
			r.NoError(Waitall([]Request{a, b}, sts))
			wa := rec.last(CallWaitall)
			r.Equal([]int{0, 1}, wa.Done)
			r.Len(wa.Statuses, 2)
			for _, s := range wa.Statuses {
				r.True(s.HasPiggyback)
				r.EqualValues(1000, s.Piggyback)
			}
		}
		// A rendezvous whose receive is posted before the request-to-send
		// arrives (where the receiver reads, its handler does and replies with
		// the pulled notice): the notice carries the receiver's value.
		if me == 1 {
			rr, err := Irecv(w, big, 0, 6)
			r.NoError(err)
			r.NoError(w.Barrier())
			st, err := rr.Wait()
			r.NoError(err)
			r.EqualValues(1000, st.Piggyback)
		} else {
			r.NoError(w.Barrier())
			s, err := Isend(w, big, 1, 6)
			r.NoError(err)
			st, err := s.Wait()
			r.NoError(err)
			r.True(st.HasPiggyback)
			r.EqualValues(1001, st.Piggyback, "receiver's value on the rendezvous handshake")
		}
		// A collective: every rank learns the largest value among the ranks it
		// heard from.
		out := []int{0}
		r.NoError(Allreduce(w, []int{me}, out, Sum[int]()))
		ev := rec.last(CallAllreduce)
		r.True(ev.Status.HasPiggyback)
		r.EqualValues(1000+peer, ev.Status.Piggyback)
		for i := 0; i < 3; i++ { // the value rides on the barrier's active messages
			r.NoError(w.Barrier())
			ev = rec.last(CallBarrier)
			r.True(ev.Status.HasPiggyback, "barrier %d", i)
			r.EqualValues(1000+peer, ev.Status.Piggyback, "barrier %d", i)
		}
		// Nonblocking collectives (through the shared area where the ranks
		// share a node: the Allreduce above made it): more in flight than
		// the area has slots, each reporting the other rank's value.
		const k = 2*shmSlots + 3
		reqs := make([]Request, 0, 3*k)
		for i := range k {
			a := []int{me}
			req, err := Iallreduce(w, nil, a, Sum[int]())
			r.NoError(err)
			reqs = append(reqs, req)
			req, err = Ialltoall(w, []int{me, me}, make([]int, 2))
			r.NoError(err)
			reqs = append(reqs, req)
			req, err = Ibcast(w, []int{i}, i%2)
			r.NoError(err)
			reqs = append(reqs, req)
		}
		for i, req := range reqs {
			st, err := req.Wait()
			r.NoError(err)
			if i%3 == 2 && (i/3)%2 == me {
				continue // a broadcast's root hears from nobody
			}
			r.True(st.HasPiggyback, "nonblocking collective %d", i)
			r.EqualValues(1000+peer, st.Piggyback, "nonblocking collective %d", i)
		}
		if r.net == "loop" || r.net == "shm" { // one node
			r.Equal(shmReady, w.shmState.Load())
			r.Equal(uint64(3*k), w.shmc.nb.seq, "they went through the area")
		}
	})
	c0 := tools[0].calls()
	require.Contains(t, c0, CallSend)
	require.Contains(t, c0, CallSsend)
	require.Contains(t, c0, CallIsend)
	require.Contains(t, c0, CallWait)
	require.Contains(t, c0, CallAllreduce)
	require.Contains(t, c0, CallBarrier)
	c1 := tools[1].calls()
	require.Contains(t, c1, CallRecv)
	require.Contains(t, c1, CallIrecv)
	require.Contains(t, c1, CallWaitall)
	// Before and After pair up.
	require.Equal(t, len(tools[1].before), len(tools[1].after))
}

// Several tools stack: Before in the order added, After in reverse.
func TestToolsStack(t *testing.T) {
	var order []string
	var mu sync.Mutex
	mk := func(name string) Tool {
		return funcTool{
			before: func(e *Event) { mu.Lock(); order = append(order, name+">"+e.Call.String()); mu.Unlock() },
			after:  func(e *Event) { mu.Lock(); order = append(order, name+"<"+e.Call.String()); mu.Unlock() },
		}
	}
	err := RunLocal(1, Config{}, func(w *Comm) error {
		if err := w.AddTool(mk("a")); err != nil {
			return err
		}
		if err := w.AddTool(mk("b")); err != nil {
			return err
		}
		return w.Barrier()
	})
	require.NoError(t, err)
	require.Equal(t, []string{"a>Barrier", "b>Barrier", "b<Barrier", "a<Barrier"}, order)
}

type funcTool struct{ before, after func(e *Event) }

func (f funcTool) Before(e *Event) { f.before(e) }
func (f funcTool) After(e *Event)  { f.after(e) }

var toolTestRuns atomic.Int32

// A tool named in AMGO_TOOLS is attached to every rank without the program
// changing.
func TestToolFromEnvironment(t *testing.T) {
	var made atomic.Int32
	var seen atomic.Int32
	// The registry is the process's: a name of its own for every run (go test -count).
	name := fmt.Sprintf("counting-test-%d", toolTestRuns.Add(1))
	require.NoError(t, RegisterTool(name, func(w *Comm) (Tool, error) {
		made.Add(1)
		return funcTool{before: func(*Event) {}, after: func(*Event) { seen.Add(1) }}, nil
	}))
	require.ErrorIs(t, RegisterTool(name, nil), ErrArg)
	t.Setenv(EnvTools, name)
	require.NoError(t, RunLocal(3, Config{}, func(w *Comm) error { return w.Barrier() }))
	require.EqualValues(t, 3, made.Load())
	require.EqualValues(t, 3, seen.Load())
	t.Setenv(EnvTools, "no-such-tool")
	require.ErrorIs(t, RunLocal(1, Config{}, func(w *Comm) error { return nil }), ErrArg)
}

// With no tool attached, the cost of interposition on the hot path is one
// predictable branch: compare these two benchmarks.
func BenchmarkSelfSendRecvWithNopTool(b *testing.B) {
	err := RunLocal(1, Config{}, func(w *Comm) error {
		if err := w.AddTool(funcTool{before: func(*Event) {}, after: func(*Event) {}}); err != nil {
			return err
		}
		buf := make([]byte, 8)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := Send(w, buf, 0, 1); err != nil {
				return err
			}
			if _, err := Recv(w, buf, 0, 1); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
