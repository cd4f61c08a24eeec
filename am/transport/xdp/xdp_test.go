//go:build linux

package xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

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
// of xdp, as package am uses it, with every rank in its own namespace: on
// a 1500-byte MTU (a frame per chunk) and on jumbo frames of 9000 (frames
// over several chunks, where the kernel has multi-buffer AF_XDP).
func TestConformance(t *testing.T) {
	skipUnlessRoot(t)
	for _, mtu := range []int{1500, 9000} {
		t.Run(fmt.Sprint("mtu", mtu), func(t *testing.T) { conformance(t, mtu) })
	}
}

func conformance(t *testing.T, mtu int) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		raw := openStar(t, n, mtu, nil)
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
// saying why, and leaves the first job's program in place.
func TestInterfaceTaken(t *testing.T) {
	s := newStar(t, 1, 1500)
	bs := transporttest.NewBootstraps(1, "first")
	first, err := inNetns(s.ns[0], func() (*Transport, error) { return open(bs[0], map[string]string{"iface": s.dev}) })
	require.NoError(t, err)
	defer first.Close()
	_, err = inNetns(s.ns[0], func() (*Transport, error) {
		return open(transporttest.NewBootstraps(1, "second")[0], map[string]string{"iface": s.dev})
	})
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "already has an XDP program")
}

