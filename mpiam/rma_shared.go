package mpiam

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/amgo-hpc/amgo/internal/shmem"
)

// Shared-memory windows (MPI-4.1 §12.2.3): the ranks of one node allocate
// their windows together in one mapping of a file under /dev/shm, rank
// after rank with no gap (MPI's default, contiguous), and each may load and
// store the others' parts directly, as Go slices. Rank 0 of the
// communicator creates and sizes the file and broadcasts its name, the
// others map it, and rank 0 removes the name once all have: nothing is left
// behind when the job ends, even killed. The window also works as any other
// (Put, Get, synchronization), over the same memory.

// sharedWin is the node-wide mapping of a shared window.
type sharedWin struct {
	mem     []byte // the whole mapping
	offs    []int  // per rank: its part's offset in mem
	sizes   []int  // per rank: its part's size, bytes
	lockOff int    // offset of the lock words: rank r's at lockOff+64r
}

// WinAllocateShared allocates n elements of T on this rank as its part of
// memory shared by every rank of c, and exposes it as a window
// (MPI_Win_allocate_shared, MPI-4.1 §12.2.3). Collective over c, whose ranks
// must all run on one node (a communicator from SplitType(CommTypeShared));
// rank r's part follows rank r-1's. WinSharedQuery gives the other ranks'
// parts. The memory lives outside Go's heap until Free. Errors: ErrComm,
// ErrDisp, ErrSize, ErrType, ErrRMAShared (ranks on different nodes),
// ErrNoMem (the mapping failed on some rank).
func WinAllocateShared[T any](c *Comm, n, dispUnit int) (*Win, []T, error) {
	if err := plain[T](); err != nil {
		return nil, nil, err
	}
	if err := c.valid(); err != nil {
		return nil, nil, err
	}
	if n < 0 {
		return nil, nil, fmt.Errorf("%w: %d elements", ErrSize, n)
	}
	if dispUnit < 1 {
		return nil, nil, fmt.Errorf("%w: displacement unit %d (want at least 1)", ErrDisp, dispUnit)
	}
	ep := c.p.ep
	for r := range c.size {
		if ep.Node(c.world(r)) != ep.Node(c.world(0)) {
			return nil, nil, fmt.Errorf("%w: rank %d runs on another node than rank 0 (use SplitType(CommTypeShared))", ErrRMAShared, r)
		}
	}
	var z T
	sh, mine, err := allocNode(c, n*int(unsafe.Sizeof(z)))
	if err != nil {
		return nil, nil, err
	}
	local, lw := make([][]byte, c.size), make([]*uint32, c.size)
	for r := range c.size {
		local[r], lw[r] = sh.part(r), sh.lockWord(r)
	}
	w, err := c.winCreate(winMem{mem: mine, sh: sh, local: local, lw: lw, shared: true}, dispUnit)
	if err != nil {
		sh.unmap()
		return nil, nil, err
	}
	return w, fromRaw[T](mine), nil
}

// allocNode maps the parts of n bytes (each rank its own n) of c's ranks,
// all on one node, in one mapping, rank after rank, and returns it with this
// rank's part. Collective over c. Errors: ErrNoMem, the collectives'.
func allocNode(c *Comm, n int) (*sharedWin, []byte, error) {
	all := make([]uint64, c.size)
	if err := Allgather(c, []uint64{uint64(n)}, all); err != nil {
		return nil, nil, err
	}
	sh := &sharedWin{offs: make([]int, c.size), sizes: make([]int, c.size)}
	total := 0
	for r, s := range all {
		sh.offs[r], sh.sizes[r] = total, int(s)
		total += int(s)
	}
	// After the parts, a cache line per rank for its part's accumulate
	// lock word (atomically).
	sh.lockOff = (total + 63) &^ 63
	if err := sh.mapAll(c, sh.lockOff+64*c.size); err != nil {
		return nil, nil, err
	}
	return sh, sh.part(c.rank), nil
}

// lockWord is the first of node rank r's lock words (lockWords): the word
// that orders the accumulates into its part.
func (sh *sharedWin) lockWord(r int) *uint32 {
	return (*uint32)(unsafe.Pointer(&sh.mem[sh.lockOff+64*r]))
}

