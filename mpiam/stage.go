package mpiam

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/internal/shmem"
	"github.com/amgo-hpc/amgo/mpiam/internal/proto"
)

// Shared stages. A rendezvous receive of non-contiguous data that asks for
// stores (rndv_typed.go) stages the packed data in a buffer and unpacks it
// from there. When the sender runs on the same node and reaches this rank
// through shared memory, the buffer is a file both ranks map (a shared
// stage, as GASNet's PSHM maps a node's segments into each process): the
// sender packs each piece straight into it and sends the data notice, one
// pass over the data on each side, where a store would pack into scratch
// and then copy that into the buffer.
//
// A receiving rank keeps one stage per sending rank, made on its first
// strided receive from that sender and reused while the job lasts; a second
// receive from the same sender while the first runs, or one past
// maxStages senders, stages in private memory as before. The file is named
// from the receiver's process id and a generation (the clear-to-send
// carries both, proto.StageFlags), made in the job directory
// ($AMGO_JOB_DIR, which the launcher removes) or else /dev/shm, and
// unlinked once the first piece has landed through it: by then the sender
// has mapped it. The stage is also registered as a segment, so that a
// sender that cannot map it stores into it instead.

// stageBytes is a shared stage's size: four staging buffers (typedChunk),
// so that the pieces of a receive, at most half a buffer each, go through
// it in turn (stageIn.place) and a sender's ordinary stores seldom find a
// line the receiver's core still holds from unpacking it (stageWriter).
const stageBytes = 4 * typedChunk

// maxStages bounds the shared stages a rank makes, one per sending rank.
const maxStages = 16

// EnvTypedStage, set to "0", turns shared stages off: strided receives
// stage in private memory and the sender stores into it.
const EnvTypedStage = "AMGO_TYPED_STAGE"

// stageGen numbers the stage files of this process: goroutine ranks share
// one process id.
var stageGen atomic.Uint32

// stageIn is a shared stage this rank receives into from one sender. Its
// fields are guarded by proc.mu.
type stageIn struct {
	path   string
	mem    []byte
	seg    am.Segment
	gen    uint32
	pid    uint32 // this process's id, which the stage's name and clear-to-sends carry
	busy   bool   // a receive stages in it
	linked bool   // its name is still in the file system
	dead   bool   // its sender failed, or it could not be made: never used again
	next   int    // where place puts the next piece
}

// place returns where in the stage a piece of n bytes (at most half a
// staging buffer) goes: right after the piece before it, or at the start
// when it would pass the end; a line is thus written again only after the
// receiver has unpacked most of a stage's worth of other pieces. The
// caller checks that the place is clear of the pieces still in flight
// (askPieceLocked: one may lag while the others go round the stage) and
// then takes it (take). p.mu is held.
func (st *stageIn) place(n int) int {
	if st.next+n > len(st.mem) {
		return 0
	}
	return st.next
}

// take takes the place place gave for a piece of n bytes: the next piece
// goes after it. p.mu is held.
func (st *stageIn) take(off, n int) {
	st.next = (off + n + proto.StageUnit - 1) &^ (proto.StageUnit - 1)
}

// stageOut is a peer's shared stage this rank sends into.
type stageOut struct {
	pid, gen uint32
	mem      []byte // nil: could not be mapped (store instead)
	w        stageWriter
}

// stageWriter chooses the stores with which one rank writes pieces into
// one peer's shared stage. Ordinary stores leave the piece in this core's
// caches, from which the receiver's unpack reads it at about twice the
// rate it reads memory; but each store first takes its line back from
// wherever it is, which is slow when the two cores share no cache (a
// virtual machine's two CPUs on separate core complexes: a 1 MiB strided
// message then took 3.5 times as long). Non-temporal stores write whole
// lines to memory without taking them, at the same rate either way, and
// the receiver then reads memory. So the writer measures both: it times
// every piece (nanoseconds a KiB) in the way it was written and keeps each
// way's recent best (record), and every stageExplore-th piece writes its
// first stageProbe bytes the other way; it takes non-temporal stores when
// ordinary ones take more than stageNTRatio times as long (with
// non-temporal stores the unpack out of memory bounds the pipeline at
// about that ratio), and ordinary ones otherwise. Pieces to one stage are
// usually written one after another (one goroutine takes the sender's
// queued work); the fields are atomic for when two goroutines write pieces
// at once (the async progress goroutine, or two receives' pieces).
type stageWriter struct {
	plain, nt atomic.Int64 // recent best, ns a KiB; 0: not measured yet
	pieces    atomic.Uint64
}

const (
	stageExplore = 32
	stageProbe   = 16 << 10
	stageNTRatio = 2
)

