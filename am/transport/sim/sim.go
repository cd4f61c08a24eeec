package sim

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
)

func init() {
	transport.Register("sim", func(b transport.Bootstrap, opts map[string]string) (transport.Transport, error) {
		if b.Size() != 1 {
			return nil, fmt.Errorf("sim: the factory opens only jobs of size 1 (this one has %d ranks); use sim.NewJob, or job.Run with AMGO_TRANSPORT=sim and AMGO_LOOP_SIZE, for ranks as goroutines", b.Size())
		}
		cfg, err := ParseOptions(opts)
		if err != nil {
			return nil, err
		}
		ts, err := NewJob(1, cfg)
		if err != nil {
			return nil, err
		}
		return ts[0], nil
	})
}

// Defaults.
const (
	// DefaultMaxPacket is the largest packet a sim network carries unless
	// Config.MaxPacket says otherwise, in bytes.
	DefaultMaxPacket = 64 << 10
	// DefaultReorderWindow is the longest extra delay of a reordered packet
	// unless Config.ReorderWindow says otherwise.
	DefaultReorderWindow = 200 * time.Microsecond
	// DefaultQueueLimit is how many packets may wait for one rank before
	// further ones are dropped, as a full socket buffer drops datagrams.
	DefaultQueueLimit = 8192
	// DefaultSpin is how long Wait polls before it parks.
	DefaultSpin = 5 * time.Microsecond
)

// EnvSeed is the environment variable that ParseOptions reads the seed from
// (option "seed"); tests read it too, so that "AMGO_SIM_SEED=N go test ..."
// replays a failure that printed seed=N.
const EnvSeed = "AMGO_SIM_SEED"

// Config describes the faults of a simulated network. The zero Config is a
// perfect network (no loss, no reordering, no duplication, no delay) that
// still reports itself as neither ordered nor reliable.
type Config struct {
	// Seed drives every random decision. Each directed link (src, dst) has its
	// own generator seeded from (Seed, src, dst), so the fate of the k-th
	// packet on a link depends only on the seed and k.
	Seed int64
	// Loss is the probability that one copy of a packet is lost, 0..1.
	Loss float64
	// Reorder is the probability that one copy of a packet is held back by an
	// extra delay drawn uniformly from (0, ReorderWindow], so that packets
	// sent after it may overtake it, 0..1.
	Reorder float64
	// Duplicate is the probability that a packet travels as two copies (each
	// then lost or reordered independently), 0..1.
	Duplicate float64
	// Delay is the one-way latency of every packet (0: deliverable at once).
	Delay time.Duration
	// ReorderWindow bounds the extra delay of a reordered packet; 0 means
	// DefaultReorderWindow.
	ReorderWindow time.Duration
	// MaxPacket is the largest packet Send takes, in bytes; 0 means
	// DefaultMaxPacket. It must be at least 512.
	MaxPacket int
	// QueueLimit is how many packets may wait for a rank (in flight or
	// arrived and not yet polled); beyond it a packet is dropped and counted
	// (Stats.Overflowed). 0 means DefaultQueueLimit.
	QueueLimit int
	// Partitions cut pairs of ranks apart for a while: a packet sent between
	// them (either direction) during the interval is lost.
	Partitions []Partition
	// Deaths make ranks stop: from the moment a rank dies, everything it
	// sends and everything sent to it is lost, and its Poll finds nothing, as
	// if its process had crashed. Kill does the same on demand.
	Deaths []Death
}

// Partition is a set of rank pairs that cannot talk between From and Until,
// measured from NewJob. Until 0 means for ever.
type Partition struct {
	// Pairs are the cut pairs; each is cut in both directions.
	Pairs [][2]int
	// From and Until bound the interval since NewJob.
	From, Until time.Duration
}

// Death is the moment a rank stops: At since NewJob (if positive), or after
// its AfterSends-th Send (if positive), whichever comes first.
type Death struct {
	// Rank is the rank that dies.
	Rank int
	// At is when it dies, since NewJob; 0 means not by time.
	At time.Duration
	// AfterSends makes it die once it has made this many Sends (to any
	// rank); 0 means not by count. The count is deterministic, the time not.
	AfterSends int64
}