// lockWords is the layout of a part's lock words, a cache line: [0] orders
// the accumulates into the part (spinLock), [1] is its passive-target lock
// (lockStateOf). A rank's own memory outside a node mapping gets one in Go
// memory.
type lockWords [16]uint32

// The bits of a passive-target lock-state word: the exclusive holder, the
// target's queue of lock requests being non-empty, and the number of shared
// holders.
const (
	lockExcl       = 1 << 31
	lockQueued     = 1 << 30
	lockSharedMask = lockQueued - 1
)

// lockState is window rank r's passive-target lock-state word when this rank
// can reach it (r's memory is local), else nil: then r's handler keeps the
// lock alone.
func (w *Win) lockState(r int) *uint32 {
	if w.lw == nil || w.lw[r] == nil {
		return nil
	}
	return (*uint32)(unsafe.Add(unsafe.Pointer(w.lw[r]), 4))
}

// tryLockState takes a lock of kind t in the lock-state word ls if it can
// be held now. A direct attempt (a rank taking a lock without a message)
// also fails while the target has requests queued: they go first.
func tryLockState(ls *uint32, t LockType, direct bool) bool {
	for {
		v := atomic.LoadUint32(ls)
		if direct && v&lockQueued != 0 {
			return false
		}
		next := v + 1
		if t == LockExclusive {
			if v&^lockQueued != 0 {
				return false
			}
			next = v | lockExcl
		} else if v&lockExcl != 0 || v&lockSharedMask == lockSharedMask {
			return false
		}
		if atomic.CompareAndSwapUint32(ls, v, next) {
			return true
		}
	}
}

// unlockState releases one lock held in ls. A direct release (without a
// message) fails, changing nothing, while the target has requests queued:
// the release must then reach the target, which grants them.
func unlockState(ls *uint32, direct bool) bool {
	for {
		v := atomic.LoadUint32(ls)
		if direct && v&lockQueued != 0 {
			return false
		}
		var next uint32
		switch {
		case v&lockExcl != 0:
			next = v &^ lockExcl
		case v&lockSharedMask != 0:
			next = v - 1
		default:
			return true // nothing held
		}
		if atomic.CompareAndSwapUint32(ls, v, next) {
			return true
		}
	}
}

// spinLock takes the lock word l, spinning (and yielding now and then: the
// holder may be a goroutine of this process waiting for a processor).
// Holders keep it for one element-wise operation on window memory, never
// across a call that waits.
func spinLock(l *uint32) {
	for i := 1; !atomic.CompareAndSwapUint32(l, 0, 1); i++ {
		if i%64 == 0 {
			runtime.Gosched()
		}
	}
}

// spinUnlock releases l.
func spinUnlock(l *uint32) { atomic.StoreUint32(l, 0) }

// lockPart takes the lock of window rank r's accumulates when r's memory is
// in this rank's node mapping: the ranks of a node that apply accumulates
// to r directly, and r's handlers that apply the others', exclude each
// other with it, so that accumulates stay atomic element by element
// (MPI-4.1 §12.7). Without a mapping, handlers alone apply them, one at a
// time, and nothing is taken.
func (w *Win) lockPart(r int) {
	if w.lw != nil && w.lw[r] != nil {
		spinLock(w.lw[r])
	}
}

// unlockPart releases what lockPart took.
func (w *Win) unlockPart(r int) {
	if w.lw != nil && w.lw[r] != nil {
		spinUnlock(w.lw[r])
	}
}

// part is rank r's part of the mapping (nil when empty).
func (sh *sharedWin) part(r int) []byte {
	if sh.sizes[r] == 0 {
		return nil
	}
	return sh.mem[sh.offs[r] : sh.offs[r]+sh.sizes[r] : sh.offs[r]+sh.sizes[r]]
}

// EnvRMAShm turns off (0) the shared mapping WinAllocate makes for the ranks
// of a node, whose Put and Get between them are then copies through it;
// with 0 they go through the network as for WinCreate's windows.
const EnvRMAShm = "AMGO_RMA_SHM"

