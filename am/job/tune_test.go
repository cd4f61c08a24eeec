package job

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am"
)

func TestBindCPU(t *testing.T) {
	l := Layout{Node: []int{0, 1, 0, 1, 0}}
	for _, c := range []struct {
		rank    int
		allowed []int
		online  int
		cpu     int
		ok      bool
	}{
		{0, []int{0, 1, 2, 3}, 4, 0, true},
		{2, []int{0, 1, 2, 3}, 4, 1, true},  // second rank of node 0
		{4, []int{0, 1, 2, 3}, 4, 2, true},  // third
		{3, []int{0, 1, 2, 3}, 4, 1, true},  // second of node 1
		{4, []int{0, 1}, 2, 0, false},       // 3 ranks on 2 CPUs: oversubscribed
		{0, []int{1}, 4, 0, false},          // bound by the launcher already
		{0, []int{0, 1, 2, 3}, 0, 0, false}, // online CPUs unknown
		{9, []int{0, 1, 2, 3}, 4, 0, false}, // no such rank
	} {
		cpu, ok := bindCPU(l, c.rank, c.allowed, c.online)
		require.Equal(t, c.ok, ok, "%+v", c)
		if ok {
			require.Equal(t, c.cpu, cpu, "%+v", c)
		}
	}
	_, ok := bindCPU(Layout{}, 0, []int{0}, 1)
	require.False(t, ok, "no layout")
	require.Positive(t, onlineCPUs())
}

// A rank yields while it waits when its node has more ranks than it may use
// processors, counting the node's processors when it is bound to one CPU.
func TestOversubscribed(t *testing.T) {
	for _, c := range []struct {
		n, cpus, online int
		want            bool
	}{
		{4, 2, 2, true},  // amrun -n 4 on 2 CPUs: left unbound
		{2, 2, 2, false}, // as many ranks as CPUs
		{2, 1, 2, false}, // bound by amrun, a CPU each
		{3, 1, 2, true},  // a launcher bound 3 ranks to 2 cores
		{1, 1, 0, false}, // online CPUs unknown
		{8, 1, 0, false}, // the same
		{3, 4, 8, false}, // a cpuset of 4 for 3 ranks
		{5, 4, 8, true},  // and for 5
	} {
		require.Equal(t, c.want, moreRanksThanCPUs(c.n, c.cpus, c.online), "%+v", c)
	}
	require.False(t, oversubscribed(Layout{}, 0), "no layout")
	require.False(t, oversubscribed(Layout{Node: []int{0}}, 3), "no such rank")
	require.False(t, oversubscribed(Layout{Node: []int{0}}, 0), "one rank")
}

// AMGO_YIELD=1 sets am.Config.Yield and AMGO_IMMEDIATE=0 its NoImmediate;
// anything but 0 or 1 is an error.
func TestFlagsFromEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		want map[string]bool
		get  func(am.Config) bool
	}{
		{EnvYield, map[string]bool{"": false, "0": false, "1": true}, func(c am.Config) bool { return c.Yield }},
		{EnvImmediate, map[string]bool{"": false, "1": false, "0": true}, func(c am.Config) bool { return c.NoImmediate }},
	} {
		for v, want := range c.want {
			t.Setenv(c.name, v)
			var cfg am.Config
			require.NoError(t, configFromEnv(&cfg))
			require.Equal(t, want, c.get(cfg), "%s=%q", c.name, v)
		}
		t.Setenv(c.name, "yes")
		require.ErrorIs(t, configFromEnv(&am.Config{}), am.ErrConfig)
		t.Setenv(c.name, "")
	}
}

