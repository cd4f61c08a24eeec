// Package cluster emulates a cluster of nodes on one Linux host, for tests of
// jobs that span several nodes. Each node has what a real node has apart from
// its own kernel: a network namespace with an address on a bridge in the root
// namespace (its "switch"), its own host name (a UTS namespace), a mount
// namespace with a private tmpfs on /dev/shm and an /etc/hosts in which every
// node's name resolves and a /sys whose network directories show the
// node's own interfaces (UCX looks its devices up there; the rest of /sys,
// cgroups included, is the host's),
// and its own IPC and PID namespaces, so that no shared
// memory, SysV IPC or Cross Memory Attach can cross nodes (without them, an
// MPI may use shared memory between two "nodes" unnoticed).
//
// A node is a holder process (sleep, the first process of the node's PID
// namespace) created with unshare(1) inside the node's network namespace;
// Command runs a program in all of its namespaces with nsenter(1). Stand-in
// is an executable that launchers call instead of ssh (Hydra's
// -launcher-exec, Open MPI's plm_rsh_agent): "stand-in [options] host
// command..." runs the command in that node through sh -c, as ssh runs it in
// the remote shell.
//
// Nodes share the host's CPUs unless SetCPUs gives a node its own (the
// stand-in then runs commands under taskset(1)); Reset ends what a node runs
// except its holder. Build makes a cluster outside a test (the benchmark
// harness).
//
// Creating a cluster needs root, ip(8), nsenter(1) and unshare(1); New skips
// the test with the reason otherwise. Tests that use it run in `make
// cluster` (AMGO_CLUSTER=1); without that variable they skip.
package cluster

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// EnvEnable is the variable that enables the tests that build clusters
// (make cluster sets it): they take seconds each and need root.
const EnvEnable = "AMGO_CLUSTER"

// Node is one emulated node.
type Node struct {
	Name string // host name, resolvable on every node
	Addr string // IPv4 address on the cluster's bridge
	ns   string // network namespace (ip netns)
	pid  int    // holder process, in the root PID namespace
	hold *exec.Cmd
}

// Cluster is a set of emulated nodes joined by a bridge.
type Cluster struct {
	Nodes []Node
	// Bridge is the bridge's interface name in the root namespace, and
	// BridgeAddr its address: launchers that run outside the nodes bind
	// their control sockets there (Hydra's -iface).
	Bridge, BridgeAddr string
	// Dir holds the cluster's files: hosts, the hostfile, the stand-in.
	Dir string
	// Hostfile lists the node names one per line (mpiexec -f).
	Hostfile string
	// StandIn is the ssh stand-in (see the package documentation).
	StandIn string
}

var seq atomic.Int32

// Skip reports why clusters cannot be built here, or "" when they can.
func Skip() string {
	if os.Getenv(EnvEnable) == "" {
		return EnvEnable + " is not set (make cluster sets it)"
	}
	if os.Geteuid() != 0 {
		return "an emulated cluster needs root (network namespaces, bridges, mounts)"
	}
	for _, tool := range []string{"ip", "nsenter", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "an emulated cluster needs " + tool + ": " + err.Error()
		}
	}
	return ""
}

// New builds a cluster of n nodes named <prefix>1..<prefix>n (prefix
// "node" when empty) and tears it down when the test ends. It skips the
// test when Skip says so and fails it when a step fails.
func New(t testing.TB, n int, prefix string) *Cluster {
	t.Helper()
	if why := Skip(); why != "" {
		t.Skip(why)
	}
	if prefix == "" {
		prefix = "node"
	}
	c, err := build(n, prefix, t.TempDir())
	if c != nil {
		t.Cleanup(c.Close)
	}
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	return c
}

// Build builds a cluster of n nodes, as New does, outside a test (the
// benchmark harness): dir holds its files and must outlive it. The caller
// must Close it. Errors: the reason Skip gives when clusters cannot be
// built here (without the AMGO_CLUSTER check), or the failing step.
func Build(n int, prefix, dir string) (*Cluster, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("cluster: an emulated cluster needs root (network namespaces, bridges, mounts)")
	}
	for _, tool := range []string{"ip", "nsenter", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("cluster: an emulated cluster needs %s: %w", tool, err)
		}
	}
	if prefix == "" {
		prefix = "node"
	}
	c, err := build(n, prefix, dir)
	if err != nil {
		if c != nil {
			c.Close()
		}
		return nil, fmt.Errorf("cluster: %w", err)
	}
	return c, nil
}

