package mpiam

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/internal/cluster"
)

// buildChecks builds amrun and the check programs into one directory.
func buildChecks(t *testing.T) string {
	dir := buildWithAmrun(t, "./internal/p2pcheck")
	out, err := exec.Command("go", "build", "-o", dir+"/", "./internal/collcheck", "./internal/deadcheck", "./internal/nodecheck", "./internal/rmacheck").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return dir
}

// MPICH's Hydra launches amgo ranks across the nodes of an emulated cluster
// through its ssh launcher (the cluster's stand-in), two ranks per node:
// ranks reach their node's ranks over shm and the others over tcp, learn
// their nodes through Hydra's PMI (SplitType in p2pcheck), and the
// point-to-point and collective checks pass, with tcp, udp and xdp between
// the nodes.
func TestHydraAcrossNodes(t *testing.T) {
	c := cluster.New(t, 2, "")
	hydra, err := exec.LookPath("mpiexec.hydra")
	if err != nil {
		t.Skip("MPICH's mpiexec.hydra is not installed")
	}
	dir := buildChecks(t)
	for _, prog := range []string{"p2pcheck", "collcheck", "rmacheck"} {
		for _, net := range []string{"tcp", "udp", "xdp"} {
			t.Run(prog+"/"+net, func(t *testing.T) {
				cmd := exec.Command(hydra, "-f", c.Hostfile, "-launcher", "ssh", "-launcher-exec", c.StandIn,
					"-iface", c.Bridge, "-n", "4", "-ppn", "2", "-genv", "AMGO_NET", net, filepath.Join(dir, prog))
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, "%s", out)
				require.Contains(t, string(out), prog+": "+strconv.Itoa(4)+" ranks: OK")
			})
		}
	}
}

// amrun launches across the nodes of an emulated cluster: a proxy per node
// through the cluster's ssh stand-in, PMI over TCP on the bridge, two ranks
// per node placed in blocks; the checks pass over tcp and udp between the
// nodes, and with round-robin placement.
func TestAmrunAcrossNodes(t *testing.T) {
	c := cluster.New(t, 2, "")
	dir := buildChecks(t)
	for _, prog := range []string{"p2pcheck", "collcheck", "rmacheck"} {
		for _, net := range []string{"tcp", "udp"} {
			for _, mapBy := range []string{"slot", "node"} {
				t.Run(prog+"/"+net+"/"+mapBy, func(t *testing.T) {
					cmd := exec.Command(filepath.Join(dir, "amrun"), "-n", "4", "--timeout", "60s", "--hostfile", c.Hostfile,
						"--map-by", mapBy, "--launcher-exec", c.StandIn, "--launch-iface", c.Bridge, filepath.Join(dir, prog))
					cmd.Env = append(os.Environ(), "AMGO_NET="+net)
					out, err := cmd.CombinedOutput()
					require.NoError(t, err, "%s", out)
					require.Contains(t, string(out), prog+": 4 ranks: OK")
				})
			}
		}
	}
}

// The AF_XDP network between the nodes of an emulated cluster: the checks
// pass in a routed job of two ranks per node (shm within a node,
// AMGO_NET=xdp between; the two ranks of a node share its interface's
// UMEM) and with --transport xdp, one rank per node (xdp does not reach a
// rank on the same interface).
func TestXDPAcrossNodes(t *testing.T) {
	c := cluster.New(t, 2, "")
	dir := buildChecks(t)
	for _, prog := range []string{"p2pcheck", "collcheck", "rmacheck"} {
		for _, how := range []string{"routed", "xdp-only"} {
			t.Run(prog+"/"+how, func(t *testing.T) {
				n, hosts := "4", "node1:2,node2:2"
				args := []string{"--timeout", "60s", "--launcher-exec", c.StandIn, "--launch-iface", c.Bridge}
				if how == "xdp-only" {
					n, hosts = "2", "node1:1,node2:1"
					args = append(args, "--transport", "xdp")
				}
				args = append(args, "-n", n, "--hosts", hosts, filepath.Join(dir, prog))
				cmd := exec.Command(filepath.Join(dir, "amrun"), args...)
				cmd.Env = append(os.Environ(), "AMGO_NET=xdp")
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, "%s", out)
				require.Contains(t, string(out), prog+": "+n+" ranks: OK")
			})
		}
	}
}