// Stats are one rank's counters since NewJob. Sent counts the Sends this
// rank made; the others count packet copies sent to this rank.
type Stats struct {
	// Sent counts packets this rank sent (Sends that returned nil).
	Sent uint64
	// Delivered counts packets handed to this rank's Receiver.
	Delivered uint64
	// Lost counts copies lost by the Loss probability.
	Lost uint64
	// Duplicated counts extra copies made by the Duplicate probability.
	Duplicated uint64
	// Reordered counts copies held back by the Reorder probability.
	Reordered uint64
	// Overflowed counts copies dropped because QueueLimit packets waited.
	Overflowed uint64
	// Partitioned counts copies lost to a partition.
	Partitioned uint64
	// Dead counts copies lost because the sender or this rank was dead or
	// this rank had closed.
	Dead uint64
}

type counters struct {
	sent, delivered, lost, dup, reordered, overflowed, partitioned, dead atomic.Uint64
}

// network is the state the ranks of one job share.
type network struct {
	cfg   Config
	start time.Time
	ranks []*Transport
	caps  transport.Caps
}

// item is a packet copy on its way to a rank.
type item struct {
	due   int64  // nanoseconds since start
	order uint64 // tie-break, in arrival order
	src   int
	b     []byte
}

// Transport is one rank of a simulated job. It implements transport.Transport.
type Transport struct {
	net  *network
	rank int
	spin time.Duration

	closed atomic.Bool
	killed atomic.Bool
	sends  atomic.Int64
	st     counters

	// The inbox, guarded by mu: a min-heap of items by (due, order), the
	// per-link generators of the links into this rank, and spare buffers.
	mu    sync.Mutex
	q     []item
	order uint64
	links []*rand.Rand // by source
	free  [][]byte
	n     atomic.Int64 // len(q)

	waiters atomic.Int32
	bell    chan struct{}
	timerMu sync.Mutex // guards timer: Wait does not allocate one per call
	timer   *time.Timer
}

// NewJob opens the n ranks of a simulated job in this process; element i is
// rank i, a *Transport. Errors: n < 1, probabilities outside 0..1, negative
// durations, MaxPacket below 512, partitions or deaths naming ranks outside
// the job.
func NewJob(n int, cfg Config) ([]transport.Transport, error) {
	if n < 1 {
		return nil, fmt.Errorf("sim: job of %d ranks", n)
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"Loss", cfg.Loss}, {"Reorder", cfg.Reorder}, {"Duplicate", cfg.Duplicate}} {
		if !(p.v >= 0 && p.v <= 1) {
			return nil, fmt.Errorf("sim: %s %v outside 0..1", p.name, p.v)
		}
	}
	if cfg.Delay < 0 || cfg.ReorderWindow < 0 || cfg.QueueLimit < 0 {
		return nil, fmt.Errorf("sim: negative Delay, ReorderWindow or QueueLimit")
	}
	if cfg.ReorderWindow == 0 {
		cfg.ReorderWindow = DefaultReorderWindow
	}
	if cfg.MaxPacket == 0 {
		cfg.MaxPacket = DefaultMaxPacket
	}
	if cfg.MaxPacket < 512 || cfg.MaxPacket > 1<<30 {
		return nil, fmt.Errorf("sim: MaxPacket %d outside [512, 2^30]", cfg.MaxPacket)
	}
	if cfg.QueueLimit == 0 {
		cfg.QueueLimit = DefaultQueueLimit
	}
	for _, p := range cfg.Partitions {
		for _, pr := range p.Pairs {
			if uint(pr[0]) >= uint(n) || uint(pr[1]) >= uint(n) {
				return nil, fmt.Errorf("sim: partition pair %v outside a job of %d ranks", pr, n)
			}
		}
	}
	for _, d := range cfg.Deaths {
		if uint(d.Rank) >= uint(n) {
			return nil, fmt.Errorf("sim: death of rank %d outside a job of %d ranks", d.Rank, n)
		}
	}
	cfg.Partitions = append([]Partition(nil), cfg.Partitions...)
	cfg.Deaths = append([]Death(nil), cfg.Deaths...)
	nw := &network{cfg: cfg, start: time.Now(), ranks: make([]*Transport, n),
		caps: transport.Caps{Name: "sim", MaxPacket: cfg.MaxPacket, Wakeup: true}}
	ts := make([]transport.Transport, n)
	for r := range nw.ranks {
		t := &Transport{net: nw, rank: r, spin: DefaultSpin, links: make([]*rand.Rand, n), bell: make(chan struct{}, 1)}
		for src := range t.links {
			t.links[src] = rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(src)<<32|uint64(r)))
		}
		nw.ranks[r], ts[r] = t, t
	}
	return ts, nil
}

