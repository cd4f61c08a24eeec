package launch

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseHostsAndHostfile(t *testing.T) {
	h, err := ParseHosts("a,b:2, c")
	require.NoError(t, err)
	require.Equal(t, []Host{{Name: "a"}, {Name: "b", Slots: 2}, {Name: "c"}}, h)
	for _, bad := range []string{"", "a,,b", "a:0", "a:x", "-oProxyCommand=x", "a b"} {
		_, err := ParseHosts(bad)
		require.ErrorIs(t, err, ErrSpec, bad)
	}
	h, err = ReadHostfile(strings.NewReader("# cluster\nn1\n\nn2:4\nn3 slots=2 max_slots=8  # Open MPI form\n"))
	require.NoError(t, err)
	require.Equal(t, []Host{{Name: "n1"}, {Name: "n2", Slots: 4}, {Name: "n3", Slots: 2}}, h)
	_, err = ReadHostfile(strings.NewReader("n1\nn2 cpus=3\n"))
	require.ErrorIs(t, err, ErrSpec)
	require.ErrorContains(t, err, "line 2")
	_, err = ReadHostfile(strings.NewReader("# nothing\n"))
	require.ErrorIs(t, err, ErrSpec)
	_, err = ReadHostfilePath(filepath.Join(t.TempDir(), "none"))
	require.ErrorIs(t, err, ErrSpec)
}

func TestPlace(t *testing.T) {
	ab := []Host{{Name: "a"}, {Name: "b"}}
	for _, c := range []struct {
		n     int
		hosts []Host
		mapBy string
		want  []int
	}{
		{4, ab, "", []int{0, 0, 1, 1}},
		{5, ab, "slot", []int{0, 0, 0, 1, 1}},
		{4, ab, "node", []int{0, 1, 0, 1}},
		{1, ab, "", []int{0}},
		{5, []Host{{Name: "a", Slots: 1}, {Name: "b"}, {Name: "c"}}, "", []int{0, 1, 1, 2, 2}},
		{5, []Host{{Name: "a", Slots: 1}, {Name: "b", Slots: 3}}, "node", []int{0, 1, 1, 1, 0}},
		{5, []Host{{Name: "a", Slots: 1}, {Name: "b", Slots: 1}}, "", []int{0, 1, 0, 1, 0}},
		{3, []Host{{Name: "a", Slots: 4}, {Name: "b"}}, "", []int{0, 0, 0}},
		{6, []Host{{Name: "a", Slots: 4}, {Name: "b"}}, "", []int{0, 0, 0, 0, 1, 1}},
	} {
		got, err := Place(c.n, c.hosts, c.mapBy)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%d ranks on %v by %q", c.n, c.hosts, c.mapBy)
	}
	_, err := Place(2, nil, "")
	require.ErrorIs(t, err, ErrSpec)
	_, err = Place(2, ab, "socket")
	require.ErrorIs(t, err, ErrSpec)
}

func TestShellQuote(t *testing.T) {
	for _, s := range []string{"plain", "/a/b-c_d.e:1", "", "it's", "a b", "$(rm -rf /)", "x\ny"} {
		out, err := exec.Command("sh", "-c", "printf %s "+shellQuote(s)).Output()
		require.NoError(t, err)
		require.Equal(t, s, string(out))
	}
}

// fakeSSH writes a launcher command that runs its command on this host, as
// ssh would on the named one, with FAKE_HOST=<host>; and one that reports
// the proxy's pid first, so that a test can kill a "host".
func fakeSSH(t *testing.T) string {
	dir := t.TempDir()
	p := filepath.Join(dir, "ssh")
	script := "#!/bin/sh\nhost=$1; shift\necho $$ > " + dir + "/$host.pid\nexec env FAKE_HOST=$host sh -c \"exec $*\"\n"
	require.NoError(t, os.WriteFile(p, []byte(script), 0o755))
	return p
}

func hostSpec(t *testing.T, mode string, n int, hosts string) (Spec, *strings.Builder, *strings.Builder) {
	s, _, _ := spec(t, mode, n)
	var out, errb strings.Builder
	s.Stdout, s.Stderr = &out, &errb
	h, err := ParseHosts(hosts)
	require.NoError(t, err)
	exe, err := os.Executable()
	require.NoError(t, err)
	s.Hosts, s.LauncherExec, s.LaunchIface = h, fakeSSH(t), "127.0.0.1"
	s.ProxyCommand = []string{exe, ProxyFlag}
	return s, &out, &errb
}