// A whole node lost mid-job (every process of its namespaces killed at
// once): the ranks of the other node, blocked in an Allreduce, report
// ErrProcFailed naming a rank of the lost node, amrun ends the job within
// 5 s naming the lost node and its ranks, and no shared-memory file is left
// on the surviving node. amrun launches across the nodes (--hosts through
// the cluster's ssh stand-in); the surviving node's proxy forwards its
// ranks' reports to the end.
func TestNodeLossAcrossNodes(t *testing.T) {
	c := cluster.New(t, 2, "")
	dir := buildChecks(t)
	cmd := exec.Command(filepath.Join(dir, "amrun"), "-n", "4", "--timeout", "60s", "--hostfile", c.Hostfile,
		"--launcher-exec", c.StandIn, "--launch-iface", c.Bridge, filepath.Join(dir, "nodecheck"))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var out []string
	ready := false
	for !ready {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "job ended before it was ready: %v\n%s", out, stderr.String())
			out = append(out, l)
			ready = l == "nodecheck: ready"
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("job not ready: %v\n%s", out, stderr.String())
		}
	}
	time.Sleep(200 * time.Millisecond) // the survivors are in their Allreduce
	killed := time.Now()
	c.Kill(1)
	for l := range lines {
		out = append(out, l)
	}
	err = cmd.Wait()
	took := time.Since(killed)
	all := strings.Join(out, "\n")
	t.Logf("job ended %v after the node was killed:\n%s\n%s", took, all, stderr.String())
	require.Error(t, err, "the job fails")
	require.Less(t, took, 5*time.Second, "the job ends within 5 s of the loss")
	require.Regexp(t, `amrun: rank [23] was lost with host node2 \(ranks 2, 3 there\)`, stderr.String(), "amrun names the lost node and its ranks")
	re := regexp.MustCompile(`nodecheck: rank (\d+): ErrProcFailed rank (\d+) lost=(\w+)`)
	m := re.FindAllStringSubmatch(all, -1)
	require.Len(t, m, 2, "both survivors report: %s\n%s", all, stderr.String())
	for _, g := range m {
		require.Contains(t, []string{"0", "1"}, g[1], "the survivors are node1's ranks")
		require.Equal(t, "true", g[3], "rank %s names rank %s, one of the lost node's", g[1], g[2])
	}
	ls, err := c.Command(0, "sh", "-c", "ls -A /dev/shm").CombinedOutput()
	require.NoError(t, err, "%s", ls)
	require.NotContains(t, string(ls), "amgo", "shared-memory files left on the surviving node")
}

// A real Slurm (slurmctld, one slurmd per emulated node, munge) launches
// amgo across the nodes with srun --mpi=pmi2, two ranks per node: the MPI
// point-to-point and collective checks pass over shm within nodes and tcp
// between, and so does the heat solver.
func TestSlurmAcrossNodes(t *testing.T) {
	c := cluster.New(t, 2, "")
	s := c.StartSlurm(t)
	dir := buildChecks(t)
	out, err := exec.Command("go", "build", "-o", dir+"/", "../examples/heat").CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, prog := range []string{"p2pcheck", "collcheck", "heat"} {
		t.Run(prog, func(t *testing.T) {
			cmd := s.Srun("--mpi=pmi2", "-N", "2", "-n", "4", "--overcommit", "-t", "2", filepath.Join(dir, prog))
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			if prog != "heat" {
				require.Contains(t, string(out), prog+": 4 ranks: OK")
			} else {
				require.Contains(t, string(out), "heat: check PASSED", "%s", out)
			}
		})
	}
}
