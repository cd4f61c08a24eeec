//go:build linux

package udp

import (
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/am/internal/reliable"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/am/transport/transporttest"
)

var jobSeq atomic.Int64

// openJob opens n udp transports in this process over loopback, each on its
// own goroutine (New fences).
func openJob(t testing.TB, n int, opts map[string]string) []*Transport {
	o := map[string]string{"iface": "127.0.0.1"}
	for k, v := range opts {
		o[k] = v
	}
	bs := transporttest.NewBootstraps(n, fmt.Sprintf("udptest-%d", jobSeq.Add(1)))
	ts := make([]*Transport, n)
	errs := make(chan error, n)
	for i := range bs {
		go func() {
			tr, err := open(bs[i], o)
			ts[i] = tr
			errs <- err
		}()
	}
	for range bs {
		require.NoError(t, <-errs)
	}
	t.Cleanup(func() {
		for _, tr := range ts {
			if tr != nil {
				tr.Close()
			}
		}
	})
	return ts
}

// wrapCfg are timers for loopback: round trips of microseconds.
var wrapCfg = reliable.Config{RTOMin: time.Millisecond, RTOInit: 2 * time.Millisecond, RTOMax: 50 * time.Millisecond,
	AckDelay: 100 * time.Microsecond}

// TestConformance runs the transport conformance suite over reliable.Wrap of
// udp on loopback, which is how package am uses it. The kernel loses
// datagrams only when a socket buffer overflows (WouldBlock and AllToAll
// provoke that); the layer recovers them.
func TestConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		raw := openJob(t, n, nil)
		ts := make([]transport.Transport, n)
		for r := range raw {
			w, err := reliable.Wrap(raw[r], wrapCfg, nil)
			require.NoError(t, err)
			ts[r] = w
		}
		return ts
	})
}

type rec struct {
	src  []int
	pkts [][]byte
}

func (r *rec) Deliver(src int, pkt []byte) {
	r.src = append(r.src, src)
	r.pkts = append(r.pkts, append([]byte(nil), pkt...))
}

// pollFor polls tr until it has delivered want packets or a second passes.
func pollFor(t *testing.T, tr *Transport, r *rec, want int) {
	deadline := time.Now().Add(time.Second)
	for len(r.pkts) < want && time.Now().Before(deadline) {
		_, err := tr.Poll(r, 16)
		require.NoError(t, err)
		require.NoError(t, tr.Wait(10*time.Millisecond))
	}
}

func TestSendPollRaw(t *testing.T) {
	ts := openJob(t, 2, nil)
	require.Equal(t, transport.Caps{Name: "udp", MaxPacket: MaxPacket, Wakeup: true, BufferBytes: BufferBytes}, ts[0].Caps())
	require.NotEqual(t, ts[0].Addr(), ts[1].Addr())
	require.True(t, strings.HasPrefix(ts[0].Addr(), "127.0.0.1:"))
	big := make([]byte, MaxPacket-3)
	for i := range big {
		big[i] = byte(i * 7)
	}
	require.NoError(t, ts[0].Send(1, []byte("abc"), big))
	require.NoError(t, ts[0].Send(0, []byte("self"), nil))
	require.NoError(t, ts[1].Send(0, nil, []byte("back")))
	var r0, r1 rec
	pollFor(t, ts[1], &r1, 1)
	pollFor(t, ts[0], &r0, 2)
	require.Equal(t, []int{0}, r1.src)
	require.Equal(t, append([]byte("abc"), big...), r1.pkts[0])
	require.ElementsMatch(t, []string{"self", "back"}, []string{string(r0.pkts[0]), string(r0.pkts[1])})
	require.ErrorIs(t, ts[0].Send(1, make([]byte, MaxPacket+1), nil), transport.ErrTooLarge)
	require.ErrorIs(t, ts[0].Send(2, nil, nil), transport.ErrPeer)
	require.ErrorIs(t, ts[0].Send(-1, nil, nil), transport.ErrPeer)
	st := ts[0].Stats()
	require.Equal(t, uint64(2), st.Sent)
	require.Equal(t, uint64(2), st.Received)
	require.Zero(t, st.Foreign+st.BadProof+st.Short+st.Misdirected)
	require.NoError(t, ts[1].Close())
	require.ErrorIs(t, ts[1].Send(0, []byte("x"), nil), transport.ErrClosed)
	_, err := ts[1].Poll(&r1, 1)
	require.ErrorIs(t, err, transport.ErrClosed)
	require.ErrorIs(t, ts[1].Wait(time.Millisecond), transport.ErrClosed)
	require.NoError(t, ts[1].Close())
}

