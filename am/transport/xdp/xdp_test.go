//go:build linux

package xdp

import (
	"net"

	"golang.org/x/sys/unix"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/internal/reliable"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

// Two ranks in two namespaces exchange packets both ways.
func TestPingPong(t *testing.T) {
	ts := openStar(t, 2, 1500, nil)
	name, q, mode, zc := ts[0].Interface()
	t.Logf("interface %s queue %d, %s mode, zero-copy %v, MaxPacket %d", name, q, mode, zc, ts[0].Caps().MaxPacket)
	done := make(chan error, 1)
	go func() { done <- transporttest.PingPong(ts[1], 0, 1000, false) }()
	require.NoError(t, transporttest.PingPong(ts[0], 0, 1000, false))
	require.NoError(t, <-done)
	t.Logf("rank 0: %+v", ts[0].Stats())
}

// wrapCfg are timers for a veth: round trips of microseconds.
var wrapCfg = reliable.Config{RTOMin: time.Millisecond, RTOInit: 2 * time.Millisecond, RTOMax: 50 * time.Millisecond,
	AckDelay: 100 * time.Microsecond}

// TestConformance runs the transport conformance suite over reliable.Wrap
// of xdp, as package am uses it, with every rank in its own namespace.
func TestConformance(t *testing.T) {
	skipUnlessRoot(t)
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		raw := openStar(t, n, 1500, nil)
		ts := make([]transport.Transport, n)
		for r := range raw {
			w, err := reliable.Wrap(raw[r], wrapCfg, nil)
			require.NoError(t, err)
			ts[r] = w
		}
		return ts
	})
}

// Options with bad values are refused before anything is opened.
func TestBadOptions(t *testing.T) {
	for _, o := range []map[string]string{
		{"queue": "-1"}, {"queue": "999"}, {"queue": "x"},
		{"mode": "turbo"}, {"ethertype": "0x0800x"}, {"ethertype": "0x05ff"}, {"spin": "fast"},
	} {
		_, err := New(nil1{}, o)
		require.Error(t, err, "%v", o)
	}
}

// nil1 is the bootstrap of a job of one rank that must not be used.
type nil1 struct{}

func (nil1) Rank() int                  { return 0 }
func (nil1) Size() int                  { return 1 }
func (nil1) JobID() string              { return "nil" }
func (nil1) Put(string, string) error   { panic("unused") }
func (nil1) Fence() error               { panic("unused") }
func (nil1) Get(string) (string, error) { panic("unused") }

// A second job on an interface that already carries one fails at once,
// saying why, and leaves the first job's program in place; two ranks of one
// job on one interface and queue are refused likewise.
func TestInterfaceTaken(t *testing.T) {
	s := newStar(t, 2, 1500)
	bs := transporttest.NewBootstraps(1, "first")
	first, err := inNetns(s.ns[0], func() (*Transport, error) { return open(bs[0], map[string]string{"iface": s.dev}) })
	require.NoError(t, err)
	defer first.Close()
	_, err = inNetns(s.ns[0], func() (*Transport, error) {
		return open(transporttest.NewBootstraps(1, "second")[0], map[string]string{"iface": s.dev})
	})
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "already has an XDP program")

	two := transporttest.NewBootstraps(2, "shared")
	errs := make(chan error, 2)
	for r := range 2 {
		go func() {
			_, err := inNetns(s.ns[1], func() (*Transport, error) { return open(two[r], map[string]string{"iface": s.dev}) })
			errs <- err
		}()
	}
	for range 2 {
		err := <-errs
		require.ErrorIs(t, err, ErrUnavailable)
		require.ErrorContains(t, err, "one rank per interface and queue")
	}
}

// Frames of amgo's EtherType that are not the job's (forged, from another
// job, from an interface that is not the claimed rank's) are dropped and
// counted, and the rest of the hosts' traffic (ARP, IPv4) passes the XDP
// program untouched.
func TestForeignFramesAndOtherTraffic(t *testing.T) {
	s, ts := openStarNS(t, 2, 1500, nil)
	// A forged frame, and one proved under another secret, from a raw
	// packet socket in rank 1's namespace.
	other := mustProver(t, "another job's secret")
	frames := [][]byte{appendFrame(other, 1, 0, 1, []byte("x")), appendFrame(ts[0].pr, 1, 0, 2, []byte("y"))}
	for _, f := range frames {
		copy(f[0:6], ts[0].mac)
		copy(f[6:12], ts[1].mac)
	}
	frames[1][len(frames[1])-1] ^= 1 // a forgery: the proof is wrong
	_, err := inNetns(s.ns[1], func() (struct{}, error) {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return struct{}{}, err
		}
		defer unix.Close(fd)
		for _, f := range frames {
			if err := unix.Sendto(fd, f, 0, &unix.SockaddrLinklayer{Ifindex: ts[1].ifindex, Halen: 6}); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	})
	require.NoError(t, err)
	var rx transporttest.Last
	deadline := time.Now().Add(5 * time.Second)
	for ts[0].Stats().BadProof < 2 && time.Now().Before(deadline) {
		_, err := ts[0].Poll(&rx, 8)
		require.NoError(t, err)
	}
	st := ts[0].Stats()
	require.EqualValues(t, 2, st.BadProof, "%+v", st)
	require.Zero(t, st.Received)

	// UDP between the namespaces, through ARP, with both programs attached.
	srv, err := inNetns(s.ns[1], func() (*net.UDPConn, error) {
		return net.ListenUDP("udp4", &net.UDPAddr{IP: s.addrs[1]})
	})
	require.NoError(t, err)
	defer srv.Close()
	cli, err := inNetns(s.ns[0], func() (*net.UDPConn, error) {
		return net.DialUDP("udp4", nil, srv.LocalAddr().(*net.UDPAddr))
	})
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.Write([]byte("ping"))
	require.NoError(t, err)
	require.NoError(t, srv.SetReadDeadline(time.Now().Add(5*time.Second)))
	buf := make([]byte, 16)
	k, _, err := srv.ReadFromUDP(buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf[:k]))
}

// BenchmarkPingPong is the round trip of 8-byte packets between two ranks
// in two namespaces on one switch, both busy-polling, with the program
// attached in each mode; ns/halfrtt is half of it.
func BenchmarkPingPong(b *testing.B) {
	for _, mode := range []string{"generic", "driver"} {
		b.Run(mode, func(b *testing.B) {
			ts := openStar(b, 2, 1500, map[string]string{"mode": mode})
			done := make(chan error, 1)
			go func() { done <- transporttest.PingPong(ts[1], 0, b.N+100, false) }()
			require.NoError(b, transporttest.PingPong(ts[0], 0, 100, false))
			b.ResetTimer()
			require.NoError(b, transporttest.PingPong(ts[0], 100, b.N, false))
			b.StopTimer()
			require.NoError(b, <-done)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "ns/halfrtt")
		})
	}
}
