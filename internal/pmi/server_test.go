package pmi

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rawRank is a test-side rank speaking raw text to a Server.
type rawRank struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
	done chan error
}

func serveRaw(t *testing.T, srv *Server, rank int) *rawRank {
	a, b := socketpair(t)
	rr := &rawRank{t: t, conn: b, r: bufio.NewReader(b), done: make(chan error, 1)}
	go func() { rr.done <- srv.Serve(rank, a) }()
	return rr
}

func (rr *rawRank) send(s string) {
	_, err := io.WriteString(rr.conn, s)
	require.NoError(rr.t, err)
}

func (rr *rawRank) recv() string {
	require.NoError(rr.t, rr.conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	s, err := rr.r.ReadString('\n')
	require.NoError(rr.t, err)
	return s
}

func (rr *rawRank) ask(q string) string {
	rr.send(q)
	return rr.recv()
}

type errLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errLog) add(_ int, err error) { l.mu.Lock(); l.errs = append(l.errs, err); l.mu.Unlock() }
func (l *errLog) n() int               { l.mu.Lock(); defer l.mu.Unlock(); return len(l.errs) }

// TestServerGolden checks the exact reply lines, formatted as MPICH-4 Hydra.
func TestServerGolden(t *testing.T) {
	var el errLog
	srv, err := NewServer(ServerConfig{Size: 1, KVSName: "kvs_42", OnError: el.add})
	require.NoError(t, err)
	rr := serveRaw(t, srv, 0)
	golden := [][2]string{
		{"cmd=init pmi_version=1 pmi_subversion=1\n", "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=2\n"},
		{"cmd=init pmi_version=1 pmi_subversion=2\n", "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=2\n"},
		{"cmd=get_maxes\n", "cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n"},
		{"cmd=get_appnum\n", "cmd=appnum rc=0 appnum=0\n"},
		{"cmd=get_universe_size\n", "cmd=universe_size rc=0 size=1\n"},
		{"cmd=get_my_kvsname\n", "cmd=my_kvsname rc=0 kvsname=kvs_42\n"},
		{"cmd=put kvsname=kvs_42 key=addr-0 value=/dev/shm/x\n", "cmd=put_result rc=0\n"},
		{"cmd=put kvsname=kvs_42 key=sp value=a\\ b\n", "cmd=put_result rc=0\n"},
		{"cmd=barrier_in\n", "cmd=barrier_out\n"},
		{"cmd=get kvsname=kvs_42 key=addr-0\n", "cmd=get_result rc=0 value=/dev/shm/x\n"},
		{"cmd=get kvsname=kvs_42 key=sp\n", "cmd=get_result rc=0 value=a\\ b\n"},
		{"cmd=get kvsname=kvs_42 key=nope\n", "cmd=get_result rc=1\n"},
	}
	for _, g := range golden {
		require.Equal(t, g[1], rr.ask(g[0]), g[0])
	}
	require.Equal(t, 0, el.n())

	// Errors get an error reply and the connection keeps working.
	bad := [][2]string{
		{"cmd=init pmi_version=2 pmi_subversion=0\n", "cmd=response_to_init rc=1 msg=unsupported_pmi_version\n"},
		{"hello\n", "cmd=error rc=1 msg=malformed_line\n"},
		{"cmd=\n", "cmd=error rc=1 msg=malformed_line\n"},
		{"cmd=frobnicate\n", "cmd=frobnicate_result rc=1 msg=unsupported_command\n"},
		{"cmd=publish_name service=s port=p\n", "cmd=publish_result rc=1 msg=unsupported_command\n"},
		{"mcmd=spawn\nnprocs=1\nexecname=x\nendcmd\n", "cmd=spawn_result rc=1 msg=spawn_not_supported\n"},
		{"cmd=put kvsname=other key=a value=b\n", "cmd=put_result rc=1 msg=unknown_kvsname\n"},
		{"cmd=put kvsname=kvs_42 key=a\n", "cmd=put_result rc=1 msg=missing_key_or_value\n"},
		{"cmd=put key=" + strings.Repeat("k", 65) + " value=b\n", "cmd=put_result rc=1 msg=key_or_value_too_long\n"},
		{"cmd=get kvsname=kvs_42\n", "cmd=get_result rc=1 msg=missing_key\n"},
		{"cmd=initack pmiid=0\n", "cmd=initack rc=1 msg=unexpected_initack\n"},
		{"cmd=x v=" + strings.Repeat("v", MaxLine) + "\n", "cmd=error rc=1 msg=line_too_long\n"},
	}
	for _, g := range bad {
		require.Equal(t, g[1], rr.ask(g[0]), g[0])
	}
	require.Equal(t, len(bad), el.n())
	require.Equal(t, "cmd=get_result rc=0 value=/dev/shm/x\n", rr.ask("cmd=get kvsname=kvs_42 key=addr-0\n"))
	require.Equal(t, "cmd=finalize_ack rc=0\n", rr.ask("cmd=finalize\n"))
	require.NoError(t, <-rr.done)
}