// Datagrams from outside the job are dropped and counted, never delivered and
// never a panic: garbage, a truncated datagram, a wrong proof (another job's
// secret), a forged source rank, another destination, and a valid datagram
// replayed from an address that is not the claimed rank's.
func TestRejectsOutsiders(t *testing.T) {
	secret := hex.EncodeToString([]byte("0123456789abcdef"))
	ts := openJob(t, 2, map[string]string{"secret": secret})
	mac := mustProver(t, DeriveKey([]byte("0123456789abcdef")))
	other := mustProver(t, DeriveKey([]byte("another job's secret")))
	good := AppendDatagram(nil, mac, 0, 1, 7, []byte("hello"))

	// An outsider's socket, on loopback too.
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	dst, err := net.ResolveUDPAddr("udp4", ts[1].Addr())
	require.NoError(t, err)
	bad := [][]byte{
		[]byte("garbage"),
		make([]byte, 200),
		good[:len(good)-1],
		AppendDatagram(nil, other, 0, 1, 8, []byte("hello")),
		AppendDatagram(nil, mac, 5, 1, 9, []byte("hello")),
		AppendDatagram(nil, mac, 0, 0, 10, []byte("hello")),
		good, // valid, but not from rank 0's address
		{},
	}
	flipped := append([]byte(nil), good...)
	flipped[FrameHeader] ^= 1
	bad = append(bad, flipped)
	for _, d := range bad {
		_, err := c.WriteToUDP(d, dst)
		require.NoError(t, err)
	}
	// Then a real packet from rank 0, which must still get through.
	require.NoError(t, ts[0].Send(1, []byte("real"), nil))
	var r rec
	pollFor(t, ts[1], &r, 1)
	require.Len(t, r.pkts, 1)
	require.Equal(t, "real", string(r.pkts[0]))
	st := ts[1].Stats()
	require.Equal(t, uint64(1), st.Received)
	require.Equal(t, uint64(2), st.Short, "%+v", st)       // empty, "garbage"
	require.Equal(t, uint64(2), st.Foreign, "%+v", st)     // zeros (no magic), a valid datagram from the wrong address
	require.Equal(t, uint64(2), st.Misdirected, "%+v", st) // source 5, destination 0
	require.Equal(t, uint64(3), st.BadProof, "%+v", st)    // truncated by a byte, another secret, a flipped bit
}

// Ranks with different secrets cannot talk: each drops the other's datagrams.
func TestSecretMismatch(t *testing.T) {
	a := openJob(t, 1, map[string]string{"secret": hex.EncodeToString([]byte("secret-number-one"))})
	b := openJob(t, 1, map[string]string{"secret": hex.EncodeToString([]byte("secret-number-two"))})
	// Point a's rank 0 at b's socket: same rank numbers, another secret.
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	mac := mustProver(t, a[0].key)
	dst, _ := net.ResolveUDPAddr("udp4", b[0].Addr())
	_, err = c.WriteToUDP(AppendDatagram(nil, mac, 0, 0, 1, []byte("x")), dst)
	require.NoError(t, err)
	var r rec
	pollFor(t, b[0], &r, 1)
	require.Empty(t, r.pkts)
	require.Equal(t, uint64(1), b[0].Stats().BadProof)
}

