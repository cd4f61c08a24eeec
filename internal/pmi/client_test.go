package pmi

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// socketpair returns two connected AF_UNIX stream sockets as net.Conns.
func socketpair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "sp")
		c, err := net.FileConn(f)
		require.NoError(t, err)
		f.Close()
		t.Cleanup(func() { c.Close() })
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// startJob starts a Server for n ranks and connects a Client per rank.
func startJob(t *testing.T, n int, cfg ServerConfig) (*Server, []*Client, *sync.WaitGroup) {
	t.Helper()
	cfg.Size = n
	if cfg.KVSName == "" {
		cfg.KVSName = "kvs_test"
	}
	srv, err := NewServer(cfg)
	require.NoError(t, err)
	var wg sync.WaitGroup
	clients := make([]*Client, n)
	errs := make([]error, n)
	var cwg sync.WaitGroup
	for r := 0; r < n; r++ {
		a, b := socketpair(t)
		wg.Add(1)
		go func() { defer wg.Done(); _ = srv.Serve(r, a) }()
		cwg.Add(1)
		go func() { defer cwg.Done(); clients[r], errs[r] = NewClient(b, r, n) }()
	}
	cwg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return srv, clients, &wg
}

func TestClientServerJob(t *testing.T) {
	const n = 5
	_, clients, wg := startJob(t, n, ServerConfig{AppNum: 0})
	var rwg sync.WaitGroup
	errs := make(chan error, n)
	for r, c := range clients {
		require.Equal(t, r, c.Rank())
		require.Equal(t, n, c.Size())
		require.Equal(t, "kvs_test", c.JobID())
		require.Equal(t, DefaultMaxes, c.Maxes())
		require.Equal(t, 0, c.AppNum())
		v, sv := c.Version()
		require.Equal(t, [2]int{1, 2}, [2]int{v, sv})
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			errs <- func() error {
				for round := 0; round < 3; round++ {
					if err := c.Put(fmt.Sprintf("r%d-%d", c.Rank(), round), fmt.Sprintf("v %d\\%d", c.Rank(), round)); err != nil {
						return err
					}
					if err := c.Fence(); err != nil {
						return err
					}
					for p := 0; p < n; p++ {
						v, err := c.Get(fmt.Sprintf("r%d-%d", p, round))
						if err != nil {
							return err
						}
						if v != fmt.Sprintf("v %d\\%d", p, round) {
							return fmt.Errorf("rank %d got %q from %d", c.Rank(), v, p)
						}
					}
					if err := c.Fence(); err != nil {
						return err
					}
				}
				return c.Finalize()
			}()
		}()
	}
	rwg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	wg.Wait()
	// After Finalize everything fails with ErrClosed; a second Finalize is fine.
	require.ErrorIs(t, clients[0].Put("a", "b"), ErrClosed)
	require.ErrorIs(t, clients[0].Fence(), ErrClosed)
	_, err := clients[0].Get("a")
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, clients[0].Finalize())
}

func TestBarrierWaitsForAll(t *testing.T) {
	_, clients, _ := startJob(t, 3, ServerConfig{})
	done := make(chan int, 3)
	for r := 0; r < 2; r++ {
		go func() { require.NoError(t, clients[r].Fence()); done <- r }()
	}
	select {
	case r := <-done:
		t.Fatalf("rank %d left the barrier before rank 2 entered", r)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, clients[2].Fence())
	<-done
	<-done
}

func TestClientErrors(t *testing.T) {
	_, clients, _ := startJob(t, 1, ServerConfig{})
	c := clients[0]
	_, err := c.Get("missing")
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, c.Put(strings.Repeat("k", 65), "v"), ErrTooLong)
	require.NoError(t, c.Put(strings.Repeat("k", 64), strings.Repeat("v", 1024)))
	require.ErrorIs(t, c.Put("k", strings.Repeat("v", 1025)), ErrTooLong)
	_, err = c.Get(strings.Repeat("k", 65))
	require.ErrorIs(t, err, ErrTooLong)
	for _, k := range []string{"", "a b", "a=b", "a\nb", "a\\b"} {
		require.ErrorIs(t, c.Put(k, "v"), ErrInvalid, "%q", k)
	}
	require.ErrorIs(t, c.Put("k", "a\nb"), ErrInvalid)
	// The client still works after argument errors.
	require.NoError(t, c.Fence())
	v, err := c.Get(strings.Repeat("k", 64))
	require.NoError(t, err)
	require.Len(t, v, 1024)
	require.NoError(t, c.Finalize())
}

