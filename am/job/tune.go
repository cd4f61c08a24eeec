package job

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am"
)

// What amrun does for its ranks, a rank started by another launcher (MPICH's
// mpiexec, Slurm's srun) does for itself at Open: a timer slack that keeps
// the Go runtime's monitor thread off a busy-polling rank's CPU, and a CPU of
// its own when every rank of its node can have one. And what every rank
// does, whoever launched it: a floor under its heap (tuneHeap).

const (
	// EnvTimerSlack is the timer slack a rank gives itself at Open when its
	// launcher left the kernel's default (a Go duration; default 1ms, as
	// amrun's --timer-slack; 0 leaves the default).
	EnvTimerSlack = "AMGO_TIMER_SLACK"
	// EnvBind, when "none", keeps a rank that its launcher did not bind
	// from binding itself to a CPU at Open.
	EnvBind = "AMGO_BIND"
	// EnvHeapFloor is the size of the heap floor a rank keeps (tuneHeap):
	// bytes, or with a suffix KiB, MiB or GiB; default 32MiB; 0 keeps none.
	EnvHeapFloor = "AMGO_HEAP_FLOOR"
)

// defaultHeapFloor is the heap floor when EnvHeapFloor is unset.
const defaultHeapFloor = 32 << 20

// heapFloor is the floor tuneHeap allocated, kept reachable for the life of
// the process.
var heapFloor []byte

// tuneHeap allocates the heap floor EnvHeapFloor names, once per process: a
// pointer-free object that stays reachable and is never written. Go starts
// a collection when the heap has grown by GOGC percent (100) of what the
// last one left live, and at 4 MiB at least; an MPI rank's live heap is
// small, and a window of nonblocking calls allocates a request handle per
// operation (osu bibw over shm, with the 24-byte handles of the time: some
// 300 MB/s), so the collector ran every 12 ms and kept its write barrier on
// for 40 % of the time. With a floor of
// F bytes it runs once the heap has grown by F at least. The floor itself
// costs no memory (its pages come fresh from the kernel, which maps them
// only when touched, and nothing touches them), but a rank that allocates
// holds up to about F more bytes of garbage between collections; a heap of
// gigabytes is collected about as often as without it. Errors:
// am.ErrConfig for a bad EnvHeapFloor.
func tuneHeap() error {
	n := int64(defaultHeapFloor)
	if v := os.Getenv(EnvHeapFloor); v != "" {
		var err error
		if n, err = parseBytes(v); err != nil {
			return fmt.Errorf("%w: %s=%q: %v", am.ErrConfig, EnvHeapFloor, v, err)
		}
	}
	if n == 0 || heapFloor != nil {
		return nil
	}
	heapFloor = make([]byte, n)
	return nil
}

// parseBytes reads a size in bytes: a non-negative integer, optionally
// followed by KiB, MiB or GiB.
func parseBytes(v string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if num, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = num, u.m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("not a size in bytes (a number, optionally followed by KiB, MiB or GiB)")
	}
	return n * mult, nil
}

// kernelDefaultSlack is the timer slack of a process nobody changed (50 µs).
const kernelDefaultSlack = 50_000

// defaultRankSlack is what a rank sets when EnvTimerSlack is unset.
const defaultRankSlack = time.Millisecond