// allocLocal is WinAllocate's memory: on a node with /dev/shm, this rank's
// part of a mapping shared by the window's ranks of its node (local[r]: the
// part of window rank r when it is on this node, else nil); elsewhere, or
// with AMGO_RMA_SHM=0 or a failed mapping, Go memory and no local parts.
// Collective over c.
func allocLocal(c *Comm, n int) (mem []byte, sh *sharedWin, local [][]byte, lw []*uint32, err error) {
	if os.Getenv(EnvRMAShm) == "0" || c.size == 1 {
		return make([]byte, n), nil, nil, nil, nil
	}
	node, err := c.SplitType(CommTypeShared, c.rank)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	defer node.Free()
	if node.size == 1 {
		return make([]byte, n), nil, nil, nil, nil
	}
	sh, mine, err := allocNode(node, n)
	if errors.Is(err, ErrNoMem) {
		return make([]byte, n), nil, nil, nil, nil // every rank of the node falls back alike
	}
	if err != nil {
		return nil, nil, nil, nil, err
	}
	local, lw = make([][]byte, c.size), make([]*uint32, c.size)
	for r := range c.size {
		if nr := commRankOf(node, c.world(r)); nr >= 0 {
			local[r], lw[r] = sh.part(nr), sh.lockWord(nr)
		}
	}
	if mine == nil {
		mine = []byte{}
	}
	return mine, sh, local, lw, nil
}

// mapAll maps total bytes on every rank of c: rank 0 creates the file and
// broadcasts its name, the others open it; every rank learns whether all
// succeeded. Errors: ErrNoMem, the collectives'.
func (sh *sharedWin) mapAll(c *Comm, total int) error {
	if total == 0 {
		return nil
	}
	var name [256]byte
	var err error
	if c.rank == 0 {
		var path string
		path, sh.mem, err = shmem.Create("amgo-win-", total)
		if err == nil {
			// Gone once this returns, whichever way: every rank has mapped
			// it or given up, or the collectives below failed (a rank died).
			defer shmem.Remove(path)
			if len(path) >= len(name) {
				err = fmt.Errorf("shared window file name %q too long", path)
			}
		}
		copy(name[:], path)
	}
	// The library's own collectives, unseen by tools.
	x, berr := c.startColl(CallBcast, false)
	if berr == nil {
		berr = x.bcast(name[:], 0)
	}
	if berr != nil {
		sh.unmap()
		return berr
	}
	path := string(name[:clen(name[:])])
	if c.rank != 0 && path != "" {
		sh.mem, err = shmem.Open(path, total)
	}
	ok := []int32{1}
	if err != nil || path == "" {
		ok[0] = 0
	}
	all := []int32{0}
	x, aerr := c.startColl(CallAllreduce, false)
	if aerr == nil {
		aerr = allreduce(x, ok, all, Min[int32]())
	}
	if aerr != nil {
		sh.unmap()
		return aerr
	}
	if all[0] == 0 {
		sh.unmap()
		if err == nil {
			err = fmt.Errorf("another rank could not map it")
		}
		return fmt.Errorf("%w: shared window of %d bytes: %w", ErrNoMem, total, err)
	}
	return nil
}

// clen is the length of the NUL-terminated string in b.
func clen(b []byte) int {
	for i, x := range b {
		if x == 0 {
			return i
		}
	}
	return len(b)
}

// unmap releases the mapping.
func (sh *sharedWin) unmap() {
	if sh.mem != nil {
		_ = shmem.Unmap(sh.mem)
		sh.mem = nil
	}
}

// WinSharedQuery returns rank r's part of shared window w as elements of T,
// and r's displacement unit (MPI_Win_shared_query, MPI-4.1 §12.2.3): loads
// and stores on it reach r's window directly. r = ProcNull gives the first
// non-empty part. The slice is valid until w is freed. Errors: ErrWin (not a
// shared window, or freed), ErrRank.
func WinSharedQuery[T any](w *Win, r int) ([]T, int, error) {
	if err := plain[T](); err != nil {
		return nil, 0, err
	}
	if err := w.valid(); err != nil {
		return nil, 0, err
	}
	sh := w.shm
	if sh == nil || !w.sharedFlavor {
		return nil, 0, fmt.Errorf("%w: window %d is not a shared-memory window (WinAllocateShared)", ErrWin, w.id)
	}
	if r == ProcNull {
		r = 0
		for r < w.c.size-1 && sh.sizes[r] == 0 {
			r++
		}
	}
	if r < 0 || r >= w.c.size {
		return nil, 0, fmt.Errorf("%w: %d (window has %d ranks)", ErrRank, r, w.c.size)
	}
	return fromRaw[T](w.local[r]), w.units[r], nil
}
