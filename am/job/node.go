package job

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/route"
)

// Environment variables of a job over several nodes.
const (
	// EnvNode names this process's node, overriding what NodeID finds
	// (tests emulate several nodes on one host with it).
	EnvNode = "AMGO_NODE"
	// EnvNet is the network between nodes when AMGO_TRANSPORT is unset:
	// tcp (the default) or udp.
	EnvNet = "AMGO_NET"
)

// NodeID identifies the node this process runs on, as far as shared memory
// and Cross Memory Attach are concerned: two processes with the same NodeID
// can map the same files of /dev/shm and read each other's memory. It is
// AMGO_NODE when set, else the kernel's boot id, the device and inode of the
// /dev/shm mount, and the inode of the PID namespace (CMA names its peer by
// process id), as "boot=...,shm=DEV:INO,pidns=INO". A host name alone is
// not enough: containers on one host may share a name and not memory, or
// the reverse. Errors: what reading /proc or stat(2) returns.
func NodeID() (string, error) {
	if v := os.Getenv(EnvNode); v != "" {
		return "node=" + v, nil
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("am: node identity: %w", err)
	}
	var shm, pidns unix.Stat_t
	if err := unix.Stat("/dev/shm", &shm); err != nil {
		return "", fmt.Errorf("am: node identity: /dev/shm: %w", err)
	}
	if err := unix.Stat("/proc/self/ns/pid", &pidns); err != nil {
		return "", fmt.Errorf("am: node identity: PID namespace: %w", err)
	}
	return fmt.Sprintf("boot=%s,shm=%d:%d,pidns=%d", strings.TrimSpace(string(boot)), shm.Dev, shm.Ino, pidns.Ino), nil
}

// Layout is where the ranks of a job run: Node[r] is rank r's node, numbered
// 0, 1, ... in the order of each node's lowest rank.
type Layout struct {
	Node []int
}

// Nodes is the number of nodes.
func (l Layout) Nodes() int {
	n := 0
	for _, k := range l.Node {
		n = max(n, k+1)
	}
	return n
}

// Ranks lists the ranks on node k, in order.
func (l Layout) Ranks(k int) []int {
	var rs []int
	for r, kk := range l.Node {
		if kk == k {
			rs = append(rs, r)
		}
	}
	return rs
}

// discover publishes this rank's node identity id (NodeID) through the
// bootstrap and reads everyone's: the job's layout. It costs one fence.
func discover(b transport.Bootstrap, id string) (Layout, error) {
	var err error
	if err := b.Put("amgo.node."+strconv.Itoa(b.Rank()), id); err != nil {
		return Layout{}, fmt.Errorf("am: publish the node identity: %w", err)
	}
	if err := b.Fence(); err != nil {
		return Layout{}, fmt.Errorf("am: fence after publishing the node identity: %w", err)
	}
	l := Layout{Node: make([]int, b.Size())}
	seen := map[string]int{}
	for r := range l.Node {
		v := id
		if r != b.Rank() {
			if v, err = b.Get("amgo.node." + strconv.Itoa(r)); err != nil {
				return Layout{}, fmt.Errorf("am: rank %d's node identity: %w", r, err)
			}
		}
		k, ok := seen[v]
		if !ok {
			k = len(seen)
			seen[v] = k
		}
		l.Node[r] = k
	}
	return l, nil
}

// nodeBoot is the bootstrap of the ranks of one node, as a job of their own
// (numbered in job order) for the node-local network: its keys are kept
// apart from the job's, and its fences are the job's (every rank opens the
// same networks in the same order, so every rank fences alike).
type nodeBoot struct {
	b      transport.Bootstrap
	ranks  []int
	me     int
	prefix string
}

func (n *nodeBoot) Rank() int                      { return n.me }
func (n *nodeBoot) Size() int                      { return len(n.ranks) }
func (n *nodeBoot) JobID() string                  { return n.b.JobID() + "-" + strings.TrimSuffix(n.prefix, ".") }
func (n *nodeBoot) Put(key, value string) error    { return n.b.Put(n.prefix+key, value) }
func (n *nodeBoot) Fence() error                   { return n.b.Fence() }
func (n *nodeBoot) Get(key string) (string, error) { return n.b.Get(n.prefix + key) }

// netSpin is how long a wait on network name spins before it sleeps in a
// job over that network alone: AMGO_<NAME>_SPIN when it is a duration, else
// 20 us (tcp's and udp's default). The routed job's caller polls on for as
// long while that network is hot (route.Net.Spin), since the network's own
// Wait runs with no spin there.
func netSpin(name string) time.Duration {
	if d, err := time.ParseDuration(os.Getenv("AMGO_" + strings.ToUpper(name) + "_SPIN")); err == nil && d >= 0 {
		return d
	}
	return 20 * time.Microsecond
}

// openRouted opens the networks of a job that spans several nodes: shm
// among the ranks of this node and AMGO_NET (tcp by default) among all, and
// routes each peer to its own (package route). With one node it opens shm
// alone.
func openRouted(b transport.Bootstrap, l Layout) (transport.Transport, error) {
	if l.Nodes() == 1 {
		return transport.Open("shm", b, nil)
	}
	between := os.Getenv(EnvNet)
	if between == "" {
		between = "tcp"
	}
	switch between {
	case "shm", "loop", "sim":
		return nil, fmt.Errorf("%w: %s=%s cannot reach other nodes (tcp, udp, xdp)", am.ErrConfig, EnvNet, between)
	}
	me := b.Rank()
	k := l.Node[me]
	mine := l.Ranks(k)
	nb := &nodeBoot{b: b, ranks: mine, prefix: "n" + strconv.Itoa(k) + "."}
	for i, r := range mine {
		if r == me {
			nb.me = i
		}
	}
	local, err := transport.Open("shm", nb, map[string]string{"prefix": nb.prefix})
	if err != nil {
		return nil, err
	}
	// Its Wait runs on route's waiter goroutine, beside a rank that may be
	// spinning on shared memory: it sleeps at once rather than spin.
	all, err := transport.Open(between, b, map[string]string{"spin": "0s"})
	if err != nil {
		_ = local.Close()
		return nil, err
	}
	var remote []int
	for r, kk := range l.Node {
		if kk != k {
			remote = append(remote, r)
		}
	}
	t, err := route.New(me, b.Size(), []route.Net{{T: local, Ranks: mine, Peers: mine},
		{T: all, Peers: remote, Spin: netSpin(between)}})
	if err != nil {
		_ = local.Close()
		_ = all.Close()
		return nil, err
	}
	return t, nil
}