// Ranks of one job on one interface share it: two ranks on each of two
// hosts, each rank sending to both ranks of the other host, every packet
// arriving at its rank, from the right rank, in order (the raw network may
// drop a packet when a receiving rank falls behind: am's reliability layer
// above recovers it, as the MPI jobs across nodes show); a rank on the same
// interface is a clear ErrPeer. Ranks of one interface that ask for
// different queues are refused, every rank returning (none waits for the
// others).
func TestRanksShareAnInterface(t *testing.T) {
	_, ts := openPlaced(t, 2, 1500, []int{0, 0, 1, 1}, nil)
	for _, tr := range ts {
		require.Equal(t, 2, tr.layout.k)
	}
	require.True(t, ts[0].leader)
	require.False(t, ts[1].leader)
	err := ts[0].Send(1, []byte("same host"), nil)
	require.ErrorIs(t, err, transport.ErrPeer)
	require.ErrorContains(t, err, "own interface")

	const per = 300
	remote := func(r int) []int { return []int{(r/2*2 + 2) % 4, (r/2*2+2)%4 + 1} }
	errs := make(chan error, 4)
	for r := range 4 {
		go func() {
			tr := ts[r]
			rx := &counter{next: map[int]int{}}
			msg := make([]byte, 16)
			sent, quiet := 0, time.Time{}
			for sent < 2*per || rx.n < 2*per {
				if sent < 2*per {
					dst := remote(r)[sent%2]
					binary.LittleEndian.PutUint64(msg, uint64(r))
					binary.LittleEndian.PutUint64(msg[8:], uint64(sent/2))
					switch err := tr.Send(dst, msg, nil); {
					case err == nil:
						sent++
					case !errors.Is(err, transport.ErrWouldBlock):
						errs <- err
						return
					}
				}
				n, err := tr.Poll(rx, 16)
				if err != nil {
					errs <- err
					return
				}
				if n > 0 || sent < 2*per {
					quiet = time.Now()
				} else if time.Since(quiet) > 500*time.Millisecond {
					break // the rest was lost
				}
			}
			for _, src := range remote(r) {
				if rx.next[src] == 0 {
					errs <- fmt.Errorf("rank %d: nothing from rank %d", r, src)
					return
				}
			}
			if rx.n < 2*per {
				t.Logf("rank %d: %d of %d packets arrived (%+v)", r, rx.n, 2*per, tr.Stats())
			}
			errs <- rx.err
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}

	_, _, err = tryPlaced(t, 1, 1500, []int{0, 0}, map[string]string{"queue.1": "1"})
	require.ErrorContains(t, err, "bind one queue")
}

// counter checks and counts packets that each carry their source rank and
// their number from that source: from the right source, and in order (each
// number above the last; a lost packet leaves a gap).
type counter struct {
	next map[int]int // the least number each source may send next
	n    int
	err  error
}

func (c *counter) Deliver(src int, pkt []byte) {
	if c.err != nil {
		return
	}
	if len(pkt) != 16 || int(binary.LittleEndian.Uint64(pkt)) != src {
		c.err = fmt.Errorf("packet %x from rank %d", pkt, src)
		return
	}
	k := int(binary.LittleEndian.Uint64(pkt[8:]))
	if k < c.next[src] {
		c.err = fmt.Errorf("packet %d from rank %d after %d", k, src, c.next[src]-1)
		return
	}
	c.next[src] = k + 1
	c.n++
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
	for _, c := range []struct {
		mode, topo string
		mtu        int
		sg         string
	}{{"generic", "switch", 1500, "on"}, {"driver", "switch", 1500, "on"}, {"generic", "pair", 1500, "on"}, {"driver", "pair", 1500, "on"},
		{"generic", "pair", 9000, "on"}, {"generic", "pair", 9000, "off"}} {
		b.Run(fmt.Sprintf("%s/%s/mtu%d/sg-%s", c.mode, c.topo, c.mtu, c.sg), func(b *testing.B) {
			_, ts := openPlaced(b, 2, c.mtu, []int{0, 1}, map[string]string{"mode": c.mode, "topology": c.topo, "sg": c.sg})
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

// What a rank publishes reads back, has no spaces (PMI-1 values cannot),
// and malformed values are refused.
func TestPeerInfo(t *testing.T) {
	p := peerInfo{mac: net.HardwareAddr{0x32, 0x29, 1, 0xbf, 0x3b, 0xf0}, mtu: 9000, queue: 3, sg: true}
	s := p.String()
	require.NotContains(t, s, " ")
	q, err := parsePeerInfo(s)
	require.NoError(t, err)
	require.Equal(t, p, q)
	for _, bad := range []string{"", "32:29:01:bf:3b:f0", "32:29:01:bf:3b_1500_0_1", "32:29:01:bf:3b:f0_x_0_1",
		"32:29:01:bf:3b:f0_1500_0", "32:29:01:bf:3b:f0_1500_0_2", "32:29:01:bf:3b:f0_1500_0_1_1"} {
		_, err := parsePeerInfo(bad)
		require.Error(t, err, bad)
	}
}

// A rank without a usable interface fails, and so do the others, rather
// than wait for it.
func TestRankWithoutInterface(t *testing.T) {
	s := newStar(t, 1, 1500)
	bs := transporttest.NewBootstraps(2, "noiface")
	errs := make(chan error, 2)
	for r, iface := range []string{s.dev, "lo"} {
		go func() {
			_, err := inNetns(s.ns[0], func() (*Transport, error) { return open(bs[r], map[string]string{"iface": iface}) })
			errs <- err
		}()
	}
	for range 2 {
		err := <-errs
		require.ErrorIs(t, err, ErrUnavailable)
	}
}

// BenchmarkStream is rank 0 sending 8-byte packets to rank 1 as fast as it
// can (rank 1 polls and counts): packets per second that arrive, with a
// kick per Send, and with runs of 32 Sends between Hold and Flush
// (transport.Batcher).
func BenchmarkStream(b *testing.B) {
	for _, run := range []int{1, 32} {
		b.Run(fmt.Sprintf("run-%d", run), func(b *testing.B) {
			ts := openStar(b, 2, 1500, nil)
			var rx transporttest.Last
			done := make(chan int)
			stop := make(chan struct{})
			go func() {
				n := 0
				for {
					select {
					case <-stop:
						done <- n
						return
					default:
					}
					k, _ := ts[1].Poll(&rx, 64)
					n += k
				}
			}()
			msg := make([]byte, 8)
			b.ResetTimer()
			for i := 0; i < b.N; {
				if run > 1 {
					ts[0].Hold()
				}
				for k := 0; k < run && i < b.N; {
					if err := ts[0].Send(1, msg, nil); err == nil {
						i++
						k++
					} else {
						ts[0].Poll(&rx, 1)
					}
				}
				if run > 1 {
					require.NoError(b, ts[0].Flush())
				}
				if i%64 == 0 {
					ts[0].Poll(&rx, 1)
				}
			}
			ts[0].Poll(&rx, 1)
			time.Sleep(10 * time.Millisecond)
			b.StopTimer()
			close(stop)
			n := <-done
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "pkts/s")
			b.ReportMetric(float64(b.N-n)/float64(b.N)*100, "%lost")
		})
	}
}

// Frames held between Hold and Flush leave at the Flush (or at a Poll),
// not before, and all arrive.
func TestHoldAndFlush(t *testing.T) {
	ts := openStar(t, 2, 1500, nil)
	ts[0].Hold()
	ts[0].Hold() // holds nest
	msg := make([]byte, 16)
	for i := range 5 {
		binary.LittleEndian.PutUint64(msg[8:], uint64(i))
		require.NoError(t, ts[0].Send(1, msg, nil))
	}
	time.Sleep(20 * time.Millisecond)
	var rx transporttest.Last
	n, err := ts[1].Poll(&rx, 16)
	require.NoError(t, err)
	require.Zero(t, n, "held frames left before the Flush")
	require.NoError(t, ts[0].Flush())
	time.Sleep(20 * time.Millisecond)
	n, err = ts[1].Poll(&rx, 16)
	require.NoError(t, err)
	require.Zero(t, n, "frames left at the inner Flush")
	require.NoError(t, ts[0].Flush())
	c := &counter{next: map[int]int{}}
	require.NoError(t, transporttest.PollFor(ts[1], c, false, func() (bool, error) { return c.n == 5, nil }))
}

// Jumbo frames: on a 9000-byte MTU with multi-buffer AF_XDP, MaxPacket is
// 8964 and packets of every size up to it (one, two and three chunks) and
// of both ranks on an interface arrive intact; with multi-buffer off
// (AMGO_XDP_SG=off) MaxPacket stays within one chunk.
func TestJumboFrames(t *testing.T) {
	if !multiBuffer() {
		t.Skip("the kernel has no multi-buffer AF_XDP (Linux 6.6)")
	}
	_, ts := openPlaced(t, 2, 9000, []int{0, 0, 1}, nil)
	require.Equal(t, 9000+EthHeader-Overhead, ts[0].Caps().MaxPacket)
	require.Equal(t, sgChunks, ts[0].layout.span)
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1, 3000, 4096 - EthHeader - Overhead, 4096 - EthHeader - Overhead + 1, 8000, ts[0].Caps().MaxPacket}
	for range 40 {
		sizes = append(sizes, 1+rng.IntN(ts[0].Caps().MaxPacket))
	}
	for _, src := range []int{0, 1} {
		var rx transporttest.Last
		for _, n := range sizes {
			pkt := make([]byte, n)
			for i := range pkt {
				pkt[i] = byte(rng.Uint32())
			}
			require.NoError(t, transporttest.SendRetry(ts[src], 2, pkt[:min(n, 16)], pkt[min(n, 16):], nil))
			require.NoError(t, transporttest.RecvOne(ts[2], &rx, false))
			require.Equal(t, src, rx.Src)
			require.Equal(t, pkt, rx.Buf, "%d bytes from rank %d", n, src)
			require.NoError(t, transporttest.SendRetry(ts[2], src, pkt, nil, nil))
			require.NoError(t, transporttest.RecvOne(ts[src], &rx, false))
			require.Equal(t, pkt, rx.Buf, "%d bytes to rank %d", n, src)
		}
	}
	_, small := openPlaced(t, 2, 9000, []int{0, 1}, map[string]string{"sg": "off"})
	require.Equal(t, maxFrame-Overhead, small[0].Caps().MaxPacket)
}
