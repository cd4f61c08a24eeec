package launch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/internal/pmi"
)

const helperEnv = "AMGO_LAUNCH_TEST_HELPER"

// TestMain turns the test binary into a rank program when helperEnv is set.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ProxyFlag { // a host's proxy (hosts_test.go)
		os.Exit(RunProxy(os.Args[2:], os.Stdin, os.Stderr))
	}
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode))
	}
	os.Exit(m.Run())
}

func helper(mode string) int {
	switch mode {
	case "kvs", "mpi":
		c, err := pmi.FromEnv()
		if err != nil {
			fmt.Fprintln(os.Stderr, "FromEnv:", err)
			return 10
		}
		r, n := c.Rank(), c.Size()
		if mode == "kvs" {
			dir := os.Getenv("AMGO_JOB_DIR")
			st, err := os.Stat(dir)
			if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
				fmt.Fprintln(os.Stderr, "bad AMGO_JOB_DIR", dir, err)
				return 11
			}
			// Leave stale content behind, as a crashed rank would.
			_ = os.MkdirAll(fmt.Sprintf("%s/rank%d/sub", dir, r), 0o700)
			_ = os.WriteFile(fmt.Sprintf("%s/rank%d/sub/f", dir, r), []byte("x"), 0o600)
		}
		if err := c.Put(fmt.Sprintf("addr-%d", r), fmt.Sprintf("val-%d-of-%d", r, n)); err != nil {
			fmt.Fprintln(os.Stderr, "Put:", err)
			return 12
		}
		if err := c.Fence(); err != nil {
			fmt.Fprintln(os.Stderr, "Fence:", err)
			return 13
		}
		for p := 0; p < n; p++ {
			v, err := c.Get(fmt.Sprintf("addr-%d", p))
			if err != nil || v != fmt.Sprintf("val-%d-of-%d", p, n) {
				fmt.Fprintln(os.Stderr, "Get:", p, v, err)
				return 14
			}
		}
		if err := c.Finalize(); err != nil {
			fmt.Fprintln(os.Stderr, "Finalize:", err)
			return 15
		}
		var env []string
		for _, k := range []string{"PMI_FD", "PMI_PORT", "PMI_ID", "PMI_RANK", "PMI_SIZE"} {
			if v, ok := os.LookupEnv(k); ok {
				env = append(env, k+"="+v)
			}
		}
		v, sv := c.Version()
		fmt.Printf("OK rank %d of %d job %s pmi %d.%d env %s\n", r, n, c.JobID(), v, sv, strings.Join(env, ","))
		return 0
	case "fail":
		if os.Getenv("PMI_RANK") == os.Getenv("FAIL_RANK") {
			time.Sleep(100 * time.Millisecond)
			return 3
		}
		fmt.Println("sleeping", os.Getpid())
		time.Sleep(time.Minute)
		return 0
	case "hang":
		signal.Ignore(syscall.SIGTERM) // forces the SIGKILL escalation
		time.Sleep(time.Minute)
		return 0
	case "abort":
		c, err := pmi.FromEnv()
		if err != nil {
			return 10
		}
		if c.Rank() == 1 {
			_ = c.Abort(5, "bad input file")
		}
		time.Sleep(time.Minute)
		return 0
	case "nofinalize": // rank 1 ends after Init without Finalize
		c, err := pmi.FromEnv()
		if err != nil {
			return 10
		}
		if c.Rank() == 1 {
			return 0
		}
		time.Sleep(200 * time.Millisecond)
		_ = c.Finalize()
		return 0
	case "killed": // rank 1 dies by SIGKILL; rank 0 aborts the moment it sees
		c, err := pmi.FromEnv()
		if err != nil {
			return 10
		}
		if err := c.Put(fmt.Sprintf("pid-%d", c.Rank()), strconv.Itoa(os.Getpid())); err != nil {
			return 11
		}
		if err := c.Fence(); err != nil {
			return 12
		}
		switch c.Rank() {
		case 1:
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		case 0:
			v, err := c.Get("pid-1")
			if err != nil {
				return 13
			}
			for { // as a peer whose connection broke: abort at once
				b, err := os.ReadFile("/proc/" + v + "/stat")
				if err != nil || strings.Contains(string(b), ") Z ") {
					break
				}
			}
			_ = c.Abort(1, "rank 1 failed")
		}
		time.Sleep(time.Minute)
		return 0
	case "print":
		r := os.Getenv("PMI_RANK")
		for i := 0; i < 50; i++ {
			fmt.Printf("out %s line %d %s\n", r, i, strings.Repeat("x", 100))
			fmt.Fprintf(os.Stderr, "err %s line %d\n", r, i)
		}
		fmt.Print("no newline at end")
		return 0
	case "secret":
		fmt.Printf("%s %s %s\n", os.Getenv("PMI_RANK"), os.Getenv("AMGO_JOB_SECRET"), os.Getenv("AMGO_IFACE"))
		return 0
	case "where":
		c, err := pmi.FromEnv()
		if err != nil {
			fmt.Fprintln(os.Stderr, "FromEnv:", err)
			return 10
		}
		dir := os.Getenv("AMGO_JOB_DIR")
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			fmt.Fprintln(os.Stderr, "bad AMGO_JOB_DIR", dir, err)
			return 11
		}
		wd, _ := os.Getwd()
		fmt.Printf("rank %d of %d host %s secret %t wd %s jobdir %s\n", c.Rank(), c.Size(), os.Getenv("FAKE_HOST"),
			len(os.Getenv("AMGO_JOB_SECRET")) == 32, wd, dir)
		if err := c.Finalize(); err != nil {
			return 15
		}
		return 0
	case "slack":
		b, err := os.ReadFile("/proc/self/timerslack_ns")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 10
		}
		fmt.Print(string(b))
		return 0
	case "env":
		for _, k := range []string{"PMI_RANK", "PMI_SIZE", "AMGO_TRANSPORT", "AMGO_LOOP_SIZE"} {
			fmt.Printf("%s=%s\n", k, os.Getenv(k))
		}
		return 0
	}
	return 99
}

