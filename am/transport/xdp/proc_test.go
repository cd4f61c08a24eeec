//go:build linux

package xdp

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
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

// leaveProgram attaches an XDP program named name to interface dev in
// namespace ns through netlink, as a tool or an older loader would, and
// lets go of it: it stays attached with no process holding it.
func leaveProgram(t *testing.T, ns, dev, name string) {
	_, err := inNetns(ns, func() (struct{}, error) {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return struct{}{}, err
		}
		xsks, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: 4})
		if err != nil {
			return struct{}{}, err
		}
		defer xsks.Close()
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.XDP, License: "Dual BSD/GPL",
			Instructions: program(xsks, EtherType)})
		if err != nil {
			return struct{}{}, err
		}
		defer prog.Close()
		return struct{}{}, xdpSet(ifi.Index, prog.FD(), unix.XDP_FLAGS_SKB_MODE)
	})
	require.NoError(t, err)
	require.True(t, xdpAttached(t, ns, dev))
}

// A leftover amgo program attached through netlink (no process holds it)
// is recognised by its name and replaced: the job opens and its frames
// flow, and it leaves nothing attached. Another program is left alone and
// the job fails, saying why.
func TestLeftoverProgramReplaced(t *testing.T) {
	s := newStar(t, 2, 1500)
	leaveProgram(t, s.ns[0], s.dev, ProgramName)
	bs := transporttest.NewBootstraps(2, "leftover")
	ts := make([]*Transport, 2)
	errs := make(chan error, 2)
	for r := range 2 {
		go func() {
			var err error
			ts[r], err = inNetns(s.ns[r], func() (*Transport, error) { return open(bs[r], map[string]string{"iface": s.dev}) })
			errs <- err
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	done := make(chan error, 1)
	go func() { done <- transporttest.PingPong(ts[1], 0, 100, false) }()
	require.NoError(t, transporttest.PingPong(ts[0], 0, 100, false))
	require.NoError(t, <-done)
	for _, tr := range ts {
		require.NoError(t, tr.Close())
	}
	require.False(t, xdpAttached(t, s.ns[0], s.dev), "the job left a program")

	leaveProgram(t, s.ns[1], s.dev, "someone_else")
	_, err := inNetns(s.ns[1], func() (*Transport, error) {
		return open(transporttest.NewBootstraps(1, "foreign")[0], map[string]string{"iface": s.dev})
	})
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "already has an XDP program")
	require.True(t, xdpAttached(t, s.ns[1], s.dev), "another's program was removed")
}