// A rank whose launcher left the kernel's timer slack sets its own: on the
// calling thread, and (as root) on the threads that exist.
func TestTuneSlack(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(prev), 0, 0, 0)

	require.NoError(t, unix.Prctl(unix.PR_SET_TIMERSLACK, kernelDefaultSlack, 0, 0, 0))
	t.Setenv(EnvTimerSlack, "")
	require.NoError(t, tuneSlack())
	got, _ := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.Equal(t, int(defaultRankSlack.Nanoseconds()), got)
	// Every other thread too, where this process may read them (root):
	// the goroutine that polls may run on any of them.
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	for _, task := range tasks {
		if b, err := os.ReadFile("/proc/" + task.Name() + "/timerslack_ns"); err == nil {
			require.Equal(t, fmt.Sprint(defaultRankSlack.Nanoseconds()), strings.TrimSpace(string(b)), "thread %s", task.Name())
		}
	}

	// Set by the launcher: left alone.
	require.NoError(t, unix.Prctl(unix.PR_SET_TIMERSLACK, 200_000, 0, 0, 0))
	require.NoError(t, tuneSlack())
	got, _ = unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.Equal(t, 200_000, got)

	// 0 leaves the default; garbage is an error.
	require.NoError(t, unix.Prctl(unix.PR_SET_TIMERSLACK, kernelDefaultSlack, 0, 0, 0))
	t.Setenv(EnvTimerSlack, "0")
	require.NoError(t, tuneSlack())
	got, _ = unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.Equal(t, kernelDefaultSlack, got)
	t.Setenv(EnvTimerSlack, "soon")
	require.Error(t, tuneSlack())
}

// The heap floor: sizes parse with or without a unit, 0 keeps none, garbage
// is an am.ErrConfig; the floor, once allocated, stays and is not made twice.
func TestTuneHeap(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "32MiB": 32 << 20, "1 GiB": 1 << 30, "7KiB": 7 << 10} {
		got, err := parseBytes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "-1", "lots", "3MB", "2000000GiB"} {
		_, err := parseBytes(in)
		require.Error(t, err, in)
	}
	defer func(f []byte) { heapFloor = f }(heapFloor)
	heapFloor = nil
	t.Setenv(EnvHeapFloor, "big")
	require.ErrorIs(t, tuneHeap(), am.ErrConfig)
	t.Setenv(EnvHeapFloor, "0")
	require.NoError(t, tuneHeap())
	require.Nil(t, heapFloor)
	t.Setenv(EnvHeapFloor, "1MiB")
	require.NoError(t, tuneHeap())
	require.Len(t, heapFloor, 1<<20)
	t.Setenv(EnvHeapFloor, "")
	require.NoError(t, tuneHeap())
	require.Len(t, heapFloor, 1<<20, "made once per process")
}

// Ranks started by MPICH's mpiexec, which neither binds them nor sets
// their timer slack, do both themselves: each gets the slack amrun gives
// and, when each can have one, a CPU of its own.
func TestRanksTuneThemselvesUnderHydra(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and launches programs")
	}
	hydra, err := exec.LookPath("mpiexec.hydra")
	if err != nil {
		t.Skip("MPICH's mpiexec.hydra is not installed")
	}
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/", "./internal/tunecheck").CombinedOutput()
	require.NoError(t, err, "%s", out)
	n := min(runtime.NumCPU(), 4)
	cmd := exec.Command(hydra, "-n", fmt.Sprint(n), filepath.Join(dir, "tunecheck"))
	cmd.Env = append(os.Environ(), "AMGO_TRANSPORT=", "AMGO_BIND_CPU=", "AMGO_BIND=", "AMGO_TIMER_SLACK=")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	seen := map[string]bool{}
	for r := range n {
		var line string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, fmt.Sprintf("tunecheck: rank %d ", r)) {
				line = l
			}
		}
		require.NotEmpty(t, line, "%s", out)
		require.Contains(t, line, fmt.Sprintf("slack %d ", defaultRankSlack.Nanoseconds()), "%s", out)
		cpus := line[strings.Index(line, "cpus ")+len("cpus "):]
		require.NotContains(t, cpus, " ", "one CPU each: %s", line)
		require.False(t, seen[cpus], "CPUs of their own: %s", out)
		seen[cpus] = true
	}
}