func spec(t *testing.T, mode string, n int) (Spec, *bytes.Buffer, *bytes.Buffer) {
	exe, err := os.Executable()
	require.NoError(t, err)
	var out, errb bytes.Buffer
	return Spec{
		N: n, Prog: exe, Stdout: &out, Stderr: &errb,
		// GORACE: a -race helper would otherwise sleep 1 s at exit.
		Env:          append(os.Environ(), helperEnv+"="+mode, "FAIL_RANK=1", "GORACE=atexit_sleep_ms=0"),
		JobDirParent: t.TempDir(),
		Grace:        300 * time.Millisecond,
		Timeout:      20 * time.Second,
	}, &out, &errb
}

// recordStart captures the job directory and pids.
func recordStart(s *Spec) (dir *string, pids *[]int) {
	dir, pids = new(string), new([]int)
	s.OnStart = func(d string, p []int) { *dir, *pids = d, p }
	return
}

func requireGone(t *testing.T, dir string, pids []int) {
	t.Helper()
	_, err := os.Stat(dir)
	require.True(t, os.IsNotExist(err), "job dir %s still exists", dir)
	for _, pid := range pids {
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "pid %d still alive", pid)
	}
}

func TestKVSJob(t *testing.T) {
	s, out, errb := spec(t, "kvs", 4)
	dir, pids := recordStart(&s)
	err := Run(context.Background(), s)
	require.NoError(t, err, errb.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	sort.Strings(lines)
	require.Len(t, lines, 4)
	job := strings.ReplaceAll(lastElem(*dir), "-", "_")
	for r, l := range lines {
		require.Equal(t, fmt.Sprintf("OK rank %d of 4 job %s pmi 1.2 env PMI_FD=3,PMI_RANK=%d,PMI_SIZE=4", r, job, r), l)
	}
	require.Regexp(t, `^amgo-\d+-[0-9a-f]{12}$`, lastElem(*dir))
	requireGone(t, *dir, *pids)
}

func TestRankFailureKillsOthers(t *testing.T) {
	s, _, _ := spec(t, "fail", 3)
	dir, pids := recordStart(&s)
	start := time.Now()
	err := Run(context.Background(), s)
	require.ErrorIs(t, err, ErrRankFailed)
	require.Equal(t, "rank 1 exited with status 3", err.Error())
	require.Equal(t, 3, ExitCode(err))
	require.Less(t, time.Since(start), 10*time.Second)
	requireGone(t, *dir, *pids)
}

func TestTimeoutKillsHungRanks(t *testing.T) {
	s, _, _ := spec(t, "hang", 2)
	s.Timeout = 300 * time.Millisecond
	dir, pids := recordStart(&s)
	start := time.Now()
	err := Run(context.Background(), s)
	require.ErrorIs(t, err, ErrTimeout)
	require.Contains(t, err.Error(), "timed out after 300ms")
	require.Equal(t, 124, ExitCode(err))
	require.Less(t, time.Since(start), 10*time.Second)
	requireGone(t, *dir, *pids)
}

func TestAbort(t *testing.T) {
	s, _, _ := spec(t, "abort", 3)
	dir, pids := recordStart(&s)
	err := Run(context.Background(), s)
	require.ErrorIs(t, err, ErrAborted)
	require.Equal(t, "rank 1 called PMI abort with exit code 5: bad input file", err.Error())
	require.Equal(t, 5, ExitCode(err))
	requireGone(t, *dir, *pids)
}

// A rank that ends after Init without Finalize fails the job, as under Hydra.
func TestExitWithoutFinalize(t *testing.T) {
	s, _, _ := spec(t, "nofinalize", 3)
	err := Run(context.Background(), s)
	require.ErrorIs(t, err, ErrRankFailed)
	require.Equal(t, "rank 1 exited with status 0 without calling Finalize (after Init)", err.Error())
	require.Equal(t, 1, ExitCode(err))
}

// The rank that died first is named, not the peer that aborted on seeing it
// die (whose abort can reach the launcher before the death does).
func TestFirstDeathIsNamedBeforeAPeersAbort(t *testing.T) {
	for i := 0; i < 5; i++ {
		s, _, _ := spec(t, "killed", 3)
		err := Run(context.Background(), s)
		require.ErrorIs(t, err, ErrRankFailed, "run %d", i)
		require.Equal(t, "rank 1 was killed by signal 9 (killed)", err.Error(), "run %d", i)
		require.Equal(t, 137, ExitCode(err))
	}
}

func TestForwardedSignal(t *testing.T) {
	s, _, _ := spec(t, "fail", 2)
	s.Env = append(s.Env, "FAIL_RANK=none")
	sigs := make(chan os.Signal, 1)
	s.Signals = sigs
	dir, pids := recordStart(&s)
	s.OnStart = func(d string, p []int) { *dir, *pids = d, p; sigs <- syscall.SIGINT }
	err := Run(context.Background(), s)
	require.ErrorIs(t, err, ErrInterrupted)
	require.Equal(t, 130, ExitCode(err))
	requireGone(t, *dir, *pids)
}

func TestContextCancel(t *testing.T) {
	s, _, _ := spec(t, "hang", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := Run(ctx, s)
	require.ErrorIs(t, err, ErrInterrupted)
}

func TestTagOutput(t *testing.T) {
	s, out, errb := spec(t, "print", 3)
	s.TagOutput = true
	require.NoError(t, Run(context.Background(), s))
	outRe := regexp.MustCompile(`^\[(\d)\] (out (\d) line \d+ x{100}|no newline at end)$`)
	counts := map[string]int{}
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		m := outRe.FindStringSubmatch(l)
		require.NotNil(t, m, "bad line %q", l)
		if m[3] != "" {
			require.Equal(t, m[1], m[3], l)
		}
		counts[m[1]]++
	}
	require.Equal(t, map[string]int{"0": 51, "1": 51, "2": 51}, counts)
	errRe := regexp.MustCompile(`^\[(\d)\] err (\d) line \d+$`)
	for _, l := range strings.Split(strings.TrimSuffix(errb.String(), "\n"), "\n") {
		m := errRe.FindStringSubmatch(l)
		require.NotNil(t, m, "bad line %q", l)
		require.Equal(t, m[1], m[2])
	}
}

func TestUntaggedOutput(t *testing.T) {
	s, out, _ := spec(t, "print", 2)
	require.NoError(t, Run(context.Background(), s))
	require.Equal(t, 1, strings.Count(out.String(), "out 1 line 49 "))
	require.Equal(t, 1, strings.Count(out.String(), "out 0 line 49 "))
	require.NotContains(t, out.String(), "[0]")
}

func TestLoopTransport(t *testing.T) {
	s, out, _ := spec(t, "env", 4)
	s.Transport = "loop"
	s.TagOutput = true
	require.NoError(t, Run(context.Background(), s))
	require.Equal(t, "[0] PMI_RANK=0\n[0] PMI_SIZE=1\n[0] AMGO_TRANSPORT=loop\n[0] AMGO_LOOP_SIZE=4\n", out.String())

	s, out, _ = spec(t, "env", 2)
	require.NoError(t, Run(context.Background(), s))
	require.Contains(t, out.String(), "AMGO_TRANSPORT=\n", "no network forced: each rank chooses per peer")
	require.Contains(t, out.String(), "AMGO_LOOP_SIZE=\n")
}

// Every rank of a job gets the same fresh AMGO_JOB_SECRET (16 bytes, hex),
// replacing one in the base environment, and Iface becomes AMGO_IFACE.
func TestJobSecretAndIface(t *testing.T) {
	secrets := map[string]bool{}
	for job := 0; job < 2; job++ {
		s, out, errb := spec(t, "secret", 3)
		s.Env = append(s.Env, "AMGO_JOB_SECRET=stale")
		s.Iface = "lo"
		require.NoError(t, Run(context.Background(), s), errb.String())
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		require.Len(t, lines, 3)
		var secret string
		for _, l := range lines {
			f := strings.Fields(l)
			require.Len(t, f, 3, l)
			require.Regexp(t, `^[0-9a-f]{32}$`, f[1])
			require.Equal(t, "lo", f[2])
			if secret == "" {
				secret = f[1]
			}
			require.Equal(t, secret, f[1], "ranks of one job got different secrets")
		}
		require.False(t, secrets[secret], "two jobs got the same secret")
		secrets[secret] = true
	}
}

func TestSpecErrors(t *testing.T) {
	for _, s := range []Spec{{N: 0, Prog: "true"}, {N: 1}, {N: 1, Prog: "true", Transport: "a b"}} {
		err := Run(context.Background(), s)
		require.ErrorIs(t, err, ErrSpec)
		require.Equal(t, 2, ExitCode(err))
	}
	err := Run(context.Background(), Spec{N: 1, Prog: "/nonexistent/prog"})
	require.ErrorIs(t, err, ErrStart)
	require.Equal(t, 127, ExitCode(err))
	err = Run(context.Background(), Spec{N: 1, Prog: "true", JobDirParent: "/nonexistent/dir"})
	require.ErrorIs(t, err, ErrStart)
}

func TestPlainProgramsAndDefaultDir(t *testing.T) {
	var out bytes.Buffer
	var dir string
	err := Run(context.Background(), Spec{N: 2, Prog: "sh", Args: []string{"-c", `echo "$AMGO_JOB_DIR"; exit 0`}, Stdout: &out,
		OnStart: func(d string, _ []int) { dir = d }})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(dir, "/dev/shm/amgo-") || strings.HasPrefix(dir, os.TempDir()), dir)
	require.Equal(t, dir+"\n"+dir+"\n", out.String())
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err))

	err = Run(context.Background(), Spec{N: 2, Prog: "sh", Args: []string{"-c", `[ "$PMI_RANK" = 1 ] && kill -KILL $$; sleep 30`}})
	require.ErrorIs(t, err, ErrRankFailed)
	require.Equal(t, "rank 1 was killed by signal 9 (killed)", err.Error())
	require.Equal(t, 137, ExitCode(err))
}