func TestAbortReported(t *testing.T) {
	type ab struct {
		rank, code int
		msg        string
	}
	got := make(chan ab, 1)
	_, clients, _ := startJob(t, 2, ServerConfig{OnAbort: func(r, c int, m string) { got <- ab{r, c, m} }})
	require.NoError(t, clients[1].Abort(7, "out of\nmemory"))
	select {
	case a := <-got:
		require.Equal(t, ab{1, 7, "out of memory"}, a)
	case <-time.After(5 * time.Second):
		t.Fatal("abort not reported")
	}
	require.ErrorIs(t, clients[1].Put("a", "b"), ErrClosed)
}

func TestSingleton(t *testing.T) {
	c := Singleton()
	require.True(t, c.IsSingleton())
	require.Equal(t, 0, c.Rank())
	require.Equal(t, 1, c.Size())
	require.Equal(t, "singleton_"+strconv.Itoa(os.Getpid()), c.JobID())
	require.NoError(t, c.Put("a", "1"))
	_, err := c.Get("a")
	require.ErrorIs(t, err, ErrNotFound, "visible only after Fence")
	require.NoError(t, c.Fence())
	v, err := c.Get("a")
	require.NoError(t, err)
	require.Equal(t, "1", v)
	require.ErrorIs(t, c.Put("k", strings.Repeat("v", 1025)), ErrTooLong)
	require.NoError(t, c.Finalize())
	require.ErrorIs(t, c.Fence(), ErrClosed)
}

func clearPMIEnv(t *testing.T) {
	for _, k := range []string{"PMI_FD", "PMI_PORT", "PMI_ID", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "PMIX_NAMESPACE"} {
		t.Setenv(k, "")
	}
}

func TestFromEnvSingleton(t *testing.T) {
	clearPMIEnv(t)
	c, err := FromEnv()
	require.NoError(t, err)
	require.True(t, c.IsSingleton())
	t.Setenv("PMIX_RANK", "0")
	_, err = FromEnv()
	require.ErrorIs(t, err, ErrEnv)
}

func TestFromEnvFD(t *testing.T) {
	clearPMIEnv(t)
	srv, err := NewServer(ServerConfig{Size: 2, KVSName: "kvs_fd"})
	require.NoError(t, err)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	sf := os.NewFile(uintptr(fds[0]), "srv")
	defer sf.Close()
	go func() { _ = srv.Serve(1, sf) }()
	t.Setenv("PMI_FD", strconv.Itoa(fds[1]))
	t.Setenv("PMI_RANK", "1")
	t.Setenv("PMI_SIZE", "2")
	c, err := FromEnv()
	require.NoError(t, err)
	require.Equal(t, 1, c.Rank())
	require.Equal(t, 2, c.Size())
	require.Equal(t, "kvs_fd", c.JobID())
	require.NoError(t, c.Finalize())

	for _, env := range [][3]string{{"x", "0", "1"}, {"-1", "0", "1"}, {"999", "0", "1"}, {"5", "2", "2"}, {"5", "a", "2"}, {"5", "0", "b"}} {
		t.Setenv("PMI_FD", env[0])
		t.Setenv("PMI_RANK", env[1])
		t.Setenv("PMI_SIZE", env[2])
		_, err := FromEnv()
		require.ErrorIs(t, err, ErrEnv, "%v", env)
	}
}