// Rank is this rank, 0..Size-1.
func (t *Transport) Rank() int { return t.rank }

// Size is the number of ranks in the job.
func (t *Transport) Size() int { return len(t.net.ranks) }

// Caps: neither ordered nor reliable (package am adds both), wake-up, no Put;
// MaxPacket from the Config.
func (t *Transport) Caps() transport.Caps { return t.net.caps }

// Config returns the job's configuration, defaults filled in.
func (t *Transport) Config() Config { return t.net.cfg }

// Kill makes this rank dead from now on, as a Death in the Config would: it
// stops sending and receiving (its calls still succeed, as a crashed
// process's peers cannot tell it from silence).
func (t *Transport) Kill() { t.killed.Store(true) }

// Stats returns a snapshot of this rank's counters.
func (t *Transport) Stats() Stats {
	s := &t.st
	return Stats{Sent: s.sent.Load(), Delivered: s.delivered.Load(), Lost: s.lost.Load(), Duplicated: s.dup.Load(),
		Reordered: s.reordered.Load(), Overflowed: s.overflowed.Load(), Partitioned: s.partitioned.Load(), Dead: s.dead.Load()}
}

// now is the time since the job started, in nanoseconds.
func (nw *network) now() int64 { return int64(time.Since(nw.start)) }

// dead reports whether rank r is dead at time now.
func (nw *network) dead(r int, now int64) bool {
	t := nw.ranks[r]
	if t.killed.Load() {
		return true
	}
	for _, d := range nw.cfg.Deaths {
		if d.Rank == r && ((d.At > 0 && now >= int64(d.At)) || (d.AfterSends > 0 && t.sends.Load() >= d.AfterSends)) {
			t.killed.Store(true)
			return true
		}
	}
	return false
}

// cut reports whether a partition separates a and b at time now.
func (nw *network) cut(a, b int, now int64) bool {
	for _, p := range nw.cfg.Partitions {
		if now < int64(p.From) || (p.Until > 0 && now >= int64(p.Until)) {
			continue
		}
		for _, pr := range p.Pairs {
			if (pr[0] == a && pr[1] == b) || (pr[0] == b && pr[1] == a) {
				return true
			}
		}
	}
	return false
}

// Send puts hdr and payload on the link to dst, where they meet the link's
// faults: the copy may be lost, duplicated or held back, or dropped by a
// partition, a dead rank or a full inbox. None of these is an error: a lossy
// network loses silently. It does not allocate once the inbox has spare
// buffers. Errors: transport.ErrTooLarge, transport.ErrPeer (dst out of
// range), transport.ErrClosed.
func (t *Transport) Send(dst int, hdr, payload []byte) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	nw := t.net
	if uint(dst) >= uint(len(nw.ranks)) {
		return transport.PeerErrorf(dst, "sim: send from rank %d to rank %d of %d", t.rank, dst, len(nw.ranks))
	}
	size := len(hdr) + len(payload)
	if size > nw.cfg.MaxPacket {
		return fmt.Errorf("sim: send %d bytes to rank %d, max %d: %w", size, dst, nw.cfg.MaxPacket, transport.ErrTooLarge)
	}
	now := nw.now()
	t.sends.Add(1)
	t.st.sent.Add(1)
	d := nw.ranks[dst]
	cfg := &nw.cfg
	d.mu.Lock()
	// Draw the same numbers for every packet, whatever happens to it, so that
	// the k-th packet on a link always meets the same fate.
	rng := d.links[t.rank]
	dupU := rng.Float64()
	var lossU, reoU [2]float64
	var extra [2]int64
	for c := range 2 {
		lossU[c], reoU[c] = rng.Float64(), rng.Float64()
		extra[c] = 1 + rng.Int64N(int64(cfg.ReorderWindow))
	}
	copies := 1
	if dupU < cfg.Duplicate {
		copies = 2
		d.st.dup.Add(1)
	}
	gone := nw.dead(t.rank, now) || nw.dead(dst, now) || d.closed.Load()
	cut := !gone && len(cfg.Partitions) > 0 && nw.cut(t.rank, dst, now)
	queued := false
	for c := 0; c < copies; c++ {
		switch {
		case gone:
			d.st.dead.Add(1)
			continue
		case cut:
			d.st.partitioned.Add(1)
			continue
		case lossU[c] < cfg.Loss:
			d.st.lost.Add(1)
			continue
		case len(d.q) >= cfg.QueueLimit:
			d.st.overflowed.Add(1)
			continue
		}
		due := now + int64(cfg.Delay)
		if reoU[c] < cfg.Reorder {
			due += extra[c]
			d.st.reordered.Add(1)
		}
		var b []byte
		if k := len(d.free); k > 0 && cap(d.free[k-1]) >= size {
			b = d.free[k-1][:size]
			d.free[k-1] = nil
			d.free = d.free[:k-1]
		} else {
			b = make([]byte, size, max(size, 2048))
		}
		copy(b[copy(b, hdr):], payload)
		d.order++
		d.push(item{due: due, order: d.order, src: t.rank, b: b})
		queued = true
	}
	d.mu.Unlock()
	if queued && d.waiters.Load() != 0 {
		select {
		case d.bell <- struct{}{}:
		default:
		}
	}
	return nil
}

