package mpiam

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/internal/cluster"
)

// buildChecks builds amrun and the check programs into one directory.
func buildChecks(t *testing.T) string {
	dir := buildWithAmrun(t, "./internal/p2pcheck")
	out, err := exec.Command("go", "build", "-o", dir+"/", "./internal/collcheck", "./internal/deadcheck").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return dir
}

// MPICH's Hydra launches amgo ranks across the nodes of an emulated cluster
// through its ssh launcher (the cluster's stand-in), two ranks per node:
// ranks reach their node's ranks over shm and the others over tcp, learn
// their nodes through Hydra's PMI (SplitType in p2pcheck), and the
// point-to-point and collective checks pass.
func TestHydraAcrossNodes(t *testing.T) {
	c := cluster.New(t, 2, "")
	hydra, err := exec.LookPath("mpiexec.hydra")
	if err != nil {
		t.Skip("MPICH's mpiexec.hydra is not installed")
	}
	dir := buildChecks(t)
	for _, prog := range []string{"p2pcheck", "collcheck"} {
		for _, net := range []string{"tcp", "udp"} {
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
