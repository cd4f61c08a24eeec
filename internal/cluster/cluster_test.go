package cluster

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Each node has its own host name, /dev/shm, PID namespace and address, the
// nodes resolve each other's names and reach each other over the bridge,
// and the ssh stand-in runs a command in the node it names.
func TestNodesAreSeparate(t *testing.T) {
	c := New(t, 2, "")
	var shm, pidns []string
	for k, nd := range c.Nodes {
		out, err := c.Command(k, "sh", "-c", "hostname; stat -c %d:%i /dev/shm; readlink /proc/self/ns/pid; getent hosts node1 node2").CombinedOutput()
		require.NoError(t, err, "%s", out)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		require.Equal(t, nd.Name, lines[0])
		shm = append(shm, lines[1])
		pidns = append(pidns, lines[2])
		require.Contains(t, string(out), c.Nodes[0].Addr+" ")
		require.Contains(t, string(out), c.Nodes[1].Addr+" ")
	}
	require.NotEqual(t, shm[0], shm[1], "each node has its own /dev/shm")
	require.NotEqual(t, pidns[0], pidns[1], "each node has its own PID namespace")
	out, err := c.Command(0, "ping", "-c", "1", "-W", "2", "node2").CombinedOutput()
	if _, lerr := exec.LookPath("ping"); lerr == nil {
		require.NoError(t, err, "%s", out)
	}
	out, err = exec.Command(c.StandIn, "-x", "node2", "echo", "on", "$(hostname)").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "on node2\n", string(out))
	// A node that fails takes all its processes with it.
	sleeper := c.Command(1, "sleep", "100")
	require.NoError(t, sleeper.Start())
	c.Kill(1)
	require.Error(t, sleeper.Wait())
}

// SetCPUs confines what the stand-in starts in a node to the given CPUs,
// and Reset ends everything a node runs except its holder.
func TestNodesAreConfinedAndReset(t *testing.T) {
	c := New(t, 2, "")
	require.NoError(t, c.SetCPUs(1, "0"))
	out, err := exec.Command(c.StandIn, "node2", "grep Cpus_allowed_list /proc/self/status").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `Cpus_allowed_list:\s+0\n`, string(out))
	require.NoError(t, c.SetCPUs(1, ""))
	out, err = exec.Command(c.StandIn, "node2", "grep Cpus_allowed_list /proc/self/status").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotRegexp(t, `Cpus_allowed_list:\s+0\n`, string(out))

	// A process left behind in node 1 is gone after Reset; the node works.
	require.NoError(t, exec.Command(c.StandIn, "node1", "sleep 300 </dev/null >/dev/null 2>&1 &").Run())
	count := func() string {
		// Living sleeps only: the holder does not reap, so the killed one
		// stays a zombie.
		out, _ := c.Command(0, "sh", "-c", `ps -eo stat=,comm= | awk '$2 == "sleep" && $1 !~ /^Z/' | wc -l`).CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	require.Equal(t, "2", count(), "the holder and the leftover")
	require.NoError(t, c.Reset())
	require.Eventually(t, func() bool { return count() == "1" }, 5*time.Second, 20*time.Millisecond, "only the holder is left")
	out, err = exec.Command(c.StandIn, "node1", "hostname").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "node1", strings.TrimSpace(string(out)))
}
