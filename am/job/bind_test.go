package job

import (
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/amgo-hpc/amgo/am"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// bindFromEnv binds every thread of the process to AMGO_BIND_CPU and runs Go
// code on one P; bad values are configuration errors.
func TestBindFromEnv(t *testing.T) {
	var orig unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &orig))
	procs := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		tasks, _ := os.ReadDir("/proc/self/task")
		for _, task := range tasks {
			if tid, err := strconv.Atoi(task.Name()); err == nil {
				_ = unix.SchedSetaffinity(tid, &orig)
			}
		}
		runtime.GOMAXPROCS(procs)
	})
	cpu := -1
	for c := 0; c < 1024; c++ {
		if orig.IsSet(c) {
			cpu = c
		}
	}
	require.GreaterOrEqual(t, cpu, 0)

	t.Setenv(EnvBindCPU, strconv.Itoa(cpu))
	t.Setenv("GOMAXPROCS", "")
	require.NoError(t, bindFromEnv())
	require.Equal(t, 1, runtime.GOMAXPROCS(0))
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		require.NoError(t, err)
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &set); err != nil {
			continue // the thread exited
		}
		require.Equal(t, 1, set.Count(), "thread %d", tid)
		require.True(t, set.IsSet(cpu), "thread %d", tid)
	}

	for _, bad := range []string{"x", "-1", "5000"} {
		t.Setenv(EnvBindCPU, bad)
		require.ErrorIs(t, bindFromEnv(), am.ErrConfig, bad)
	}
	if !orig.IsSet(1023) {
		t.Setenv(EnvBindCPU, "1023")
		require.ErrorIs(t, bindFromEnv(), am.ErrConfig, "a CPU this process may not use")
	}
	t.Setenv(EnvBindCPU, "")
	require.NoError(t, bindFromEnv(), "unset: nothing to do")
}