// Subnet is the cluster's IPv4 network in CIDR form (the bridge and every
// node's eth0 are in it), for launchers that select interfaces by network
// (Open MPI's btl_tcp_if_include and oob_tcp_if_include).
func (c *Cluster) Subnet() string {
	return c.BridgeAddr[:strings.LastIndexByte(c.BridgeAddr, '.')] + ".0/24"
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func build(n int, prefix, dir string) (*Cluster, error) {
	// Names and a subnet unique to this process and cluster: interface
	// names are at most 15 bytes.
	id := (os.Getpid()*7 + int(seq.Add(1))) % 10000
	sub := fmt.Sprintf("10.%d.%d", 100+(id/250)%40, id%250)
	c := &Cluster{Bridge: fmt.Sprintf("amgobr%d", id), BridgeAddr: sub + ".254", Dir: dir}
	if err := run("ip", "link", "add", c.Bridge, "type", "bridge"); err != nil {
		return nil, err
	}
	if err := run("ip", "addr", "add", c.BridgeAddr+"/24", "dev", c.Bridge); err != nil {
		return c, err
	}
	if err := run("ip", "link", "set", c.Bridge, "up"); err != nil {
		return c, err
	}
	hosts := "127.0.0.1 localhost\n"
	var names []string
	for k := range n {
		nd := Node{Name: fmt.Sprintf("%s%d", prefix, k+1), Addr: fmt.Sprintf("%s.%d", sub, k+1),
			ns: fmt.Sprintf("amgo%dn%d", id, k+1)}
		c.Nodes = append(c.Nodes, nd)
		hosts += nd.Addr + " " + nd.Name + "\n"
		names = append(names, nd.Name)
	}
	hosts += c.BridgeAddr + " amgo-switch\n"
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts), 0o644); err != nil {
		return c, err
	}
	c.Hostfile = filepath.Join(dir, "hostfile")
	if err := os.WriteFile(c.Hostfile, []byte(strings.Join(names, "\n")+"\n"), 0o644); err != nil {
		return c, err
	}
	for k := range c.Nodes {
		if err := c.startNode(k, dir); err != nil {
			return c, err
		}
	}
	c.StandIn = filepath.Join(dir, "ssh")
	script := `#!/bin/sh
# ssh stand-in for an emulated cluster: [options] host command...
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F|-E|-b|-c|-D|-e|-I|-J|-L|-m|-O|-Q|-R|-S|-W|-w) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
pid=$(cat "` + dir + `/$host.pid" 2>/dev/null) || { echo "ssh stand-in: no node $host" >&2; exit 255; }
cpus=$(cat "` + dir + `/$host.cpus" 2>/dev/null)
if [ -n "$cpus" ]; then
  exec taskset -c "$cpus" nsenter -t "$pid" -a -w"$PWD" sh -c "$*"
fi
exec nsenter -t "$pid" -a -w"$PWD" sh -c "$*"
`
	if err := os.WriteFile(c.StandIn, []byte(script), 0o755); err != nil {
		return c, err
	}
	return c, nil
}

// startNode creates node k's network namespace and link, and its holder.
func (c *Cluster) startNode(k int, dir string) error {
	nd := &c.Nodes[k]
	veth := fmt.Sprintf("%sv%d", strings.TrimPrefix(nd.ns, "amgo"), k+1) // in the root namespace
	veth = "av" + veth
	if len(veth) > 15 {
		veth = veth[:15]
	}
	if err := run("ip", "netns", "add", nd.ns); err != nil {
		return err
	}
	if err := run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", nd.ns); err != nil {
		return err
	}
	if err := run("ip", "link", "set", veth, "master", c.Bridge, "up"); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"-n", nd.ns, "addr", "add", nd.Addr + "/24", "dev", "eth0"},
		{"-n", nd.ns, "link", "set", "eth0", "up"},
		{"-n", nd.ns, "link", "set", "lo", "up"},
	} {
		if err := run("ip", args...); err != nil {
			return err
		}
	}
	// The holder: the first process of the node's PID namespace. nsenter
	// rather than `ip netns exec`, which mounts a /sys of its own.
	// The node's own network interfaces in /sys: a sysfs mounted in the
	// node's network namespace, of which only the network directories
	// cover the host's (the rest of /sys, cgroups included, stays).
	sys := filepath.Join(dir, nd.Name+".sys")
	if err := os.MkdirAll(sys, 0o755); err != nil {
		return err
	}
	setup := fmt.Sprintf("hostname %s && mount -t tmpfs -o mode=1777,size=512m tmpfs /dev/shm && "+
		"mount -t sysfs sysfs %s && mount --bind %s/class/net /sys/class/net && "+
		"mount --bind %s/devices/virtual/net /sys/devices/virtual/net && "+
		"mount --bind %s/hosts /etc/hosts && echo ready && exec sleep 1000000", nd.Name, sys, sys, sys, dir)
	cmd := exec.Command("nsenter", "--net=/var/run/netns/"+nd.ns, "unshare", "--uts", "--ipc", "--pid", "--fork",
		"--mount-proc", "--mount", "--propagation", "private", "sh", "-c", setup)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	errf, err := os.Create(filepath.Join(dir, nd.Name+".err"))
	if err != nil {
		return err
	}
	defer errf.Close()
	cmd.Stderr = errf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("node %s: %w", nd.Name, err)
	}
	nd.hold = cmd
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		msg, _ := os.ReadFile(errf.Name())
		return fmt.Errorf("node %s: holder did not start: %q %v: %s", nd.Name, line, err, msg)
	}
	// The holder is the sleep below unshare (pid 1 inside the node).
	pid, err := holderOf(cmd.Process.Pid)
	if err != nil {
		return fmt.Errorf("node %s: %w", nd.Name, err)
	}
	nd.pid = pid
	return os.WriteFile(filepath.Join(dir, nd.Name+".pid"), []byte(strconv.Itoa(pid)), 0o644)
}