// write fills dst, a piece of a shared stage, with fill(part, at, nt),
// which writes part, the bytes from at of the piece, with non-temporal
// stores (fenced) or not as nt says.
func (w *stageWriter) write(dst []byte, fill func(part []byte, at int, nt bool)) {
	nt := w.useNT()
	if w.pieces.Add(1)%stageExplore == 1 && len(dst) >= 2*stageProbe {
		w.timed(dst[:stageProbe], 0, !nt, fill)
		w.timed(dst[stageProbe:], stageProbe, nt, fill)
		return
	}
	w.timed(dst, 0, nt, fill)
}

// useNT reports whether the next piece goes with non-temporal stores.
func (w *stageWriter) useNT() bool {
	nt := w.nt.Load()
	return nt > 0 && w.plain.Load() > stageNTRatio*nt
}

// timed runs fill on part and records its rate for the way it took.
func (w *stageWriter) timed(part []byte, at int, nt bool, fill func(part []byte, at int, nt bool)) {
	if len(part) == 0 {
		return
	}
	t0 := time.Now()
	fill(part, at, nt)
	w.record(nt, int64(time.Since(t0))<<10/int64(len(part)))
}

// record adds rate (ns a KiB) of a part written with non-temporal stores
// or not to that way's recent best: a faster rate replaces it, a slower
// one moves it an eighth of the way. A way's best is what it does when
// nothing else gets in the way (a piece now and then is slowed by the
// lines it finds, a page fault, an interrupt), and it follows a lasting
// change within a few pieces.
func (w *stageWriter) record(nt bool, rate int64) {
	rate = max(rate, 1)
	best := &w.plain
	if nt {
		best = &w.nt
	}
	if old := best.Load(); old == 0 || rate < old {
		best.Store(rate)
	} else {
		best.Store(old + (rate-old)/8)
	}
}

// stages is a rank's shared stages, both ways.
type stages struct {
	off bool             // EnvTypedStage=0
	in  map[int]*stageIn // by sending world rank, under proc.mu
	mu  sync.Mutex       // guards out
	out map[int]*stageOut
	// packed counts the bytes this rank packed straight into peers' stages.
	packed atomic.Int64
}

// stageOpen maps a peer's stage file (a variable for the tests of a sender
// that cannot).
var stageOpen = shmem.Open

// stageDir is where stage files are made.
func stageDir() string {
	if d := os.Getenv("AMGO_JOB_DIR"); d != "" {
		return d
	}
	return shmem.Dir
}

// stagePath is the file of generation gen of process pid's stages.
func stagePath(pid, gen uint32) string {
	return fmt.Sprintf("%s/amgo-stage-%d-%d", stageDir(), pid, gen)
}

// stagesTo reports whether world rank peer, as a receiver of strided data,
// may stage it in a shared stage this rank packs into: stages are on, and
// peer is on this node and reached through shared memory.
func (p *proc) stagesTo(peer int) bool {
	return !p.stages.off && p.ep.Node(peer) == p.ep.Node(p.ep.Rank()) && p.ep.CanGet(peer, stageBytes)
}

// stageForLocked returns the shared stage this rank receives into from world
// rank src, taken (busy), or nil when the receive should stage privately:
// stages are off, src is on another node or not reached through shared
// memory, or src's stage is in use, failed, or would be one too many.
// p.mu is held.
func (p *proc) stageForLocked(src int) *stageIn {
	s := &p.stages
	if !p.stagesTo(src) {
		return nil
	}
	st := s.in[src]
	if st == nil {
		if len(s.in) >= maxStages {
			return nil
		}
		if s.in == nil {
			s.in = map[int]*stageIn{}
		}
		st = p.makeStage()
		s.in[src] = st
	}
	if st.busy || st.dead {
		return nil
	}
	st.busy = true
	return st
}

// makeStage makes a stage file, maps and registers it; a stage that could
// not be made comes back dead, so that it is not tried again.
func (p *proc) makeStage() *stageIn {
	gen := stageGen.Add(1)
	pid := uint32(os.Getpid())
	st := &stageIn{gen: gen, pid: pid, path: stagePath(pid, gen)}
	mem, err := shmem.CreateAt(st.path, stageBytes)
	if err != nil {
		st.dead = true
		return st
	}
	seg, err := p.ep.RegisterSegment(mem)
	if err != nil {
		_ = shmem.Remove(st.path)
		_ = shmem.Unmap(mem)
		st.dead = true
		return st
	}
	st.mem, st.seg, st.linked = mem, seg, true
	return st
}