// push adds it to the heap (t.mu held).
func (t *Transport) push(it item) {
	t.q = append(t.q, it)
	i := len(t.q) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !t.q[i].before(&t.q[p]) {
			break
		}
		t.q[i], t.q[p] = t.q[p], t.q[i]
		i = p
	}
	t.n.Store(int64(len(t.q)))
}

// pop removes the heap's first item (t.mu held, len(t.q) > 0).
func (t *Transport) pop() item {
	it := t.q[0]
	last := len(t.q) - 1
	t.q[0] = t.q[last]
	t.q[last] = item{}
	t.q = t.q[:last]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < last && t.q[l].before(&t.q[m]) {
			m = l
		}
		if l+1 < last && t.q[l+1].before(&t.q[m]) {
			m = l + 1
		}
		if m == i {
			break
		}
		t.q[i], t.q[m] = t.q[m], t.q[i]
		i = m
	}
	t.n.Store(int64(len(t.q)))
	return it
}

// maxFree bounds the spare buffers an inbox keeps.
const maxFree = 256

// recycle keeps b for a later Send to this rank (t.mu held).
func (t *Transport) recycle(b []byte) {
	if len(t.free) < maxFree {
		t.free = append(t.free, b)
	}
}

func (a *item) before(b *item) bool {
	return a.due < b.due || (a.due == b.due && a.order < b.order)
}

// Poll hands up to max packets whose time has come to r, earliest first. A
// dead rank's Poll discards its inbox and finds nothing. It does not
// allocate. Errors: transport.ErrClosed.
func (t *Transport) Poll(r transport.Receiver, max int) (int, error) {
	if t.closed.Load() {
		return 0, transport.ErrClosed
	}
	if t.n.Load() == 0 || max <= 0 {
		return 0, nil
	}
	now := t.net.now()
	if t.net.dead(t.rank, now) {
		t.mu.Lock()
		for len(t.q) > 0 {
			it := t.pop()
			t.st.dead.Add(1)
			t.recycle(it.b)
		}
		t.mu.Unlock()
		return 0, nil
	}
	got := 0
	for got < max {
		t.mu.Lock()
		if len(t.q) == 0 || t.q[0].due > now {
			t.mu.Unlock()
			break
		}
		it := t.pop()
		t.mu.Unlock()
		r.Deliver(it.src, it.b)
		got++
		t.st.delivered.Add(1)
		t.mu.Lock()
		t.recycle(it.b)
		t.mu.Unlock()
	}
	return got, nil
}

// next returns the due time of the earliest waiting packet, or -1.
func (t *Transport) next() int64 {
	if t.n.Load() == 0 {
		return -1
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.q) == 0 {
		return -1
	}
	return t.q[0].due
}