// Link joins nodes k1 and k2 directly with a veth pair named dev in both
// (a point-to-point link beside the bridge, as a second network of a real
// cluster), with MTU mtu and the addresses it returns (10.250.x.1/24 and
// .2/24). Jobs reach it through its name (AMGO_IFACE=dev, Open MPI's
// btl_tcp_if_include, UCX_NET_DEVICES). Close removes it with the nodes'
// namespaces.
func (c *Cluster) Link(k1, k2 int, dev string, mtu int) ([2]string, error) {
	sub := 250 - int(seq.Add(1))%200
	addrs := [2]string{fmt.Sprintf("10.250.%d.1", sub), fmt.Sprintf("10.250.%d.2", sub)}
	a, b := c.Nodes[k1].ns, c.Nodes[k2].ns
	if err := run("ip", "link", "add", dev, "netns", a, "mtu", strconv.Itoa(mtu), "type", "veth",
		"peer", "name", dev, "netns", b, "mtu", strconv.Itoa(mtu)); err != nil {
		return addrs, err
	}
	for i, ns := range []string{a, b} {
		if err := run("ip", "-n", ns, "addr", "add", addrs[i]+"/24", "dev", dev); err != nil {
			return addrs, err
		}
		if err := run("ip", "-n", ns, "link", "set", dev, "up"); err != nil {
			return addrs, err
		}
	}
	return addrs, nil
}

// holderOf finds the holder: the first child of pid (nsenter, which
// became unshare in place), which runs sh and then sleep, as the first
// process of the node's PID namespace.
func holderOf(pid int) (int, error) {
	for try := 0; try < 200; try++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if err != nil {
			return 0, err
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			return strconv.Atoi(f[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, fmt.Errorf("process %d has no child", pid)
}

// SetCPUs confines what the stand-in starts in node k from now on to the
// given CPUs (a taskset(1) list such as "0" or "2-3"), as if the node had
// only those cores; "" lifts it. Nodes share the host's CPUs by default,
// which makes a launcher that binds its ranks by their rank on the node
// put the ranks of every node on the same cores.
func (c *Cluster) SetCPUs(k int, cpus string) error {
	p := filepath.Join(c.Dir, c.Nodes[k].Name+".cpus")
	if cpus == "" {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	return os.WriteFile(p, []byte(cpus+"\n"), 0o644)
}

// Command returns a command that runs name with args in node k's
// namespaces, in the current directory.
func (c *Cluster) Command(k int, name string, args ...string) *exec.Cmd {
	wd, _ := os.Getwd()
	return exec.Command("nsenter", append([]string{"-t", strconv.Itoa(c.Nodes[k].pid), "-a", "-w" + wd, name}, args...)...)
}

// Kill ends every process of node k at once, as a node that fails does:
// its PID namespace's first process dies and the kernel kills the rest.
func (c *Cluster) Kill(k int) {
	if pid := c.Nodes[k].pid; pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// Reset ends every process of every node except its holder (what a job
// that hung or a launcher killed in the middle left behind), and waits until
// they are gone.
func (c *Cluster) Reset() error {
	for k := range c.Nodes {
		// kill -1 inside the node's PID namespace reaches all of its
		// processes but the namespace's first one (the holder) and the
		// shell itself.
		out, err := c.Command(k, "sh", "-c", "kill -KILL -1 2>/dev/null; true").CombinedOutput()
		if err != nil {
			return fmt.Errorf("cluster: reset %s: %v: %s", c.Nodes[k].Name, err, out)
		}
	}
	return nil
}

// Close kills every node's processes and removes the namespaces, links and
// bridge.
func (c *Cluster) Close() {
	for k, nd := range c.Nodes {
		c.Kill(k)
		if nd.hold != nil {
			_ = nd.hold.Process.Kill()
			_ = nd.hold.Wait()
		}
		_ = run("ip", "netns", "del", nd.ns)
	}
	_ = run("ip", "link", "del", c.Bridge)
}