func TestFromEnvPort(t *testing.T) {
	clearPMIEnv(t)
	srv, err := NewServer(ServerConfig{Size: 3, KVSName: "kvs_port"})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer conn.Close(); _ = srv.Serve(-1, conn) }()
		}
	}()
	t.Setenv("PMI_PORT", ln.Addr().String())
	t.Setenv("PMI_ID", "2")
	c, err := FromEnv()
	require.NoError(t, err)
	require.Equal(t, 2, c.Rank())
	require.Equal(t, 3, c.Size())
	require.Equal(t, "kvs_port", c.JobID())
	require.NoError(t, c.Put("k", "v"))
	require.NoError(t, c.Finalize())

	t.Setenv("PMI_ID", "7") // out of range: the server refuses and hangs up
	_, err = FromEnv()
	require.Error(t, err)
}

// fakeServer answers each request line with the next scripted reply (which
// may hold several lines, or be "CLOSE" to hang up) and hangs up after the
// last one. It records requests.
func fakeServer(t *testing.T, conn net.Conn, replies ...string) <-chan string {
	reqs := make(chan string, 64)
	go func() {
		defer close(reqs)
		defer conn.Close()
		r := bufio.NewReader(conn)
		for _, rep := range replies {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			reqs <- strings.TrimSuffix(line, "\n")
			if rep == "CLOSE" {
				return
			}
			if _, err := io.WriteString(conn, rep); err != nil {
				return
			}
		}
		// Out of replies: hang up, as a dying server does.
	}()
	return reqs
}

// startupReplies are what MPICH-4 Hydra, MPICH-3 Hydra and Slurm answer to
// init, get_maxes, get_my_kvsname and get_appnum. The "mpich3" lines (and its
// put/get/finalize lines below) are exactly what Debian 12's mpich 4.0.2
// Hydra was seen to send.
var startupReplies = map[string][]string{
	"mpich4": {
		"cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=2\n",
		"cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n",
		"cmd=my_kvsname rc=0 kvsname=kvs_123_0_1_host\n",
		"cmd=appnum rc=0 appnum=0\n",
	},
	"mpich3": {
		"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
		"cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n",
		"cmd=my_kvsname kvsname=kvs_123_0\n",
		"cmd=appnum appnum=1\n",
	},
	"slurm": {
		"cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1\n",
		"cmd=maxes rc=0 kvsname_max=256 keylen_max=256 vallen_max=1024\n",
		"cmd=my_kvsname rc=0 kvsname=4711.0\n",
		"cmd=appnum rc=0 appnum=0\n",
	},
}

func TestClientAgainstServerVariants(t *testing.T) {
	tail := map[string][]string{
		"mpich4": {"cmd=put_result rc=0\n", "cmd=barrier_out\n", "cmd=get_result rc=0 value=v1\n", "cmd=get_result rc=1\n", "cmd=finalize_ack rc=0\n"},
		"mpich3": {"cmd=put_result rc=0 msg=success\n", "cmd=barrier_out\n", "cmd=get_result rc=0 msg=success value=v1\n",
			"cmd=get_result rc=-1 msg=key_nokey_not_found value=unknown\n", "cmd=finalize_ack\n"},
		"slurm": {"cmd=put_result rc=0\n", "cmd=barrier_out\n", "cmd=get_result rc=0 value=v1\n", "cmd=get_result rc=1\n", "cmd=finalize_ack rc=0\n"},
	}
	for name, start := range startupReplies {
		t.Run(name, func(t *testing.T) {
			a, b := socketpair(t)
			reqs := fakeServer(t, a, append(append([]string{}, start...), tail[name]...)...)
			c, err := NewClient(b, 0, 2)
			require.NoError(t, err)
			require.NoError(t, c.Put("k1", "v1"))
			require.NoError(t, c.Fence())
			v, err := c.Get("k1")
			require.NoError(t, err)
			require.Equal(t, "v1", v)
			_, err = c.Get("nokey")
			require.ErrorIs(t, err, ErrNotFound)
			require.NoError(t, c.Finalize())
			var got []string
			for r := range reqs {
				got = append(got, r)
			}
			kvs := c.JobID()
			require.Equal(t, []string{
				"cmd=init pmi_version=1 pmi_subversion=1",
				"cmd=get_maxes",
				"cmd=get_my_kvsname",
				"cmd=get_appnum",
				"cmd=put kvsname=" + kvs + " key=k1 value=v1",
				"cmd=barrier_in",
				"cmd=get kvsname=" + kvs + " key=k1",
				"cmd=get kvsname=" + kvs + " key=nokey",
				"cmd=finalize",
			}, got)
		})
	}
}

