package nettest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/internal/launch"
	"github.com/amgo-hpc/amgo/mpiam"
)

// Environment of the helper roles the test binary plays.
const (
	envRole  = "AMGO_NETTEST_ROLE"  // "spawn": pick the rank's namespace and re-exec; "rank": run the MPI job
	envNS    = "AMGO_NETTEST_NS"    // namespaces by rank, comma-separated
	envAddrs = "AMGO_NETTEST_ADDRS" // veth addresses by rank, comma-separated
	envProg  = "AMGO_NETTEST_PROG"  // the program a rank runs, when not this test binary
)

func TestMain(m *testing.M) {
	switch os.Getenv(envRole) {
	case "spawn":
		spawn()
	case "rank":
		if err := rankMain(); err != nil {
			fmt.Fprintf(os.Stderr, "nettest: rank %s: %v\n", os.Getenv("PMI_RANK"), err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// spawn runs as the launcher's rank process: it replaces itself with
// `ip netns exec NS <program>` in the rank's namespace, with AMGO_IFACE set
// to the rank's veth address; the program is $AMGO_NETTEST_PROG, else this
// test binary in its rank role. The PMI socket (fd 3) stays open across both execs.
func spawn() {
	rank, err := strconv.Atoi(os.Getenv("PMI_RANK"))
	nss, addrs := strings.Split(os.Getenv(envNS), ","), strings.Split(os.Getenv(envAddrs), ",")
	if err != nil || rank < 0 || rank >= len(nss) || rank >= len(addrs) {
		fmt.Fprintf(os.Stderr, "nettest: spawn: bad PMI_RANK %q for %v\n", os.Getenv("PMI_RANK"), nss)
		os.Exit(2)
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		fmt.Fprintln(os.Stderr, "nettest: spawn:", err)
		os.Exit(2)
	}
	prog := os.Getenv(envProg)
	if prog == "" {
		if prog, err = os.Executable(); err != nil {
			fmt.Fprintln(os.Stderr, "nettest: spawn:", err)
			os.Exit(2)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envRole+"=") && !strings.HasPrefix(kv, "AMGO_IFACE=") {
			env = append(env, kv)
		}
	}
	env = append(env, envRole+"=rank", "AMGO_IFACE="+addrs[rank])
	err = syscall.Exec(ip, []string{"ip", "netns", "exec", nss[rank], prog}, env)
	fmt.Fprintln(os.Stderr, "nettest: spawn: exec:", err)
	os.Exit(2)
}

// rankMain is one rank of the job: a ring, then a 64 MiB exchange, every byte checked.
func rankMain() error {
	w, err := mpiam.Init(mpiam.Config{})
	if err != nil {
		return err
	}
	n, me := w.Size(), w.Rank()
	to, from := (me+1)%n, (me+n-1)%n
	// Ring: a token around the ranks, a few laps.
	for lap := 0; lap < 20; lap++ {
		out := []int64{int64(lap*n + me)}
		in := make([]int64, 1)
		if _, err := mpiam.Sendrecv(w, out, to, 1, in, from, 1); err != nil {
			return fmt.Errorf("ring lap %d: %w", lap, err)
		}
		if in[0] != int64(lap*n+from) {
			return fmt.Errorf("ring lap %d: got %d from rank %d", lap, in[0], from)
		}
	}
	// 64 MiB each way.
	const size = 64 << 20
	out, in := fill(size, me), make([]byte, size)
	start := time.Now()
	if _, err := mpiam.Sendrecv(w, out, to, 2, in, from, 2); err != nil {
		return fmt.Errorf("64 MiB exchange: %w", err)
	}
	took := time.Since(start)
	if want := fill(size, from); !bytes.Equal(in, want) {
		i := 0
		for in[i] == want[i] {
			i++
		}
		return fmt.Errorf("64 MiB exchange: byte %d from rank %d is %#x, want %#x", i, from, in[i], want[i])
	}
	if err := mpiam.Finalize(w); err != nil {
		return err
	}
	fmt.Printf("nettest: rank %d: ring and 64 MiB exchange OK over %s in %v\n", me, os.Getenv("AMGO_TRANSPORT"), took.Round(time.Millisecond))
	return nil
}

// fill returns n bytes that depend on seed and position.
func fill(n, seed int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(seed), 7))
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	return b
}

var seq atomic.Int64

// pair is two rank namespaces, each with a veth whose other end is a port
// of a bridge in a third, hub namespace: two hosts on one switch. Loss is
// injected where frames enter the switch (TCX ingress of the hub's ports),
// which every network's frames pass: an XDP program on a rank's own
// interface takes xdp's frames before TCX ingress there would see them.
type pair struct {
	hub   string
	ns    [2]string
	dev   [2]string // each rank's interface
	ports [2]string // the hub's ends
	addrs [2]string
}

func run(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newPair makes the namespaces, the bridge and the veth pairs, addresses
// 10.213.x.1/24 and .2/24 inside the rank namespaces only, links up, an MTU
// that carries a whole UDP datagram; t.Cleanup deletes the namespaces (and
// with them the links).
func newPair(t *testing.T) *pair {
	k := seq.Add(1)
	id := fmt.Sprintf("%d%d", os.Getpid()%100000, k)
	sub := (os.Getpid() + int(k)) % 250
	p := &pair{
		hub:   "amgoH" + id,
		ns:    [2]string{"amgoA" + id, "amgoB" + id},
		dev:   [2]string{"vA" + id, "vB" + id},
		ports: [2]string{"pA" + id, "pB" + id},
		addrs: [2]string{fmt.Sprintf("10.213.%d.1", sub), fmt.Sprintf("10.213.%d.2", sub)},
	}
	for _, ns := range append([]string{p.hub}, p.ns[:]...) {
		run(t, "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	}
	run(t, "-n", p.hub, "link", "add", "br0", "type", "bridge")
	run(t, "-n", p.hub, "link", "set", "br0", "mtu", "65535", "up")
	for i := range 2 {
		run(t, "link", "add", p.dev[i], "netns", p.ns[i], "mtu", "65535", "type", "veth", "peer", "name", p.ports[i], "netns", p.hub, "mtu", "65535")
		run(t, "-n", p.hub, "link", "set", p.ports[i], "master", "br0", "up")
		run(t, "-n", p.ns[i], "addr", "add", p.addrs[i]+"/24", "dev", p.dev[i])
		run(t, "-n", p.ns[i], "link", "set", p.dev[i], "up")
		run(t, "-n", p.ns[i], "link", "set", "lo", "up")
	}
	return p
}

// lossProgram is the TCX ingress program: an IPv4 frame or one of xdp's
// (EtherType 0x88B5) is dropped when bpf_get_prandom_u32() & 0xffff falls
// below 5% of 0x10000, and the drop is counted in slot 0 of drops;
// everything else (ARP included) passes.
func lossProgram(drops *ebpf.Map) asm.Instructions {
	const (
		skbProtocol = 16     // offsetof(struct __sk_buff, protocol)
		ethPIPBE    = 0x0008 // htons(ETH_P_IP) as a little-endian load sees it
		ethPXDPBE   = 0xB588 // htons(0x88B5), xdp's EtherType, likewise
		threshold   = 3277   // 5% of 0x10000
		tcxPass     = 0      // TCX_PASS
		tcxDrop     = 2      // TCX_DROP
	)
	return asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, skbProtocol, asm.Word),
		asm.JEq.Imm(asm.R2, ethPIPBE, "lossy"),
		asm.JNE.Imm(asm.R2, ethPXDPBE, "pass"),
		asm.FnGetPrandomU32.Call().WithSymbol("lossy"),
		asm.And.Imm(asm.R0, 0xffff),
		asm.JGE.Imm(asm.R0, threshold, "pass"),
		// drops[0] += 1
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, drops.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "drop"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, tcxDrop).WithSymbol("drop"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcxPass).WithSymbol("pass"),
		asm.Return(),
	}
}

// attachLoss loads the loss program and attaches it to TCX ingress of the
// hub's ports, where each rank's frames enter the switch. It skips t when BPF or TCX is not permitted.
func attachLoss(t *testing.T, p *pair) *ebpf.Map {
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Skipf("BPF not permitted: %v", err)
	}
	drops, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Skipf("BPF not permitted: create map: %v", err)
	}
	t.Cleanup(func() { drops.Close() })
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: lossProgram(drops)})
	if err != nil {
		t.Skipf("BPF not permitted: load program: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	for i := range 2 {
		l, err := inNetns(p.hub, func() (link.Link, error) {
			ifc, err := net.InterfaceByName(p.ports[i])
			if err != nil {
				return nil, err
			}
			return link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: prog, Attach: ebpf.AttachTCXIngress})
		})
		if err != nil {
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) || errors.Is(err, ebpf.ErrNotSupported) {
				t.Skipf("TCX not available: attach to %s: %v", p.ports[i], err)
			}
			t.Fatalf("attach to %s in %s: %v", p.ports[i], p.hub, err)
		}
		t.Cleanup(func() { l.Close() })
	}
	return drops
}