func TestOptions(t *testing.T) {
	ts := openJob(t, 1, map[string]string{"max_packet": "1472", "buf_bytes": "256k", "spin": "0s", "iface": "lo"})
	require.Equal(t, 1472, ts[0].Caps().MaxPacket)
	for _, o := range []map[string]string{{"max_packet": "100"}, {"max_packet": "70000"}, {"buf_bytes": "x"},
		{"spin": "fast"}, {"port": "99999"}, {"secret": "abcd"}, {"iface": "0.0.0.0"}, {"iface": "no-such-if0"}} {
		o["iface"] = map[bool]string{true: o["iface"], false: "127.0.0.1"}[o["iface"] != ""]
		_, err := open(transporttest.NewBootstraps(1, "opts")[0], o)
		require.Error(t, err, "%v", o)
	}
}

func TestFactory(t *testing.T) {
	tr, err := transport.Open("udp", transporttest.NewBootstraps(1, "one")[0], map[string]string{"iface": "127.0.0.1"})
	require.NoError(t, err)
	require.Equal(t, "udp", tr.Caps().Name)
	require.False(t, tr.Caps().Ordered)
	require.False(t, tr.Caps().Reliable)
	require.NoError(t, tr.Close())
}

// The secret drawn by rank 0 reaches every rank through the key-value space.
func TestSecretFromRankZero(t *testing.T) {
	t.Setenv("AMGO_JOB_SECRET", "")
	ts := openJob(t, 3, nil)
	require.Equal(t, ts[0].key, ts[1].key)
	require.Equal(t, ts[0].key, ts[2].key)
}

func TestSendPollNoAllocs(t *testing.T) {
	ts := openJob(t, 2, nil)
	hdr, payload := make([]byte, 64), make([]byte, 100)
	r := &countRx{}
	allocs := testing.AllocsPerRun(500, func() {
		require.NoError(t, ts[0].Send(1, hdr, payload))
		for n := 0; n == 0; {
			n, _ = ts[1].Poll(r, 1)
		}
	})
	require.Zero(t, allocs)
}

type countRx struct{ n int }

func (c *countRx) Deliver(int, []byte) { c.n++ }

// IPv6 loopback works as IPv4 does (skipped where ::1 is missing).
func TestIPv6(t *testing.T) {
	if c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback}); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		c.Close()
	}
	ts := openJob(t, 2, map[string]string{"iface": "::1"})
	require.True(t, strings.HasPrefix(ts[0].Addr(), "[::1]:"), ts[0].Addr())
	require.NoError(t, ts[0].Send(1, []byte("v6"), nil))
	var r rec
	pollFor(t, ts[1], &r, 1)
	require.Len(t, r.pkts, 1)
	require.Equal(t, "v6", string(r.pkts[0]))
}

// The conformance suite with datagrams that fit a 1500-byte Ethernet MTU.
func TestConformanceSmallDatagrams(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		raw := openJob(t, n, map[string]string{"max_packet": "1436"})
		ts := make([]transport.Transport, n)
		for r := range raw {
			w, err := reliable.Wrap(raw[r], wrapCfg, nil)
			require.NoError(t, err)
			ts[r] = w
		}
		return ts
	})
}

// Wake ends a Wait in progress, and makes the next Wait return at once when
// no Wait is in progress (transport.Waker).
func TestWakeEndsWait(t *testing.T) {
	ts := openJob(t, 2, map[string]string{"spin": "0s"})
	defer ts[0].Close()
	defer ts[1].Close()
	transporttest.Wake(t, []transport.Transport{ts[0], ts[1]})
}

// mustProver is NewProver for tests.
func mustProver(t testing.TB, key []byte) *Prover {
	pr, err := NewProver(key)
	require.NoError(t, err)
	return pr
}