// Ranks placed on two hosts each run under their host's proxy: PMI over TCP
// (PMI_PORT) from every host, a job directory per host (removed at the
// end), the job secret and the working directory forwarded; placement by
// block and round-robin.
func TestHostsJob(t *testing.T) {
	for _, c := range []struct {
		mapBy string
		want  []string
	}{{"slot", []string{"a", "a", "b", "b"}}, {"node", []string{"a", "b", "a", "b"}}} {
		t.Run(c.mapBy, func(t *testing.T) {
			s, out, errb := hostSpec(t, "where", 4, "a,b")
			s.MapBy = c.mapBy
			require.NoError(t, Run(context.Background(), s), errb.String())
			wd, _ := os.Getwd()
			re := regexp.MustCompile(`rank (\d) of 4 host (\w+) secret true wd (\S+) jobdir (\S+)`)
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			sort.Strings(lines)
			require.Len(t, lines, 4, out.String())
			dirs := map[string]string{}
			for i, l := range lines {
				m := re.FindStringSubmatch(l)
				require.NotNil(t, m, l)
				require.Equal(t, string(rune('0'+i)), m[1])
				require.Equal(t, c.want[i], m[2], "rank %d's host", i)
				require.Equal(t, wd, m[3])
				if d, ok := dirs[m[2]]; ok {
					require.Equal(t, d, m[4], "one job directory per host")
				}
				dirs[m[2]] = m[4]
				_, err := os.Stat(m[4])
				require.True(t, os.IsNotExist(err), "job directory %s left behind", m[4])
			}
			require.NotEqual(t, dirs["a"], dirs["b"])
		})
	}
}

// The first failure on any host ends the job, named as on one host: a
// rank's exit status, a PMI abort; and the rest of the job is killed.
func TestHostsFailures(t *testing.T) {
	s, _, errb := hostSpec(t, "fail", 4, "a,b")
	err := Run(context.Background(), s)
	var je *JobError
	require.ErrorAs(t, err, &je, errb.String())
	require.ErrorIs(t, err, ErrRankFailed)
	require.Equal(t, 1, je.Rank)
	require.Equal(t, 3, je.Code)

	s, _, errb = hostSpec(t, "abort", 4, "a,b")
	err = Run(context.Background(), s)
	require.ErrorAs(t, err, &je, errb.String())
	require.ErrorIs(t, err, ErrAborted)
	require.Equal(t, 1, je.Rank)
	require.Equal(t, 5, je.Code)
	require.Contains(t, je.Detail, "bad input file")

	s, _, _ = hostSpec(t, "hang", 2, "a,b")
	s.Timeout = 300 * time.Millisecond
	start := time.Now()
	err = Run(context.Background(), s)
	require.ErrorIs(t, err, ErrTimeout)
	require.Less(t, time.Since(start), 10*time.Second, "SIGKILL after the grace reaches ranks that ignore SIGTERM")

	s, _, _ = hostSpec(t, "hang", 2, "a,b")
	sigs := make(chan os.Signal, 1)
	s.Signals = sigs
	s.OnStart = func(string, []int) { time.AfterFunc(200*time.Millisecond, func() { sigs <- syscall.SIGINT }) }
	err = Run(context.Background(), s)
	require.ErrorIs(t, err, ErrInterrupted)
	require.Equal(t, 130, ExitCode(err))
}

// A host lost mid-job (its proxy and ranks killed at once): its ranks are
// reported lost, by host, at once, and the rest of the job is ended.
func TestHostLost(t *testing.T) {
	s, _, errb := hostSpec(t, "fail", 4, "a,b")
	s.Env = append(s.Env, "FAIL_RANK=none")
	pidDir := filepath.Dir(s.LauncherExec)
	s.OnStart = func(string, []int) {
		time.AfterFunc(300*time.Millisecond, func() {
			b, err := os.ReadFile(filepath.Join(pidDir, "b.pid"))
			if err == nil {
				pid := strings.TrimSpace(string(b))
				_ = exec.Command("pkill", "-KILL", "-g", pid).Run() // the proxy and its ranks' groups
				_ = exec.Command("pkill", "-KILL", "-s", pid).Run()
				_ = exec.Command("kill", "-KILL", pid).Run()
			}
		})
	}
	start := time.Now()
	err := Run(context.Background(), s)
	var je *JobError
	require.ErrorAs(t, err, &je, errb.String())
	require.ErrorIs(t, err, ErrRankFailed)
	require.Contains(t, []int{2, 3}, je.Rank)
	require.Contains(t, je.Detail, "lost with host b (ranks 2, 3 there)")
	require.Less(t, time.Since(start), 10*time.Second)
}

func TestHostsStartErrors(t *testing.T) {
	s, _, _ := hostSpec(t, "where", 2, "a,b")
	s.LauncherExec = filepath.Join(t.TempDir(), "none")
	err := Run(context.Background(), s)
	require.ErrorIs(t, err, ErrStart)
	require.Equal(t, 127, ExitCode(err))

	s, _, _ = hostSpec(t, "where", 2, "a,b")
	s.LauncherExec = "false"
	err = Run(context.Background(), s)
	require.ErrorIs(t, err, ErrStart)
	require.ErrorContains(t, err, "before the host's proxy connected back")

	s, _, _ = hostSpec(t, "where", 2, "a,b")
	s.Prog = filepath.Join(t.TempDir(), "none")
	err = Run(context.Background(), s)
	require.ErrorIs(t, err, ErrRankFailed)
	require.Regexp(t, `could not be started on host [ab]: `, err.Error())
	require.Equal(t, 127, ExitCode(err))

	s, _, _ = hostSpec(t, "where", 2, "a,b")
	s.Transport = "loop"
	require.ErrorIs(t, Run(context.Background(), s), ErrSpec)

	s, _, _ = hostSpec(t, "where", 2, "a,b")
	s.LaunchIface = "no-such-interface0"
	require.ErrorIs(t, Run(context.Background(), s), ErrSpec)
}
