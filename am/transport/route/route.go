// Package route is one rank's attachment to a job that uses several networks:
// shared memory between the ranks of one node and a network between nodes,
// as Open MPI's BTL multiplexer, MPICH's shared-memory module beside its
// netmod and GASNet's PSHM route by peer. A route Transport is a
// transport.Transport over the whole job whose Send, Put and Get go to the
// network that reaches the destination, whose Poll polls every network, and
// whose Wait sleeps until any network has traffic.
//
// Each network is opened over its own job: the node-local network over the
// ranks of this node (numbered 0..k-1 there, in job order), the network
// between nodes over every rank. Net.Ranks maps a network's ranks to the
// job's; route translates ranks both ways, including the rank of a
// transport.PeerError, so that package am sees one job.
//
// A network that is not ordered and reliable is wrapped in package reliable
// here, for its peers only: order and reliability are added where the
// peer's network lacks them, not for the whole job.
//
// Waiting: the first network (the node-local one, whose wake-up is a futex
// or a channel) is slept on by the caller; each other network has a waiter
// goroutine that sleeps in that network's Wait while the caller sleeps, and
// wakes the caller through the first network's transport.Waker when its
// network has traffic. No network is busy-polled while the rank sleeps, and
// the node-local network wakes the caller as fast as it does alone; traffic
// on another network costs one more thread wake-up.
package route

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am/internal/reliable"
	"github.com/amgo-hpc/amgo/am/transport"
)

// Net is one network of a job and the ranks it reaches.
type Net struct {
	// T is this rank's attachment to the network, opened over a job of
	// len(Ranks) ranks.
	T transport.Transport
	// Ranks[i] is the job rank of the network's rank i; nil means the
	// network spans the whole job in job order.
	Ranks []int
	// Peers lists the job ranks this network is the route to. A rank
	// reached by several networks goes by the first that lists it; every
	// rank must be listed by one.
	Peers []int
	// Spin is how long a caller's Wait keeps returning at once, so that
	// the caller goes on polling, while this network (not the first) is
	// hot and nothing has arrived since the first such Wait: the spin that
	// a job over this network alone would do inside the network's own Wait
	// before it sleeps (0: none). Waking a caller that sleeps on another
	// network costs two thread switches (this network's waiter, then the
	// caller), so a reply due within the spin is better polled for.
	Spin time.Duration
}

type member struct {
	t        transport.Transport
	name     string
	toJob    []int // network rank -> job rank
	recv     receiver
	waker    transport.Waker           // the network's own Wake, nil when it has none (it is then never slept on)
	batcher  transport.Batcher         // the network's, nil when it has none
	sleep    func(time.Duration) error // the waiter's: Sleep when the network has it (no spin), else Wait
	alone    bool                      // the network reaches no rank but this one
	kick     chan struct{}
	waiting  atomic.Bool   // the waiter sleeps in this network's Wait
	quiet    atomic.Int32  // Polls since this network last delivered or sent (up to hotPolls)
	woke     atomic.Bool   // the waiter's Wait saw traffic (Wait makes the network hot)
	spin     time.Duration // Net.Spin
	putter   transport.Putter
	putSend  transport.PutSender
	filler   transport.FillSender
	getter   transport.Getter
	targeter transport.PutTargeter
}

// receiver hands a network's packets up with their job rank.
type receiver struct {
	up    transport.Receiver
	toJob []int
}

func (r *receiver) Deliver(src int, pkt []byte) { r.up.Deliver(r.toJob[src], pkt) }