// TestMPICHHydra runs the PMI client under MPICH's own launcher.
func TestMPICHHydra(t *testing.T) {
	var mpiexec string
	for _, name := range []string{"mpiexec.hydra", "mpiexec.mpich"} {
		if p, err := exec.LookPath(name); err == nil {
			mpiexec = p
			break
		}
	}
	if mpiexec == "" {
		t.Skip("neither mpiexec.hydra nor mpiexec.mpich on PATH (Debian: apt-get install mpich)")
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	// Debian 12's Hydra 4.0.2 hands a non-MPI program a socketpair (PMI_FD)
	// and answers init with 1.1 in the MPICH-3 style (rc last, no rc on maxes);
	// with -pmi-port it gives PMI_PORT and PMI_ID (initack handshake).
	for _, extra := range [][]string{nil, {"-pmi-port"}} {
		t.Run(strings.Join(append([]string{"default"}, extra...), ""), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			args := append([]string{}, extra...)
			args = append(args, "-n", "2", "-genv", helperEnv, "mpi", exe)
			cmd := exec.CommandContext(ctx, mpiexec, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			require.NoError(t, err, "stderr: %s", stderr.String())
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			sort.Strings(lines)
			require.Len(t, lines, 2, string(out))
			want := regexp.MustCompile(`^OK rank (\d) of 2 job kvs_\S+ pmi 1\.[12] env PMI_FD=\d+,PMI_RANK=(\d),PMI_SIZE=2$`)
			if extra != nil {
				want = regexp.MustCompile(`^OK rank (\d) of 2 job kvs_\S+ pmi 1\.[12] env PMI_PORT=\S+:\d+,PMI_ID=(\d)$`)
			}
			for r, l := range lines {
				t.Log(l)
				m := want.FindStringSubmatch(l)
				require.NotNil(t, m, l)
				require.Equal(t, []string{strconv.Itoa(r), strconv.Itoa(r)}, m[1:])
			}
		})
	}
}

// Ranks are bound to CPUs of their own by default, only when each gets one,
// and never as goroutine ranks.
func TestBindCPUs(t *testing.T) {
	var set unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &set))
	n := set.Count()
	cpus, err := bindCPUs(Spec{N: n, Transport: "shm"})
	require.NoError(t, err)
	require.Len(t, cpus, n, "auto: one CPU per rank")
	for _, c := range cpus {
		require.True(t, set.IsSet(c))
	}
	cpus, err = bindCPUs(Spec{N: n + 1, Transport: "shm"})
	require.NoError(t, err)
	require.Nil(t, cpus, "auto: oversubscribed, not bound")
	cpus, err = bindCPUs(Spec{N: n + 1, Transport: "tcp", Bind: "core"})
	require.NoError(t, err)
	require.Len(t, cpus, n, "core: bound round-robin")
	cpus, err = bindCPUs(Spec{N: 1, Transport: "shm", Bind: "none"})
	require.NoError(t, err)
	require.Nil(t, cpus)
	cpus, err = bindCPUs(Spec{N: 2, Transport: "loop", Bind: "core"})
	require.NoError(t, err)
	require.Nil(t, cpus, "goroutine ranks are not bound")
	_, err = bindCPUs(Spec{N: 2, Transport: "shm", Bind: "socket"})
	require.Error(t, err)
}