// Wait returns when a packet is due, or after about d: it polls for the spin
// time (yielding the processor), then parks until a peer sends, the earliest
// waiting packet falls due, or d passes. Errors: transport.ErrClosed.
func (t *Transport) Wait(d time.Duration) error {
	if t.closed.Load() {
		return transport.ErrClosed
	}
	nw := t.net
	start := nw.now()
	end := start + int64(d)
	due := func() (bool, int64) {
		n := t.next()
		now := nw.now()
		return n >= 0 && n <= now, now
	}
	for i := 0; ; i++ {
		ok, now := due()
		if ok || now >= end {
			return nil
		}
		if now-start >= int64(t.spin) {
			break
		}
		runtime.Gosched()
	}
	t.waiters.Add(1)
	defer t.waiters.Add(-1)
	ok, now := due()
	if ok || now >= end {
		return nil
	}
	until := end
	if n := t.next(); n >= 0 && n < until {
		until = n
	}
	sleep := time.Duration(until - now)
	if !t.timerMu.TryLock() {
		// Another goroutine waits with the timer: take a fresh one.
		tm := time.NewTimer(sleep)
		defer tm.Stop()
		select {
		case <-t.bell:
		case <-tm.C:
		}
		return nil
	}
	defer t.timerMu.Unlock()
	if t.timer == nil {
		t.timer = time.NewTimer(sleep)
	} else {
		t.timer.Reset(sleep)
	}
	select {
	case <-t.bell:
	case <-t.timer.C:
	}
	t.timer.Stop()
	return nil
}

// Close marks the rank closed: its methods return transport.ErrClosed, and
// packets sent to it are lost (counted in its Stats.Dead). Closing twice is a
// no-op.
func (t *Transport) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	t.mu.Lock()
	t.q, t.free = nil, nil
	t.n.Store(0)
	t.mu.Unlock()
	return nil
}

// ParseOptions builds a Config from transport options, each also read from
// the environment variable in brackets when absent from opts:
//
//	seed            int64 [AMGO_SIM_SEED], default 1
//	loss            probability 0..1 [AMGO_SIM_LOSS]
//	reorder         probability 0..1 [AMGO_SIM_REORDER]
//	dup             probability 0..1 [AMGO_SIM_DUP]
//	delay           a Go duration [AMGO_SIM_DELAY]
//	reorder_window  a Go duration [AMGO_SIM_REORDER_WINDOW]
//	max_packet      bytes [AMGO_SIM_MAX_PACKET]
//	queue           packets [AMGO_SIM_QUEUE]
//
// Errors: a value that does not parse, naming the option.
func ParseOptions(opts map[string]string) (Config, error) {
	cfg := Config{Seed: 1}
	get := func(key string) string {
		if v, ok := opts[key]; ok {
			return strings.TrimSpace(v)
		}
		return strings.TrimSpace(os.Getenv("AMGO_SIM_" + strings.ToUpper(key)))
	}
	bad := func(key, v, want string) (Config, error) {
		return Config{}, fmt.Errorf("sim: bad %s %q: want %s", key, v, want)
	}
	if v := get("seed"); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return bad("seed", v, "an integer")
		}
		cfg.Seed = s
	}
	for _, f := range []struct {
		key string
		p   *float64
	}{{"loss", &cfg.Loss}, {"reorder", &cfg.Reorder}, {"dup", &cfg.Duplicate}} {
		if v := get(f.key); v != "" {
			x, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
			if strings.HasSuffix(v, "%") {
				x /= 100
			}
			if err != nil || !(x >= 0 && x <= 1) {
				return bad(f.key, v, "a probability such as 0.1 or 10%")
			}
			*f.p = x
		}
	}
	for _, f := range []struct {
		key string
		p   *time.Duration
	}{{"delay", &cfg.Delay}, {"reorder_window", &cfg.ReorderWindow}} {
		if v := get(f.key); v != "" {
			x, err := time.ParseDuration(v)
			if err != nil || x < 0 {
				return bad(f.key, v, "a duration such as 100us")
			}
			*f.p = x
		}
	}
	for _, f := range []struct {
		key string
		p   *int
	}{{"max_packet", &cfg.MaxPacket}, {"queue", &cfg.QueueLimit}} {
		if v := get(f.key); v != "" {
			x, err := strconv.Atoi(v)
			if err != nil || x < 0 {
				return bad(f.key, v, "a count")
			}
			*f.p = x
		}
	}
	return cfg, nil
}