// Transport routes each peer to its network. It implements
// transport.Transport, transport.PeerCapser, transport.Putter,
// transport.PutSender, transport.Getter and transport.PutTargeter (each
// refusing, per peer, what that peer's network lacks), and
// transport.Batcher (passed on to the networks that are Batchers).
type Transport struct {
	rank, size int
	nets       []*member
	via        []uint8 // by job rank: index in nets
	local      []int32 // by job rank: its rank in that network
	caps       transport.Caps
	peerCaps   []transport.Caps // by network
	polls      uint64           // Polls so far (the cold networks' turn)
	layout     []int            // by rank: its node, when Build made the job
	sleeping   atomic.Bool      // the caller is in Wait
	spinFrom   atomic.Int64     // Unix ns of the first Wait since a Poll last delivered (0: none)
	last       atomic.Int32     // the network that delivered last (stored on change): Wait sleeps on it
	primary    atomic.Int32     // the network the caller sleeps on in its current Wait
	// A network that reaches only this rank (a rank alone on its node) has
	// no waiter: what arrives there are this rank's own sends, and one from
	// another goroutine while the caller sleeps on another network wakes
	// that network instead. selfAlone: self-sends go over such a network.
	selfAlone bool
	selfSends atomic.Uint64 // self-sends over it so far
	selfSeen  atomic.Uint64 // selfSends when a Poll last began (stored on change)
	closeOnce sync.Once
	closing   atomic.Bool
	done      chan struct{}
	wg        sync.WaitGroup
}

// ErrLayout reports networks that do not describe one job: a rank no
// network reaches, a network whose size does not match its Ranks, or this
// rank missing from a network.
var ErrLayout = errors.New("route: networks do not make one job")

