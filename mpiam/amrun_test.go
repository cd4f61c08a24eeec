package mpiam

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Ranks as real processes launched by amrun over shared memory: ring shifts
// up to 4 MiB (single-copy puts between processes), non-overtaking with
// AnySource from several senders, Ssend and Probe (cmd p2pcheck).
func TestProcessesUnderAmrun(t *testing.T) {
	dir := buildWithAmrun(t, "./internal/p2pcheck")
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			out, err := exec.Command(filepath.Join(dir, "amrun"), "-n", fmt.Sprint(n), "--transport", "shm",
				"--timeout", "60s", filepath.Join(dir, "p2pcheck")).CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Contains(t, string(out), fmt.Sprintf("p2pcheck: %d ranks: OK", n))
		})
	}
}

// buildWithAmrun builds amrun and the test program pkg (a package path
// relative to mpiam) into a temporary directory and returns it; it skips the
// test under -short.
func buildWithAmrun(t *testing.T, pkg string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and launches programs")
	}
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/", "../cmd/amrun", pkg).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return dir
}

// A job over two emulated hosts, launched by amrun's --hosts with
// round-robin placement (neighbours in a ring are on different hosts)
// through a launcher command that gives each host's proxy, and so its
// ranks, its own AMGO_NODE: each rank reaches the ranks of its host over
// shm and the others over AMGO_NET, and the point-to-point and collective
// checks pass as on one network.
func TestMixedJobUnderAmrun(t *testing.T) {
	dir := buildWithAmrun(t, "./internal/p2pcheck")
	out, err := exec.Command("go", "build", "-o", dir+"/", "./internal/collcheck", "./internal/rmacheck").CombinedOutput()
	require.NoError(t, err, "%s", out)
	ssh := filepath.Join(dir, "ssh")
	require.NoError(t, os.WriteFile(ssh, []byte("#!/bin/sh\nhost=$1; shift\nexec env AMGO_NODE=$host sh -c \"$*\"\n"), 0o755))
	for _, net := range []string{"tcp", "udp"} {
		for _, prog := range []string{"p2pcheck", "collcheck", "rmacheck"} {
			t.Run(net+"/"+prog, func(t *testing.T) {
				cmd := exec.Command(filepath.Join(dir, "amrun"), "-n", "4", "--timeout", "60s", "--hosts", "a,b", "--map-by", "node",
					"--launcher-exec", ssh, "--launch-iface", "127.0.0.1", filepath.Join(dir, prog))
				cmd.Env = append(os.Environ(), "AMGO_NET="+net, "AMGO_IFACE=127.0.0.1")
				out, err := cmd.CombinedOutput()
				require.NoError(t, err, "%s", out)
				require.Contains(t, string(out), prog+": 4 ranks: OK")
			})
		}
	}
	emulate := `AMGO_NODE=node$((PMI_RANK % 2)) exec "$0"`
	// A network that cannot reach another node is refused, naming it.
	cmd := exec.Command(filepath.Join(dir, "amrun"), "-n", "2", "--timeout", "60s",
		"sh", "-c", emulate, filepath.Join(dir, "p2pcheck"))
	cmd.Env = append(os.Environ(), "AMGO_NET=shm")
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "AMGO_NET=shm cannot reach other nodes", "%s", out)
}

// One-sided communication between real processes launched by amrun: fence
// rings, accumulates, a FetchAndOp counter under locks, generalized active
// target, and a shared-memory window that processes load and store
// directly (cmd rmacheck).
func TestRMAProcessesUnderAmrun(t *testing.T) {
	dir := buildWithAmrun(t, "./internal/rmacheck")
	for _, nw := range []string{"shm", "tcp"} {
		t.Run(nw, func(t *testing.T) {
			out, err := exec.Command(filepath.Join(dir, "amrun"), "-n", "3", "--transport", nw,
				"--timeout", "60s", filepath.Join(dir, "rmacheck")).CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Contains(t, string(out), "rmacheck: 3 ranks: OK")
		})
	}
}