// tuneSlack gives this process the timer slack EnvTimerSlack names, when its
// launcher left the kernel's default: prctl(PR_SET_TIMERSLACK) for the
// calling thread (and the threads it starts), and /proc/TID/timerslack_ns
// for the threads that exist, as /proc/self/task lists them (the runtime's
// monitor among them; the file is not under /proc/self/task/TID, and
// writing another thread's needs CAP_SYS_NICE, so without it only the new
// threads get the slack). Errors: am.ErrConfig for a bad EnvTimerSlack.
func tuneSlack() error {
	d := defaultRankSlack
	if v := os.Getenv(EnvTimerSlack); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d < 0 {
			return fmt.Errorf("%w: %s=%q is not a duration", am.ErrConfig, EnvTimerSlack, v)
		}
	}
	if d == 0 {
		return nil
	}
	cur, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil || cur != kernelDefaultSlack {
		return nil // the launcher chose one (amrun does), or we cannot tell
	}
	ns := strconv.FormatInt(d.Nanoseconds(), 10)
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(d.Nanoseconds()), 0, 0, 0); err != nil {
		slog.Debug("am: setting the timer slack", "err", err)
	}
	// The slack is per thread, and a thread the runtime starts copies it
	// from the thread that starts it. Pass over the threads until two
	// passes in a row, a moment apart, find none not yet set: every thread
	// alive at those listings has been set, so every later one inherits the
	// slack. (One quiet pass is not enough: a thread cloned from one not yet
	// set can appear in /proc only after the next listing.)
	done := map[string]bool{}
	quiet := 0
	for range 100 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return nil
		}
		fresh := false
		for _, t := range tasks {
			if done[t.Name()] {
				continue
			}
			fresh = true
			done[t.Name()] = true
			if err := os.WriteFile("/proc/"+t.Name()+"/timerslack_ns", []byte(ns), 0); err != nil {
				slog.Debug("am: setting a thread's timer slack", "tid", t.Name(), "err", err)
			}
		}
		if fresh {
			quiet = 0
			continue
		}
		if quiet++; quiet == 2 {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	return nil
}

// tuneBind binds this process to a CPU of its own when nobody did (see
// bindCPU).
func tuneBind(l Layout, rank int) {
	if os.Getenv(EnvBindCPU) != "" || os.Getenv(EnvBind) == "none" {
		return
	}
	cpus, ok := allowedCPUs()
	if !ok {
		return
	}
	if cpu, ok := bindCPU(l, rank, cpus, onlineCPUs()); ok {
		bindTo(cpu)
	}
}

// allowedCPUs lists the CPUs this process may run on, ascending (false when
// the kernel would not say).
func allowedCPUs() ([]int, bool) {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return nil, false
	}
	var cpus []int
	for cpu := 0; cpu < len(allowed)*64; cpu++ {
		if allowed.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	return cpus, true
}

// oversubscribed reports whether rank's node has more ranks than rank may
// use processors (after any binding): its waits should then give their
// processor away (am.Config.Yield).
func oversubscribed(l Layout, rank int) bool {
	if l.Node == nil || rank < 0 || rank >= len(l.Node) {
		return false
	}
	cpus, ok := allowedCPUs()
	return ok && moreRanksThanCPUs(len(l.Ranks(l.Node[rank])), len(cpus), onlineCPUs())
}

// moreRanksThanCPUs reports whether a node's n ranks have fewer processors
// than ranks, for a rank that may run on cpus of the online ones (0:
// unknown). A rank bound to one CPU counts the node's processors instead:
// amrun binds each rank to a CPU of its own when there are enough, so a
// rank alone on its CPU is oversubscribed only if the node has more ranks
// than CPUs (a launcher that binds several ranks to each core).
func moreRanksThanCPUs(n, cpus, online int) bool {
	if cpus == 1 {
		return online > 0 && n > online
	}
	return n > cpus
}

// bindCPU is the CPU that rank binds itself to, given the CPUs it may run
// on (allowed, ascending) and the number of online CPUs: none (ok false)
// when the launcher bound it (it may not run on every online CPU), when the
// layout is unknown, or when this node has more ranks than allowed CPUs
// (binding would only pin ranks together, as amrun's --bind-to default
// knows); else the local rank's (its index among this node's ranks) CPU.
func bindCPU(l Layout, rank int, allowed []int, online int) (int, bool) {
	if l.Node == nil || rank < 0 || rank >= len(l.Node) || online == 0 || len(allowed) != online {
		return 0, false
	}
	mine := l.Ranks(l.Node[rank])
	if len(mine) > len(allowed) {
		return 0, false
	}
	for i, r := range mine {
		if r == rank {
			return allowed[i], true
		}
	}
	return 0, false
}

// onlineCPUs counts the CPUs in /sys/devices/system/cpu/online ("0-3,6"),
// 0 when unknown.
func onlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return 0
	}
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, ok := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0
		}
		z := a
		if ok {
			if z, err = strconv.Atoi(hi); err != nil {
				return 0
			}
		}
		n += z - a + 1
	}
	return n
}