// New returns the transport of job rank rank of a job of size ranks over
// nets (at most 255), the first being the one the caller sleeps on (the
// node-local network, which must be a transport.Waker when there are
// others). Networks that are not ordered and reliable are wrapped in package
// reliable. On success the Transport owns the networks (Close closes them);
// on error the caller still does. Errors: ErrLayout.
func New(rank, size int, nets []Net) (*Transport, error) {
	if len(nets) == 0 || len(nets) > 255 {
		return nil, fmt.Errorf("%w: %d networks", ErrLayout, len(nets))
	}
	t := &Transport{rank: rank, size: size, via: make([]uint8, size), local: make([]int32, size),
		done: make(chan struct{})}
	for i := range t.local {
		t.local[i] = -1
	}
	if len(nets) > 1 {
		if _, ok := nets[0].T.(transport.Waker); !ok {
			return nil, fmt.Errorf("%w: the first network (%s) has no Wake for the others' waiters", ErrLayout, nets[0].T.Caps().Name)
		}
	}
	toJobs := make([][]int, len(nets))
	for i, n := range nets {
		toJob := n.Ranks
		if toJob == nil {
			toJob = make([]int, size)
			for r := range toJob {
				toJob[r] = r
			}
		}
		toJobs[i] = toJob
		if n.T.Size() != len(toJob) || n.T.Rank() < 0 || n.T.Rank() >= len(toJob) || toJob[n.T.Rank()] != rank {
			return nil, fmt.Errorf("%w: network %d (%s) has %d ranks, this rank is its %d, for job ranks %v",
				ErrLayout, i, n.T.Caps().Name, n.T.Size(), n.T.Rank(), toJob)
		}
		toLocal := make(map[int]int, len(toJob))
		for lr, jr := range toJob {
			if jr < 0 || jr >= size {
				return nil, fmt.Errorf("%w: network %d reaches job rank %d of %d", ErrLayout, i, jr, size)
			}
			toLocal[jr] = lr
		}
		for _, p := range n.Peers {
			lr, ok := toLocal[p]
			if !ok {
				return nil, fmt.Errorf("%w: network %d routes rank %d, which it does not reach", ErrLayout, i, p)
			}
			if t.local[p] < 0 {
				t.via[p], t.local[p] = uint8(i), int32(lr)
			}
		}
	}
	for r, l := range t.local {
		if l < 0 {
			return nil, fmt.Errorf("%w: no network reaches rank %d", ErrLayout, r)
		}
	}
	var names []string
	for i, n := range nets {
		tr := n.T
		if c := tr.Caps(); !c.Ordered || !c.Reliable {
			w, err := reliable.Wrap(tr, reliable.Config{}, nil)
			if err != nil {
				return nil, fmt.Errorf("route: reliability layer over %s: %w", c.Name, err)
			}
			tr = w
		}
		m := &member{t: tr, name: tr.Caps().Name, toJob: toJobs[i], spin: nets[i].Spin, alone: true}
		for _, r := range n.Peers {
			m.alone = m.alone && r == rank
		}
		m.waker, _ = tr.(transport.Waker)
		m.batcher, _ = tr.(transport.Batcher)
		m.sleep = tr.Wait
		if sl, ok := tr.(transport.Sleeper); ok {
			m.sleep = sl.Sleep
		}
		names = append(names, m.name)
		m.recv.toJob = toJobs[i]
		m.putter, _ = tr.(transport.Putter)
		m.putSend, _ = tr.(transport.PutSender)
		m.filler, _ = tr.(transport.FillSender)
		m.getter, _ = tr.(transport.Getter)
		m.targeter, _ = tr.(transport.PutTargeter)
		t.nets = append(t.nets, m)
	}
	t.peerCaps = make([]transport.Caps, len(t.nets))
	t.caps = transport.Caps{Name: "route(" + strings.Join(names, ",") + ")", Ordered: true, Reliable: true, Wakeup: true,
		MaxPacket: int(^uint(0) >> 1)}
	for i, m := range t.nets {
		c := m.t.Caps()
		if m.putter == nil {
			c.Put = false
		}
		if m.getter == nil {
			c.Get = false
		}
		if m.putSend == nil {
			c.PutSend = false
		}
		if m.filler == nil {
			c.Fill = false
		}
		t.peerCaps[i] = c
		t.caps.MaxPacket = min(t.caps.MaxPacket, c.MaxPacket)
		t.caps.Put = t.caps.Put || c.Put
		t.caps.Get = t.caps.Get || c.Get
		t.caps.PutSend = t.caps.PutSend || c.PutSend
		t.caps.Fill = t.caps.Fill || c.Fill
		if i == 0 || c.QueueBytes < t.caps.QueueBytes {
			t.caps.QueueBytes = c.QueueBytes
		}
		t.caps.Wakeup = t.caps.Wakeup && c.Wakeup
	}
	if len(t.nets) > 1 {
		t.selfAlone = t.nets[t.via[rank]].alone
		for _, m := range t.nets {
			if m.alone {
				continue // no waiter (see selfAlone)
			}
			m.kick = make(chan struct{}, 1)
			t.wg.Add(1)
			go t.waiter(m)
		}
	}
	return t, nil
}

// Rank is this rank in the job.
func (t *Transport) Rank() int { return t.rank }

// Size is the number of ranks in the job.
func (t *Transport) Size() int { return t.size }

// Caps is what holds toward every peer: ordered and reliable (networks
// without are wrapped), MaxPacket and QueueBytes the smallest network's,
// Put, Get and PutSend when some peer's network has them (PeerCaps says
// which), and
// Name "route(" and the networks' names, comma-separated, ")".
func (t *Transport) Caps() transport.Caps { return t.caps }

// PeerCaps is the capabilities of the network that reaches peer (after any
// reliability wrapping); a rank out of range gets the job-wide Caps.
func (t *Transport) PeerCaps(peer int) transport.Caps {
	if uint(peer) >= uint(t.size) {
		return t.caps
	}
	return t.peerCaps[t.via[peer]]
}

// Network names the network that reaches peer ("" for a rank out of range).
func (t *Transport) Network(peer int) string {
	if uint(peer) >= uint(t.size) {
		return ""
	}
	return t.nets[t.via[peer]].name
}

func (t *Transport) route(dst int) (*member, int, error) {
	if uint(dst) >= uint(t.size) {
		return nil, 0, transport.PeerErrorf(dst, "route: rank %d of a job of %d", dst, t.size)
	}
	return t.nets[t.via[dst]], int(t.local[dst]), nil
}