// inNetns runs f on an OS thread that has joined namespace ns (interface
// indexes are per namespace). The thread is never returned to the runtime's
// pool: it exits with the goroutine (runtime.LockOSThread without Unlock), so
// no other goroutine runs in the namespace.
func inNetns(ns string, f func() (link.Link, error)) (link.Link, error) {
	type result struct {
		l   link.Link
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		fd, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		l, err := f()
		ch <- result{l, err}
	}()
	r := <-ch
	return r.l, r.err
}

func dropCount(t *testing.T, m *ebpf.Map) uint64 {
	var v uint64
	if err := m.Lookup(uint32(0), &v); err != nil {
		t.Fatalf("read drop counter: %v", err)
	}
	return v
}

// skipUnlessNetns skips t, saying why, when namespaces cannot be made here.
func skipUnlessNetns(t *testing.T) {
	if testing.Short() {
		t.Skip("sets up namespaces and launches jobs")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and loads BPF")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("the ip command (iproute2) is missing")
	}
}

// runJob launches prog (the test binary when "") as a job of two ranks, one
// in each namespace of p, over network nw, and returns its output.
func runJob(t *testing.T, p *pair, nw, prog string) string {
	t.Helper()
	if !registered(nw) {
		t.Skipf("no %s transport in this build", nw)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	env := append(os.Environ(), envRole+"=spawn", envProg+"="+prog,
		envNS+"="+strings.Join(p.ns[:], ","), envAddrs+"="+strings.Join(p.addrs[:], ","))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err = launch.Run(ctx, launch.Spec{N: 2, Prog: self, Transport: nw, Env: env,
		Stdout: &out, Stderr: &out, Timeout: 4 * time.Minute})
	if err != nil {
		t.Fatalf("job over %s: %v\n%s", nw, err, out.String())
	}
	return out.String()
}

// An MPI job of two ranks, one per namespace, across a switch that drops 5%
// of IPv4 frames and of xdp's frames each way: a ring and a 64 MiB
// exchange, verified, over tcp (the kernel retransmits), udp and xdp (am's
// reliability layer does).
func TestLossyVeth(t *testing.T) {
	skipUnlessNetns(t)
	p := newPair(t)
	drops := attachLoss(t, p)
	for _, nw := range []string{"tcp", "udp", "xdp"} {
		t.Run(nw, func(t *testing.T) {
			before := dropCount(t, drops)
			start := time.Now()
			out := runJob(t, p, nw, "")
			got := dropCount(t, drops) - before
			t.Logf("%s: %v, %d frames dropped by the TCX program\n%s", nw, time.Since(start).Round(time.Millisecond), got, out)
			for r := range 2 {
				want := fmt.Sprintf("nettest: rank %d: ring and 64 MiB exchange OK over %s", r, nw)
				if !strings.Contains(out, want) {
					t.Errorf("missing %q", want)
				}
			}
			if got == 0 {
				t.Errorf("the TCX program dropped nothing: the test did not run on a lossy network")
			}
		})
	}
}

// The MPI semantics checks (point-to-point, collectives, one-sided) pass
// over every network between two namespaces on the lossy switch.
func TestChecksAcrossLossyVeth(t *testing.T) {
	skipUnlessNetns(t)
	p := newPair(t)
	drops := attachLoss(t, p)
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir+"/", "../../mpiam/internal/p2pcheck",
		"../../mpiam/internal/collcheck", "../../mpiam/internal/rmacheck").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	before := dropCount(t, drops)
	for _, nw := range []string{"tcp", "udp", "xdp"} {
		for _, prog := range []string{"p2pcheck", "collcheck", "rmacheck"} {
			t.Run(nw+"/"+prog, func(t *testing.T) {
				out := runJob(t, p, nw, filepath.Join(dir, prog))
				if want := prog + ": 2 ranks: OK"; !strings.Contains(out, want) {
					t.Errorf("missing %q in\n%s", want, out)
				}
			})
		}
	}
	if dropCount(t, drops) == before {
		t.Errorf("the TCX program dropped nothing: the checks did not run on a lossy network")
	}
}

// registered reports whether this binary's am knows network name.
func registered(name string) bool {
	for _, n := range transport.Names() {
		if n == name {
			return true
		}
	}
	return false
}