func TestServerBarrierAndAbort(t *testing.T) {
	aborts := make(chan [2]any, 1)
	srv, err := NewServer(ServerConfig{Size: 3, KVSName: "k", OnAbort: func(r, c int, m string) { aborts <- [2]any{r, m} }})
	require.NoError(t, err)
	rs := []*rawRank{serveRaw(t, srv, 0), serveRaw(t, srv, 1), serveRaw(t, srv, 2)}
	rs[0].send("cmd=barrier_in\n")
	rs[1].send("cmd=barrier_in\n")
	rs[0].send("cmd=barrier_in\n") // protocol error: already in the barrier
	require.Equal(t, "cmd=barrier_out rc=1 msg=already_in_barrier\n", rs[0].recv())
	rs[2].send("cmd=barrier_in\n")
	for _, r := range rs {
		require.Equal(t, "cmd=barrier_out\n", r.recv())
	}
	rs[1].send("cmd=abort exitcode=3 message=bad\\ input\n")
	select {
	case a := <-aborts:
		require.Equal(t, [2]any{1, "bad input"}, a)
	case <-time.After(5 * time.Second):
		t.Fatal("abort not reported")
	}
	// A rank that disconnects without finalize ends its Serve with nil.
	rs[2].conn.Close()
	require.NoError(t, <-rs[2].done)
}

func TestServerHandshake(t *testing.T) {
	srv, err := NewServer(ServerConfig{Size: 2, KVSName: "k"})
	require.NoError(t, err)
	rr := serveRaw(t, srv, -1)
	rr.send("cmd=initack pmiid=1\n")
	require.Equal(t, "cmd=initack\n", rr.recv())
	require.Equal(t, "cmd=set size=2\n", rr.recv())
	require.Equal(t, "cmd=set rank=1\n", rr.recv())
	require.Equal(t, "cmd=set debug=0\n", rr.recv())
	require.Equal(t, "cmd=universe_size rc=0 size=2\n", rr.ask("cmd=get_universe_size\n"))

	// The same rank twice is refused, and so is a bad handshake.
	rr2 := serveRaw(t, srv, 1)
	require.ErrorIs(t, <-rr2.done, ErrInvalid)
	rr3 := serveRaw(t, srv, -1)
	rr3.send("cmd=init pmi_version=1 pmi_subversion=1\n")
	require.ErrorIs(t, <-rr3.done, ErrProtocol)
}

func TestNewServerErrors(t *testing.T) {
	for _, cfg := range []ServerConfig{{Size: 0, KVSName: "k"}, {Size: 1}, {Size: 1, KVSName: "a b"}, {Size: 1, KVSName: strings.Repeat("k", 257)}} {
		_, err := NewServer(cfg)
		require.ErrorIs(t, err, ErrInvalid)
	}
}
