//go:build linux

package xdp

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

// envRole is the part a re-executed test binary plays (TestChild).
const envRole = "AMGO_XDP_TEST_ROLE"

// startChild runs this test binary's TestChild in namespace ns, playing
// role; its output comes through the returned reader.
func startChild(t *testing.T, ns, role string) (*exec.Cmd, *bufio.Reader) {
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envRole+"="+role, "GORACE=atexit_sleep_ms=0")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewReader(out)
}

// TestChild is the body of a re-executed rank; it is skipped in a normal
// run. Roles: "hold" opens a job of one rank on eth0, says "ready" and
// waits to be killed; "unpriv" gives up root (uid and gid 65534) and says
// what opening the network then answers.
func TestChild(t *testing.T) {
	role := os.Getenv(envRole)
	switch role {
	case "":
		t.Skip("run by the tests of this package as a separate process")
	case "hold":
		tr, err := open(transporttest.NewBootstraps(1, "hold")[0], map[string]string{"iface": "eth0"})
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Println("ready")
		_ = tr
		time.Sleep(time.Hour)
	case "unpriv":
		if err := unix.Setgroups(nil); err != nil {
			fmt.Println("setgroups:", err)
			return
		}
		if err := unix.Setresgid(65534, 65534, 65534); err != nil {
			fmt.Println("setresgid:", err)
			return
		}
		if err := unix.Setresuid(65534, 65534, 65534); err != nil {
			fmt.Println("setresuid:", err)
			return
		}
		_, err := open(transporttest.NewBootstraps(1, "unpriv")[0], map[string]string{"iface": "eth0"})
		fmt.Printf("unavailable=%v error: %v\n", errors.Is(err, ErrUnavailable), err)
	}
}

// xdpAttached reports whether interface dev in namespace ns has an XDP
// program.
func xdpAttached(t *testing.T, ns, dev string) bool {
	out, err := exec.Command("ip", "-n", ns, "-d", "link", "show", "dev", dev).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return strings.Contains(string(out), "prog/xdp")
}

// A rank killed with SIGKILL leaves no XDP program attached and no socket
// bound: the kernel detaches the program with the last descriptor of its
// BPF link, and a new job on the same interface and queue opens at once.
func TestKilledRankLeavesNothing(t *testing.T) {
	s := newStar(t, 1, 1500)
	for round := range 3 {
		cmd, out := startChild(t, s.ns[0], "hold")
		line, err := out.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "ready\n", line, "round %d", round)
		require.True(t, xdpAttached(t, s.ns[0], s.dev))
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()
		require.False(t, xdpAttached(t, s.ns[0], s.dev), "round %d: the killed rank's program is still attached", round)
	}
	start := time.Now()
	tr, err := inNetns(s.ns[0], func() (*Transport, error) {
		return open(transporttest.NewBootstraps(1, "after")[0], map[string]string{"iface": s.dev})
	})
	require.NoError(t, err)
	t.Logf("a new job opened %v after the last kill", time.Since(start).Round(time.Millisecond))
	require.NoError(t, tr.Close())
	require.False(t, xdpAttached(t, s.ns[0], s.dev), "Close left the program attached")
}

// Without root the network does not open, and the error names what is
// missing and wraps ErrUnavailable.
func TestWithoutPrivilege(t *testing.T) {
	s := newStar(t, 1, 1500)
	_, out := startChild(t, s.ns[0], "unpriv")
	line, err := out.ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "unavailable=true")
	require.Contains(t, line, "CAP_NET_RAW")
	require.False(t, xdpAttached(t, s.ns[0], s.dev))
}