func TestClientBadServer(t *testing.T) {
	good := startupReplies["mpich4"]
	cases := map[string][]string{
		"closed at init":       {"CLOSE"},
		"garbage":              {"hello world\n"},
		"wrong cmd":            {"cmd=maxes rc=0\n"},
		"rc nonzero":           {"cmd=response_to_init rc=-1 msg=version_mismatch\n"},
		"rc not int":           {"cmd=response_to_init rc=zero pmi_version=1 pmi_subversion=1\n"},
		"pmi2":                 {"cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0\n"},
		"no version":           {"cmd=response_to_init rc=0\n"},
		"bad maxes":            {good[0], "cmd=maxes rc=0 kvsname_max=256 keylen_max=x vallen_max=1024\n"},
		"zero maxes":           {good[0], "cmd=maxes rc=0 kvsname_max=256 keylen_max=0 vallen_max=1024\n"},
		"no kvsname":           {good[0], good[1], "cmd=my_kvsname rc=0\n"},
		"partial line":         {good[0], good[1], "cmd=my_kvs"},
		"nul":                  {good[0], good[1], "cmd=my_kvsname rc=0 kvsname=a\x00b\n"},
		"overlong line":        {good[0], strings.Repeat("x", 2*MaxLine) + "\n"},
		"closed after startup": {good[0], good[1], good[2], good[3], "CLOSE"},
	}
	for name, replies := range cases {
		t.Run(name, func(t *testing.T) {
			a, b := socketpair(t)
			fakeServer(t, a, replies...)
			done := make(chan error, 1)
			go func() {
				c, err := NewClient(b, 0, 1)
				if err == nil {
					err = c.Put("k", "v")
				}
				done <- err
			}()
			select {
			case err := <-done:
				require.Error(t, err)
				t.Log(err)
			case <-time.After(5 * time.Second):
				t.Fatal("client hung on a bad server")
			}
		})
	}
}

func TestClientServerDiesInFence(t *testing.T) {
	a, b := socketpair(t)
	fakeServer(t, a, append(append([]string{}, startupReplies["mpich4"]...), "CLOSE")...)
	c, err := NewClient(b, 0, 2)
	require.NoError(t, err)
	err = c.Fence()
	require.ErrorIs(t, err, ErrClosed)
	// Later calls fail at once with the same cause.
	require.ErrorIs(t, c.Put("k", "v"), ErrClosed)
}

func TestHandshakeVariants(t *testing.T) {
	for _, rep := range []string{
		"cmd=initack\ncmd=set size=4\ncmd=set rank=3\ncmd=set debug=0\n",
		"cmd=initack rc=0\ncmd=set size=4\ncmd=set rank=3\ncmd=set debug=1\n",
	} {
		a, b := socketpair(t)
		reqs := fakeServer(t, a, append([]string{rep}, startupReplies["mpich4"]...)...)
		c, err := NewClientHandshake(b, 3)
		require.NoError(t, err)
		require.Equal(t, 3, c.Rank())
		require.Equal(t, 4, c.Size())
		require.Equal(t, "cmd=initack pmiid=3", <-reqs)
	}
	a, b := socketpair(t)
	fakeServer(t, a, "cmd=initack\ncmd=set size=4\ncmd=set rank=9\ncmd=set debug=0\n")
	_, err := NewClientHandshake(b, 9)
	require.ErrorIs(t, err, ErrProtocol)
}