// Ranks start with Spec.TimerSlack (DefaultTimerSlack when 0, the launcher's
// own when negative), and the launching thread keeps its own slack.
func TestTimerSlack(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		slack time.Duration
		want  string
	}{
		{0, "1000000"},
		{300 * time.Microsecond, "300000"},
		{-1, strconv.Itoa(own)}, // every thread of this test process has the slack it started with
	} {
		s, out, errb := spec(t, "slack", 2)
		s.TimerSlack = tc.slack
		require.NoError(t, Run(context.Background(), s), errb.String())
		require.Equal(t, []string{tc.want, tc.want}, strings.Fields(out.String()), "TimerSlack %v", tc.slack)
	}

	cmd := exec.Command("true")
	require.NoError(t, startWithSlack(cmd, 2*time.Millisecond))
	require.NoError(t, cmd.Wait())
	after, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	require.NoError(t, err)
	require.Equal(t, own, after, "the launching thread's slack changed")
}

// A launcher killed by SIGKILL leaves its job directory behind; the next
// launcher removes it, and leaves alone those of launchers still running.
func TestStaleJobDirsRemoved(t *testing.T) {
	parent := t.TempDir()
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	stale := filepath.Join(parent, fmt.Sprintf("amgo-%d-0123456789ab", dead.Process.Pid))
	require.NoError(t, os.Mkdir(stale, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(stale, "shm-0"), []byte("x"), 0o600))
	live := filepath.Join(parent, fmt.Sprintf("amgo-%d-0123456789ab", os.Getppid()))
	require.NoError(t, os.Mkdir(live, 0o700))
	other := filepath.Join(parent, "amgo-not-a-job")
	require.NoError(t, os.Mkdir(other, 0o700))

	d, err := makeJobDir(parent)
	require.NoError(t, err)
	require.DirExists(t, d)
	require.NoDirExists(t, stale)
	require.DirExists(t, live)
	require.DirExists(t, other)
}