// sent makes the network hot: what was sent over it needs its Polls (acks,
// retransmissions, queued output, the answer).
func (m *member) sent() {
	if m.quiet.Load() != 0 {
		m.quiet.Store(0)
	}
}

// jobErr gives a network's error about one of its ranks the job's rank.
func (m *member) jobErr(err error) error {
	if err == nil {
		return nil
	}
	return m.peerErr(err)
}

// peerErr is jobErr's slow path, apart so that jobErr allocates nothing.
func (m *member) peerErr(err error) error {
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Rank < 0 || pe.Rank >= len(m.toJob) {
		return err
	}
	if jr := m.toJob[pe.Rank]; jr != pe.Rank {
		return &transport.PeerError{Rank: jr, Err: fmt.Errorf("rank %d (rank %d of %s): %w", jr, pe.Rank, m.name, pe.Err)}
	}
	return err
}

// Send sends over dst's network. Errors as that network's, with job ranks.
func (t *Transport) Send(dst int, hdr, payload []byte) error {
	m, l, err := t.route(dst)
	if err != nil {
		return err
	}
	m.sent()
	if err := m.t.Send(l, hdr, payload); err != nil {
		return m.jobErr(err)
	}
	t.sentTo(dst)
	return nil
}

// sentTo wakes this rank's own sleeping Wait after a packet to itself on a
// network that has no waiter (selfAlone).
func (t *Transport) sentTo(dst int) {
	if dst == t.rank && t.selfAlone {
		// Count it before looking whether the caller sleeps; Wait counts
		// before it sleeps: one of the two sees the other.
		t.selfSends.Add(1)
		if t.sleeping.Load() {
			if w := t.nets[t.primary.Load()].waker; w != nil {
				w.Wake()
			}
		}
	}
}

// Polling the other networks. A poll of the node-local network costs tens
// of nanoseconds; a poll of a socket network costs system calls (a receive
// per connection, or an epoll_wait), which a rank spinning on shared memory
// would pay on every look and which would delay every shared-memory message
// that arrives meanwhile. So a network between nodes is polled on every
// Poll while it is hot (it delivered or was sent to within its last
// hotPolls polls), and
// otherwise every coldEvery-th Poll (tens of microseconds of
// spinning), as Open MPI's progress engine calls its event library only
// every so many calls. After a Wait, a network whose waiter saw traffic is
// hot again.
const (
	hotPolls  = 256
	coldEvery = 2048
)

// Poll polls the node-local network, and the others while they are hot or
// every coldEvery-th time (above), and hands up to max packets to r with
// their job ranks. A network's error is returned after the others are
// polled (the first, if several fail).
func (t *Transport) Poll(r transport.Receiver, max int) (int, error) {
	total := 0
	var first error
	t.polls++
	if t.selfAlone {
		if v := t.selfSends.Load(); v != t.selfSeen.Load() {
			t.selfSeen.Store(v)
		}
	}
	for i, m := range t.nets {
		if total >= max {
			break
		}
		q := m.quiet.Load()
		if i > 0 && q >= hotPolls && t.polls%coldEvery != 0 {
			if !m.woke.Load() {
				continue
			}
			m.woke.Store(false) // its waiter saw traffic: poll it now
			q = 0
		}
		m.recv.up = r
		n, err := m.t.Poll(&m.recv, max-total)
		m.recv.up = nil
		total += n
		if n > 0 && t.last.Load() != int32(i) {
			t.last.Store(int32(i))
		}
		// The first network's quietness is never read, and a store is a
		// locked instruction on every look of a rank that spins: count
		// only the others', and store only a change.
		switch {
		case i == 0:
		case n > 0:
			if q != 0 {
				m.quiet.Store(0)
			}
		case q < hotPolls:
			m.quiet.Store(q + 1)
		}
		if err != nil && first == nil {
			first = m.jobErr(err)
		}
	}
	if total > 0 && t.spinFrom.Load() != 0 {
		t.spinFrom.Store(0)
	}
	return total, first
}

