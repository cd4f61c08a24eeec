//go:build linux

package xdp

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

// star is n network namespaces, each with one veth end (eth0) whose other
// end is a port of a bridge in a hub namespace: n hosts on one switch.
type star struct {
	hub   string
	ns    []string
	addrs []net.IP // each namespace's IPv4 address on its interface
	dev   string   // the interface's name inside every rank's namespace
}

var starSeq atomic.Int64

// skipUnlessRoot skips t, saying why, when namespaces and BPF are out of
// reach.
func skipUnlessRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, loads an XDP program and opens AF_XDP sockets")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("the ip command (iproute2) is missing")
	}
}

func ip(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newStar builds a star of n namespaces whose interfaces have MTU mtu;
// t.Cleanup removes it.
func newStar(t testing.TB, n, mtu int) *star {
	skipUnlessRoot(t)
	id := fmt.Sprintf("%d%d", os.Getpid()%100000, starSeq.Add(1))
	sub := starSeq.Load() % 250
	s := &star{hub: "axh" + id, dev: "eth0"}
	ip(t, "netns", "add", s.hub)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", s.hub).Run() })
	ip(t, "-n", s.hub, "link", "add", "br0", "type", "bridge")
	ip(t, "-n", s.hub, "link", "set", "br0", "mtu", fmt.Sprint(mtu), "up")
	for i := range n {
		ns := fmt.Sprintf("axr%s-%d", id, i)
		ip(t, "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		port := fmt.Sprintf("p%d", i)
		ip(t, "link", "add", s.dev, "netns", ns, "mtu", fmt.Sprint(mtu), "type", "veth", "peer", "name", port, "netns", s.hub, "mtu", fmt.Sprint(mtu))
		ip(t, "-n", s.hub, "link", "set", port, "master", "br0", "up")
		a := net.IPv4(10, 77, byte(sub), byte(i+1))
		ip(t, "-n", ns, "addr", "add", a.String()+"/24", "dev", s.dev)
		s.addrs = append(s.addrs, a)
		ip(t, "-n", ns, "link", "set", s.dev, "up")
		s.ns = append(s.ns, ns)
	}
	return s
}

// newPair builds two namespaces joined directly by a veth pair (no
// switch), as a star of two; t.Cleanup removes them.
func newPair(t testing.TB, mtu int) *star {
	skipUnlessRoot(t)
	id := fmt.Sprintf("%d%d", os.Getpid()%100000, starSeq.Add(1))
	sub := starSeq.Load() % 250
	s := &star{dev: "eth0"}
	for i := range 2 {
		ns := fmt.Sprintf("axp%s-%d", id, i)
		ip(t, "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		s.ns = append(s.ns, ns)
	}
	ip(t, "link", "add", s.dev, "netns", s.ns[0], "mtu", fmt.Sprint(mtu), "type", "veth", "peer", "name", s.dev, "netns", s.ns[1], "mtu", fmt.Sprint(mtu))
	for i, ns := range s.ns {
		a := net.IPv4(10, 78, byte(sub), byte(i+1))
		ip(t, "-n", ns, "addr", "add", a.String()+"/24", "dev", s.dev)
		ip(t, "-n", ns, "link", "set", s.dev, "up")
		s.addrs = append(s.addrs, a)
	}
	return s
}

// inNetns runs f on an OS thread that has joined namespace ns and is never
// handed back to the runtime (it exits with its goroutine), so nothing else
// runs in the namespace; sockets and links f makes stay in it.
func inNetns[T any](ns string, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		v, err := f()
		ch <- result{v, err}
	}()
	r := <-ch
	return r.v, r.err
}

// openStar opens one rank of an n-rank job in each namespace of a new
// star, concurrently (New fences); t.Cleanup closes them.
func openStar(t testing.TB, n, mtu int, opts map[string]string) []*Transport {
	_, ts := openStarNS(t, n, mtu, opts)
	return ts
}

// openStarNS is openStar that also returns the star.
func openStarNS(t testing.TB, n, mtu int, opts map[string]string) (*star, []*Transport) {
	ns := make([]int, n)
	for i := range ns {
		ns[i] = i
	}
	return openPlaced(t, n, mtu, ns, opts)
}

// openPlaced opens a job of len(place) ranks on a star of hosts
// namespaces, rank r in namespace place[r]; opts apply to every rank, and
// to rank r also opts["queue.<r>"] as its queue.
func openPlaced(t testing.TB, hosts, mtu int, place []int, opts map[string]string) (*star, []*Transport) {
	s, ts, err := tryPlaced(t, hosts, mtu, place, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, ts
}

// tryPlaced is openPlaced that returns the first rank's error.
func tryPlaced(t testing.TB, hosts, mtu int, place []int, opts map[string]string) (*star, []*Transport, error) {
	var s *star
	if opts["topology"] == "pair" {
		s = newPair(t, mtu)
	} else {
		s = newStar(t, hosts, mtu)
	}
	n := len(place)
	bs := transporttest.NewBootstraps(n, fmt.Sprintf("xdptest-%d", starSeq.Add(1)))
	ts := make([]*Transport, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			o := map[string]string{"iface": s.dev}
			for k, v := range opts {
				o[k] = v
			}
			if q, ok := opts[fmt.Sprintf("queue.%d", i)]; ok {
				o["queue"] = q
			}
			tr, err := inNetns(s.ns[place[i]], func() (*Transport, error) { return open(bs[i], o) })
			ts[i] = tr
			errs <- err
		}()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	t.Cleanup(func() {
		for _, tr := range ts {
			if tr != nil {
				tr.Close()
			}
		}
	})
	return s, ts, first
}