// ctsFlags are the clear-to-send flags that name the piece at byte off of
// stage st.
func (st *stageIn) ctsFlags(off int) uint64 {
	return proto.StageFlags(off, st.gen, st.pid) // not getpid(2) on every clear-to-send
}

// unstageLocked detaches receive r's staging buffer and segment and returns
// what the caller releases once p.mu is dropped (putChunk,
// UnregisterSegment); a shared stage is not released that way but goes back
// to its sender's slot. keep: an unpacker still reads the buffer, so r keeps
// it (the last unpacker releases it; a private buffer's segment goes now).
// p.mu is held.
func (p *proc) unstageLocked(r *reqState, keep bool) (am.Segment, []byte) {
	seg, bounce := r.seg, r.bounce
	r.seg = am.Segment{}
	st := r.stage
	if st != nil {
		seg = am.Segment{} // the stage's own, registered while it lasts
	}
	if keep {
		return seg, nil
	}
	r.bounce = nil
	if st != nil {
		r.stage = nil
		st.busy = false
		return seg, nil
	}
	return seg, bounce
}

// stageOutFor maps the part [off, off+n) of the shared stage that a
// clear-to-send from world rank dst names, with the writer that chooses
// how to write into that stage, or returns nil when the part cannot be
// reached that way (the file cannot be mapped, or the part lies outside
// it): the caller then stores.
func (p *proc) stageOutFor(dst int, a *ctsArgs) ([]byte, *stageWriter) {
	off, gen, pid, ok := a.Stage()
	if !ok || p.stages.off || a.N > stageBytes || off > stageBytes-int(a.N) {
		return nil, nil
	}
	s := &p.stages
	s.mu.Lock()
	defer s.mu.Unlock()
	so := s.out[dst]
	if so == nil || so.pid != pid || so.gen != gen {
		if so != nil && so.mem != nil {
			_ = shmem.Unmap(so.mem)
		}
		so = &stageOut{pid: pid, gen: gen}
		if mem, err := stageOpen(stagePath(pid, gen), stageBytes); err == nil {
			so.mem = mem
		}
		if s.out == nil {
			s.out = map[int]*stageOut{}
		}
		s.out[dst] = so
	}
	if so.mem == nil {
		return nil, nil
	}
	return so.mem[off : off+int(a.N)], &so.w
}

// dataNotice tells world rank dst that the part clear-to-send a asked for
// is in place (copied into its shared stage): a piece notice when a asked
// for a piece, else the data notice.
func (p *proc) dataNotice(dst int, a *ctsArgs) error {
	if a.Flags&proto.CTSPiece != 0 {
		return p.ep.RequestShort(dst, hDataPiece, a.RecvID, a.Off)
	}
	return p.ep.RequestShort(dst, hData, a.RecvID)
}

// storeLast stores data, the last bytes of the part clear-to-send a asked
// for, at addr in world rank dst with the handler a calls for: the piece
// notice when a asked for a piece, else the data notice.
func (p *proc) storeLast(dst int, addr uint64, data []byte, a *ctsArgs) error {
	if a.Flags&proto.CTSPiece != 0 {
		return p.ep.Store(dst, hDataPiece, addr, data, a.RecvID, a.Off)
	}
	return p.ep.Store(dst, hData, addr, data, a.RecvID)
}

// landedLocked notes that a piece has landed in receive r's shared stage,
// and returns the stage's name to unlink when this is the first: the sender
// has mapped it by now (or stores instead). p.mu is held.
func landedLocked(r *reqState) string {
	if st := r.stage; st != nil && st.linked {
		st.linked = false
		return st.path
	}
	return ""
}

// failStageLocked retires receive r's shared stage when its sender failed:
// the stage is never reused (the sender may have been writing into it).
// p.mu is held.
func failStageLocked(r *reqState) {
	if st := r.stage; st != nil {
		r.stage, r.seg, r.bounce = nil, am.Segment{}, nil
		st.dead = true
	}
}

// closeStages unlinks and unmaps this rank's shared stages, both ways, at
// Finalize: every transfer through them is over.
func (p *proc) closeStages() {
	s := &p.stages
	p.mu.Lock()
	in := s.in
	s.in = nil
	p.mu.Unlock()
	for _, st := range in {
		if st.linked {
			_ = shmem.Remove(st.path)
		}
		if st.mem != nil {
			_ = p.ep.UnregisterSegment(st.seg)
			_ = shmem.Unmap(st.mem)
		}
	}
	s.mu.Lock()
	out := s.out
	s.out = nil
	s.mu.Unlock()
	for _, so := range out {
		if so.mem != nil {
			_ = shmem.Unmap(so.mem)
		}
	}
}