// Wait sleeps until any network has traffic, or about d. With one network
// it is that network's Wait. Otherwise:
//
//   - while a network other than the first is hot and has a Spin, it returns
//     at once until that spin has passed since its first call with nothing
//     delivered (the caller polls on, as it would inside that network's own
//     Wait);
//   - it sleeps on one network, the primary: the one that delivered last
//     (a rank alone on its node whose traffic all comes from other nodes
//     sleeps in the socket network's own Wait, woken by the kernel directly),
//     else the one it slept on before (a network needs a Wake to be one);
//   - every other network's waiter goroutine is asked to sleep in its
//     network's Wait for as long as this one sleeps (unless it still does),
//     and wakes this one through the primary's Wake when that network has
//     traffic.
//
// No two goroutines are ever in one network's Wait. Errors: the primary's
// (transport.ErrClosed after Close).
func (t *Transport) Wait(d time.Duration) error {
	if len(t.nets) == 1 {
		return t.nets[0].t.Wait(d)
	}
	// While a network between nodes is hot, the caller first polls on for
	// that network's spin.
	var spin time.Duration
	for _, m := range t.nets[1:] {
		if m.quiet.Load() < hotPolls {
			spin = max(spin, m.spin)
		}
	}
	if spin > 0 {
		now := time.Now().UnixNano()
		from := t.spinFrom.Load()
		if from == 0 {
			t.spinFrom.Store(now)
			return nil
		}
		if time.Duration(now-from) < spin {
			return nil
		}
	}
	pi := t.pickPrimary()
	if pi < 0 {
		// Every network's waiter is still inside its Wait (three networks
		// or more): let the caller poll again shortly.
		time.Sleep(min(d, retryWait))
		return nil
	}
	p := t.nets[pi]
	// Every other network gets a waiter, even a cold one: a sleep on the
	// primary alone for a short while first would end on its timeout, and a
	// timed sleep ends up to the thread's timer slack late (a millisecond in
	// ranks that amrun starts, see docs/launch.md), which is how late a
	// packet from another node would then be seen.
	t.primary.Store(int32(pi))
	t.sleeping.Store(true)
	pending := false
	for i, m := range t.nets {
		if i == pi || m.alone {
			continue
		}
		if m.waiting.CompareAndSwap(false, true) {
			m.kick <- struct{}{} // capacity 1, and only the waiter empties it after waiting was false
		}
		// A waiter that saw traffic before sleeping was set may not have
		// woken the primary: do not sleep then.
		pending = pending || m.woke.Load()
	}
	// A self-send from another goroutine since the last Poll began, over a
	// network with no waiter.
	pending = pending || t.selfAlone && t.selfSends.Load() != t.selfSeen.Load()
	var err error
	if !pending {
		err = p.t.Wait(d)
	}
	t.sleeping.Store(false)
	for i, m := range t.nets {
		if m.woke.Swap(false) && i > 0 {
			m.quiet.Store(0) // its waiter woke us for it: poll it now
		}
	}
	return err
}

// pickPrimary chooses the network Wait sleeps on: the one that delivered
// last, else the one slept on before, else the first, else any, that has a
// Wake and no waiter inside its Wait (-1: none).
func (t *Transport) pickPrimary() int {
	free := func(i int) bool {
		m := t.nets[i]
		return m.waker != nil && !m.waiting.Load()
	}
	for _, i := range [3]int{int(t.last.Load()), int(t.primary.Load()), 0} {
		if free(i) {
			return i
		}
	}
	for i := range t.nets {
		if free(i) {
			return i
		}
	}
	return -1
}

// waiter sleeps in m's Wait while the caller sleeps on another network
// (from a kick until the caller wakes), and wakes the caller through that
// network's Wake when m's Wait sees traffic.
func (t *Transport) waiter(m *member) {
	defer t.wg.Done()
	for {
		select {
		case <-m.kick:
		case <-t.done:
			return
		}
		for {
			traffic := t.watch(m)
			if traffic {
				m.woke.Store(true)
			}
			m.waiting.Store(false)
			if traffic && t.sleeping.Load() {
				t.nets[t.primary.Load()].waker.Wake()
			}
			// The caller may have begun another Wait while this one ended
			// and found the waiter still waiting (no kick then): go on.
			if traffic || t.closing.Load() || !t.sleeping.Load() || !m.waiting.CompareAndSwap(false, true) {
				break
			}
		}
	}
}

// watch sleeps in m's Wait, in slices (so that Close, which must not run
// beside a network's Wait, never waits long), until m has traffic (true) or
// the caller no longer sleeps or the transport closes (false).
func (t *Transport) watch(m *member) bool {
	for {
		start := time.Now()
		err := m.sleep(waiterSlice)
		// Returned early: traffic (or a spurious return, which costs the
		// caller one more look).
		if err != nil || time.Since(start) < waiterSlice {
			return true
		}
		if !t.sleeping.Load() || t.closing.Load() {
			return false
		}
	}
}

// Put writes through dst's network. Errors: an error wrapping
// transport.ErrPutUnsupported when that network has no single-copy put,
// else that network's.
func (t *Transport) Put(dst int, addr uintptr, data []byte) error {
	m, l, err := t.route(dst)
	if err != nil {
		return err
	}
	if m.putter == nil {
		return fmt.Errorf("route: rank %d over %s: %w", dst, m.name, transport.ErrPutUnsupported)
	}
	m.sent()
	return m.jobErr(m.putter.Put(l, addr, data))
}

// PutSend puts and sends through dst's network. Errors: an error wrapping
// transport.ErrPutUnsupported when that network is no PutSender (PeerCaps
// says so beforehand), else that network's.
func (t *Transport) PutSend(dst int, addr uintptr, data, hdr, payload []byte) error {
	m, l, err := t.route(dst)
	if err != nil {
		return err
	}
	if m.putSend == nil {
		return fmt.Errorf("route: rank %d over %s: %w", dst, m.name, transport.ErrPutUnsupported)
	}
	m.sent()
	return m.jobErr(m.putSend.PutSend(l, addr, data, hdr, payload))
}

// SendFill sends through dst's network with the payload written in place
// (transport.FillSender). Errors: an error wrapping transport.ErrFillUnsupported
// when that network is no FillSender (PeerCaps says so beforehand), else
// that network's.
func (t *Transport) SendFill(dst int, hdr []byte, n int, f transport.Filler) error {
	m, l, err := t.route(dst)
	if err != nil {
		return err
	}
	if m.filler == nil {
		return fmt.Errorf("route: rank %d over %s: %w", dst, m.name, transport.ErrFillUnsupported)
	}
	m.sent()
	if err := m.filler.SendFill(l, hdr, n, f); err != nil {
		return m.jobErr(err)
	}
	t.sentTo(dst)
	return nil
}

// Get reads through src's network. Errors: an error wrapping
// transport.ErrGetUnsupported when that network has no single-copy get,
// else that network's.
func (t *Transport) Get(src int, addr uintptr, buf []byte) error {
	m, l, err := t.route(src)
	if err != nil {
		return err
	}
	if m.getter == nil {
		return fmt.Errorf("route: rank %d over %s: %w", src, m.name, transport.ErrGetUnsupported)
	}
	return m.jobErr(m.getter.Get(l, addr, buf))
}

// SetPutResolver hands r to every network that completes puts itself.
func (t *Transport) SetPutResolver(r transport.PutResolver) {
	for _, m := range t.nets {
		if m.targeter != nil {
			m.targeter.SetPutResolver(r)
		}
	}
}

// retryWait is how long Wait sleeps when every network's waiter is still
// inside its Wait (three networks or more) before the caller polls again.
const retryWait = 50 * time.Microsecond

// waiterSlice is the longest a waiter sleeps in its network's Wait before
// it looks whether the caller still sleeps and the transport is not closing.
const waiterSlice = 20 * time.Millisecond

// Close stops the waiters (within waiterSlice: a network's Close must not
// run beside its Wait), then closes every network. It returns the first
// network's error, if any.
func (t *Transport) Close() error {
	var first error
	t.closeOnce.Do(func() {
		t.closing.Store(true)
		close(t.done)
		t.wg.Wait()
		for _, m := range t.nets {
			if err := m.t.Close(); err != nil && first == nil {
				first = err
			}
		}
	})
	return first
}

var (
	_ transport.PeerCapser  = (*Transport)(nil)
	_ transport.Putter      = (*Transport)(nil)
	_ transport.PutSender   = (*Transport)(nil)
	_ transport.Getter      = (*Transport)(nil)
	_ transport.PutTargeter = (*Transport)(nil)
)

// Build opens the transports of an in-process job (goroutine ranks) whose
// rank r is on node nodes[r]: each node's ranks get the network local opens
// for them (numbered in job order), and every rank the network between
// opens for the whole job, which carries the traffic between nodes. Index r
// of the result is rank r's route Transport. Tests run the conformance
// suites on such mixed jobs (loop within a node, sim or loop between).
// Errors: the networks' and New's; what was opened is closed.
func Build(nodes []int, local, between func(n int) ([]transport.Transport, error)) ([]transport.Transport, error) {
	n := len(nodes)
	members := map[int][]int{} // node -> its job ranks, in order
	var order []int
	layout := make([]int, n) // nodes renumbered 0, 1, ... by their lowest rank
	index := map[int]int{}
	for r, k := range nodes {
		if _, ok := members[k]; !ok {
			index[k] = len(order)
			order = append(order, k)
		}
		members[k] = append(members[k], r)
		layout[r] = index[k]
	}
	var opened []transport.Transport
	fail := func(err error) ([]transport.Transport, error) {
		for _, tr := range opened {
			_ = tr.Close()
		}
		return nil, err
	}
	localOf := make([]transport.Transport, n)
	for _, k := range order {
		ranks := members[k]
		ts, err := local(len(ranks))
		if err != nil {
			return fail(err)
		}
		opened = append(opened, ts...)
		for i, r := range ranks {
			localOf[r] = ts[i]
		}
	}
	all, err := between(n)
	if err != nil {
		return fail(err)
	}
	opened = append(opened, all...)
	out := make([]transport.Transport, n)
	for r := range nodes {
		mine := members[nodes[r]]
		var remote []int
		for p := range nodes {
			if nodes[p] != nodes[r] {
				remote = append(remote, p)
			}
		}
		t, err := New(r, n, []Net{{T: localOf[r], Ranks: mine, Peers: mine}, {T: all[r], Peers: remote}})
		if err != nil {
			for _, tr := range out[:r] {
				_ = tr.Close()
			}
			return fail(err)
		}
		t.layout = layout
		out[r] = t
	}
	return out, nil
}

// Layout is the node of each rank when Build made the job
// (transport.Layouter), nil otherwise: package am reads it.
func (t *Transport) Layout() []int { return t.layout }

// Hold passes a Hold on to every network that is a transport.Batcher.
func (t *Transport) Hold() {
	for _, m := range t.nets {
		if m.batcher != nil {
			m.batcher.Hold()
		}
	}
}

// Flush ends a Hold on every network that is a transport.Batcher and
// returns the first error.
func (t *Transport) Flush() error {
	var first error
	for _, m := range t.nets {
		if m.batcher != nil {
			if err := m.batcher.Flush(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}
