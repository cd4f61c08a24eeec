package pmi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/am/transport"
)

// Errors returned by the client and the server; they are wrapped with detail,
// test for them with errors.Is.
var (
	// ErrNotFound: Get of a key that no rank Put (before the last Fence).
	ErrNotFound = errors.New("pmi: key not found")
	// ErrServer: the PMI server answered a request with rc != 0.
	ErrServer = errors.New("pmi: server reported an error")
	// ErrProtocol: the peer sent a line that is valid PMI-1 text but not the
	// expected reply (wrong command, missing or non-numeric attribute).
	ErrProtocol = errors.New("pmi: protocol error")
	// ErrTooLong: a key, value or name longer than the server's maxes.
	ErrTooLong = errors.New("pmi: key or value too long")
	// ErrInvalid: an argument the wire cannot carry (empty key, space or '='
	// in a key, newline or NUL in a value).
	ErrInvalid = errors.New("pmi: invalid argument")
	// ErrClosed: the client was finalized or its connection failed earlier.
	ErrClosed = errors.New("pmi: client closed")
	// ErrEnv: the PMI_* environment is inconsistent (non-numeric PMI_FD,
	// rank outside 0..size-1, a PMIx-only launcher).
	ErrEnv = errors.New("pmi: bad launcher environment")
)

// Maxes are the size limits the server announced with get_maxes, in bytes.
// Put rejects a key longer than Key or a value longer than Val.
type Maxes struct {
	KVSName int // longest kvsname (job name)
	Key     int // longest key
	Val     int // longest value
}

// DefaultMaxes are the limits Hydra announces and Server serves
// (kvsname_max=256 keylen_max=64 vallen_max=1024); a singleton uses them too.
var DefaultMaxes = Maxes{KVSName: 256, Key: 64, Val: 1024}

// Client is one rank's PMI-1 connection to its launcher, or a singleton with a
// private in-memory key-value space when no launcher is present. It implements
// transport.Bootstrap. Methods are safe for concurrent use; requests are
// serialized (a Fence holds the connection until every rank entered).
type Client struct {
	mu        sync.Mutex
	conn      io.ReadWriteCloser // nil for a singleton
	r         *bufio.Reader
	rank      int
	size      int
	appnum    int
	kvsname   string
	maxes     Maxes
	version   [2]int // server's pmi_version, pmi_subversion
	singleton bool
	kvs       map[string]string // singleton: visible after Fence
	pending   map[string]string // singleton: put since the last Fence
	broken    error             // first fatal error; later calls return it
	closed    atomic.Bool
}

var _ transport.Bootstrap = (*Client)(nil)

// FromEnv connects to the launcher described by the environment, as MPICH's
// PMI_Init does: PMI_FD (an inherited connected socket; rank and size from
// PMI_RANK and PMI_SIZE, defaults 0 and 1), else PMI_PORT=host:port (TCP; with
// PMI_ID the "cmd=initack pmiid=<id>" handshake gives rank and size, without it
// PMI_RANK/PMI_SIZE do), else a singleton of size 1 named "singleton_<pid>".
// It then sends init (version 1.1), get_maxes, get_my_kvsname and get_appnum.
// Errors wrap ErrEnv (bad variables, PMIx launcher), ErrServer, ErrProtocol,
// ErrMalformed or the connection's error.
func FromEnv() (*Client, error) {
	if v := os.Getenv("PMI_FD"); v != "" {
		fd, err := strconv.Atoi(v)
		if err != nil || fd < 0 {
			return nil, fmt.Errorf("%w: PMI_FD=%q is not a file descriptor", ErrEnv, v)
		}
		rank, size, err := rankSizeEnv()
		if err != nil {
			return nil, err
		}
		f := os.NewFile(uintptr(fd), "PMI_FD")
		if f == nil {
			return nil, fmt.Errorf("%w: PMI_FD=%d is not open", ErrEnv, fd)
		}
		conn, err := net.FileConn(f)
		f.Close() // FileConn holds a duplicate
		if err != nil {
			return nil, fmt.Errorf("%w: PMI_FD=%d is not a socket: %v", ErrEnv, fd, err)
		}
		return NewClient(conn, rank, size)
	}
	if addr := os.Getenv("PMI_PORT"); addr != "" {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("pmi: connect to PMI_PORT=%s: %w", addr, err)
		}
		if v := os.Getenv("PMI_ID"); v != "" {
			id, err := strconv.Atoi(v)
			if err != nil {
				conn.Close()
				return nil, fmt.Errorf("%w: PMI_ID=%q is not an integer", ErrEnv, v)
			}
			return NewClientHandshake(conn, id)
		}
		rank, size, err := rankSizeEnv()
		if err != nil {
			conn.Close()
			return nil, err
		}
		return NewClient(conn, rank, size)
	}
	for _, k := range []string{"PMIX_RANK", "PMIX_NAMESPACE", "PMIX_SERVER_URI2", "PMIX_SERVER_URI21", "PMIX_SERVER_URI3", "PMIX_SERVER_URI4"} {
		if os.Getenv(k) != "" {
			return nil, fmt.Errorf("%w: launcher not compatible with PMI-1 (%s is set, PMI_FD and PMI_PORT are not; use srun --mpi=pmi2 or MPICH mpiexec)", ErrEnv, k)
		}
	}
	return Singleton(), nil
}

func rankSizeEnv() (rank, size int, err error) {
	rank, size = 0, 1
	if v := os.Getenv("PMI_RANK"); v != "" {
		if rank, err = strconv.Atoi(v); err != nil {
			return 0, 0, fmt.Errorf("%w: PMI_RANK=%q is not an integer", ErrEnv, v)
		}
	}
	if v := os.Getenv("PMI_SIZE"); v != "" {
		if size, err = strconv.Atoi(v); err != nil {
			return 0, 0, fmt.Errorf("%w: PMI_SIZE=%q is not an integer", ErrEnv, v)
		}
	}
	if size < 1 || rank < 0 || rank >= size {
		return 0, 0, fmt.Errorf("%w: PMI_RANK=%d outside 0..PMI_SIZE-1 (PMI_SIZE=%d)", ErrEnv, rank, size)
	}
	return rank, size, nil
}

// Singleton returns a client for a job of size 1 without a launcher: rank 0,
// appnum 0, DefaultMaxes, JobID "singleton_<pid>", and a private in-memory
// key-value space (Put values become visible to Get after Fence, as with a
// real launcher).
func Singleton() *Client {
	return &Client{
		rank: 0, size: 1, singleton: true,
		kvsname: "singleton_" + strconv.Itoa(os.Getpid()),
		maxes:   DefaultMaxes,
		version: [2]int{1, 1},
		kvs:     map[string]string{}, pending: map[string]string{},
	}
}

// NewClient runs the PMI-1 start-up over conn, an already connected stream to
// the launcher (what PMI_FD names), for the given rank of a job of size ranks:
// init, get_maxes, get_my_kvsname, get_appnum. The client owns conn and closes
// it on Finalize or on a fatal error. Errors wrap ErrInvalid (rank/size),
// ErrServer, ErrProtocol, ErrMalformed or conn's error; conn is closed then.
func NewClient(conn io.ReadWriteCloser, rank, size int) (*Client, error) {
	if size < 1 || rank < 0 || rank >= size {
		conn.Close()
		return nil, fmt.Errorf("%w: rank %d outside 0..%d", ErrInvalid, rank, size-1)
	}
	c := &Client{conn: conn, r: newReader(conn), rank: rank, size: size}
	if err := c.start(); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// NewClientHandshake is NewClient for a PMI_PORT connection: it first sends
// "cmd=initack pmiid=<id>" and takes rank and size from the server's
// "cmd=initack" and "cmd=set size=", "cmd=set rank=", "cmd=set debug=" lines.
// Errors as NewClient; conn is closed on error.
func NewClientHandshake(conn io.ReadWriteCloser, id int) (*Client, error) {
	c := &Client{conn: conn, r: newReader(conn), rank: -1, size: -1}
	err := c.handshake(id)
	if err == nil {
		err = c.start()
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

func (c *Client) handshake(id int) error {
	if _, err := c.exchange(NewLine("initack", "pmiid", strconv.Itoa(id)), "initack"); err != nil {
		return err
	}
	for i := 0; i < 3; i++ {
		l, err := c.recv()
		if err != nil {
			return err
		}
		if l.Cmd != "set" {
			return fmt.Errorf("%w: handshake: expected cmd=set, got %q", ErrProtocol, l.String())
		}
		for _, a := range l.Attrs {
			n, err := strconv.Atoi(a.Value)
			if err != nil {
				return fmt.Errorf("%w: handshake: %s=%q is not an integer", ErrProtocol, a.Key, a.Value)
			}
			switch a.Key {
			case "size":
				c.size = n
			case "rank":
				c.rank = n
			}
		}
	}
	if c.size < 1 || c.rank < 0 || c.rank >= c.size {
		return fmt.Errorf("%w: handshake gave rank %d of size %d", ErrProtocol, c.rank, c.size)
	}
	return nil
}

func (c *Client) start() error {
	l, err := c.exchange(NewLine("init", "pmi_version", "1", "pmi_subversion", "1"), "response_to_init")
	if err != nil {
		return fmt.Errorf("pmi: init: %w", err)
	}
	v, err := intAttr(l, "pmi_version")
	if err != nil {
		return fmt.Errorf("pmi: init: %w", err)
	}
	sv, err := intAttr(l, "pmi_subversion")
	if err != nil {
		return fmt.Errorf("pmi: init: %w", err)
	}
	if v != 1 || sv < 1 {
		return fmt.Errorf("%w: init: server speaks PMI %d.%d, need 1.1 or later 1.x", ErrProtocol, v, sv)
	}
	c.version = [2]int{v, sv}

	l, err = c.exchange(NewLine("get_maxes"), "maxes")
	if err != nil {
		return fmt.Errorf("pmi: get_maxes: %w", err)
	}
	for _, f := range []struct {
		key string
		dst *int
	}{{"kvsname_max", &c.maxes.KVSName}, {"keylen_max", &c.maxes.Key}, {"vallen_max", &c.maxes.Val}} {
		n, err := intAttr(l, f.key)
		if err != nil {
			return fmt.Errorf("pmi: get_maxes: %w", err)
		}
		if n < 1 {
			return fmt.Errorf("%w: get_maxes: %s=%d", ErrProtocol, f.key, n)
		}
		*f.dst = n
	}

	l, err = c.exchange(NewLine("get_my_kvsname"), "my_kvsname")
	if err != nil {
		return fmt.Errorf("pmi: get_my_kvsname: %w", err)
	}
	name, ok := l.Get("kvsname")
	if !ok || name == "" {
		return fmt.Errorf("%w: get_my_kvsname: reply %q has no kvsname", ErrProtocol, l.String())
	}
	c.kvsname = name

	l, err = c.exchange(NewLine("get_appnum"), "appnum")
	if err != nil {
		return fmt.Errorf("pmi: get_appnum: %w", err)
	}
	if c.appnum, err = intAttr(l, "appnum"); err != nil {
		return fmt.Errorf("pmi: get_appnum: %w", err)
	}
	return nil
}

func intAttr(l Line, key string) (int, error) {
	v, ok := l.Get(key)
	if !ok {
		return 0, fmt.Errorf("%w: reply %q lacks %s", ErrProtocol, l.String(), key)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%w: reply %q: %s=%q is not an integer", ErrProtocol, l.String(), key, v)
	}
	return n, nil
}

// send writes one request. A write failure breaks the client.
func (c *Client) send(l Line) error {
	if c.broken != nil {
		return c.broken
	}
	s, err := FormatLine(l)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := io.WriteString(c.conn, s); err != nil {
		return c.fail(fmt.Errorf("pmi: send %s: %w", l.Cmd, err))
	}
	return nil
}

// recv reads and parses one reply. Any failure breaks the client: after a
// garbled or missing reply the stream cannot be trusted.
func (c *Client) recv() (Line, error) {
	if c.broken != nil {
		return Line{}, c.broken
	}
	s, err := readLine(c.r, false)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return Line{}, c.fail(fmt.Errorf("%w: PMI server closed the connection: %w", ErrClosed, err))
		}
		return Line{}, c.fail(fmt.Errorf("pmi: read reply: %w", err))
	}
	l, err := ParseLine(s)
	if err != nil {
		return Line{}, c.fail(fmt.Errorf("pmi: reply from server: %w", err))
	}
	return l, nil
}

// exchange sends q and reads a reply that must be cmd=want; rc != 0 gives an
// error wrapping ErrServer (and the reply line, for callers that look closer).
func (c *Client) exchange(q Line, want string) (Line, error) {
	if err := c.send(q); err != nil {
		return Line{}, err
	}
	l, err := c.recv()
	if err != nil {
		return Line{}, err
	}
	if l.Cmd != want {
		return l, c.fail(fmt.Errorf("%w: sent cmd=%s, expected cmd=%s, got %q", ErrProtocol, q.Cmd, want, clip(l.String())))
	}
	if v, ok := l.Get("rc"); ok {
		rc, err := strconv.Atoi(v)
		if err != nil {
			return l, c.fail(fmt.Errorf("%w: reply %q: rc=%q is not an integer", ErrProtocol, clip(l.String()), v))
		}
		if rc != 0 {
			msg, ok := l.Get("msg")
			if !ok {
				msg, _ = l.Get("errmsg")
			}
			return l, &rcError{cmd: q.Cmd, rc: rc, msg: msg}
		}
	}
	return l, nil
}

type rcError struct {
	cmd string
	rc  int
	msg string
}

func (e *rcError) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("%v: %s returned rc=%d", ErrServer, e.cmd, e.rc)
	}
	return fmt.Sprintf("%v: %s returned rc=%d: %s", ErrServer, e.cmd, e.rc, e.msg)
}

func (e *rcError) Unwrap() error { return ErrServer }

// fail records err as fatal and closes the connection so that nothing hangs
// on it later.
func (c *Client) fail(err error) error {
	if c.broken == nil {
		c.broken = err
		if c.conn != nil {
			c.conn.Close()
		}
	}
	return err
}

// Rank is this process's rank, 0..Size()-1.
func (c *Client) Rank() int { return c.rank }

// Size is the number of processes in the job (PMI_SIZE or the handshake's).
func (c *Client) Size() int { return c.size }

// JobID is the PMI kvsname, unique to the job on this host ("singleton_<pid>"
// for a singleton).
func (c *Client) JobID() string { return c.kvsname }

// AppNum is the application number from get_appnum (0 unless the launcher
// started several executables, e.g. mpiexec -n 1 a : -n 1 b).
func (c *Client) AppNum() int { return c.appnum }

// Maxes returns the limits the server announced with get_maxes.
func (c *Client) Maxes() Maxes { return c.maxes }

// Version returns the PMI version and subversion the server answered to init
// (1.2 from MPICH-4 Hydra, 1.1 from MPICH-3 Hydra and Slurm).
func (c *Client) Version() (version, subversion int) { return c.version[0], c.version[1] }

// IsSingleton reports whether no launcher was found (a job of size 1).
func (c *Client) IsSingleton() bool { return c.singleton }

func (c *Client) checkKey(key string) error {
	if key == "" || len(key) > MaxLine || containsAny(key, " =\\\n\x00") {
		return fmt.Errorf("%w: key %q must be non-empty without space, '=', '\\', newline or NUL", ErrInvalid, clip(key))
	}
	if len(key) > c.maxes.Key {
		return fmt.Errorf("%w: key %q is %d bytes, keylen_max is %d", ErrTooLong, clip(key), len(key), c.maxes.Key)
	}
	return nil
}

func containsAny(s, chars string) bool {
	for i := 0; i < len(s); i++ {
		for j := 0; j < len(chars); j++ {
			if s[i] == chars[j] {
				return true
			}
		}
	}
	return false
}

// Put publishes key=value to every rank; it becomes visible to Get after the
// next Fence. Errors wrap ErrInvalid (empty key, space/'='/'\' in the key,
// newline or NUL in the value), ErrTooLong (key longer than Maxes().Key or
// value longer than Maxes().Val bytes), ErrClosed, ErrServer or ErrProtocol.
// Values with spaces are escaped on the wire; MPICH's Hydra does not re-escape
// them when answering get, so keep values free of spaces for portability.
func (c *Client) Put(key, value string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return err
	}
	if err := c.checkKey(key); err != nil {
		return err
	}
	if containsAny(value, "\n\x00") {
		return fmt.Errorf("%w: value for %q contains a newline or NUL", ErrInvalid, key)
	}
	if len(value) > c.maxes.Val {
		return fmt.Errorf("%w: value for %q is %d bytes, vallen_max is %d", ErrTooLong, key, len(value), c.maxes.Val)
	}
	if c.singleton {
		c.pending[key] = value
		return nil
	}
	_, err := c.exchange(NewLine("put", "kvsname", c.kvsname, "key", key, "value", value), "put_result")
	if err != nil {
		return fmt.Errorf("pmi: put %q: %w", key, err)
	}
	return nil
}

// Fence is a barrier over all ranks (barrier_in, then wait for barrier_out);
// Puts made by any rank before it are visible to Gets after it. It blocks
// until every rank entered; it returns an error wrapping ErrClosed if the
// server goes away meanwhile, or ErrServer / ErrProtocol.
func (c *Client) Fence() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return err
	}
	if c.singleton {
		for k, v := range c.pending {
			c.kvs[k] = v
		}
		clear(c.pending)
		return nil
	}
	if _, err := c.exchange(NewLine("barrier_in"), "barrier_out"); err != nil {
		return fmt.Errorf("pmi: fence: %w", err)
	}
	return nil
}

// Get reads the value some rank Put before a Fence. A missing key gives an
// error wrapping ErrNotFound (whatever rc and msg the server used for it).
// Other errors wrap ErrInvalid, ErrTooLong, ErrClosed or ErrProtocol.
func (c *Client) Get(key string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usable(); err != nil {
		return "", err
	}
	if err := c.checkKey(key); err != nil {
		return "", err
	}
	if c.singleton {
		v, ok := c.kvs[key]
		if !ok {
			return "", fmt.Errorf("pmi: get %q: %w", key, ErrNotFound)
		}
		return v, nil
	}
	l, err := c.exchange(NewLine("get", "kvsname", c.kvsname, "key", key), "get_result")
	if err != nil {
		var rce *rcError
		if errors.As(err, &rce) {
			return "", fmt.Errorf("pmi: get %q: %w (server: %v)", key, ErrNotFound, rce)
		}
		return "", fmt.Errorf("pmi: get %q: %w", key, err)
	}
	if f, ok := l.Get("found"); ok && f == "FALSE" {
		return "", fmt.Errorf("pmi: get %q: %w", key, ErrNotFound)
	}
	v, ok := l.Get("value")
	if !ok {
		return "", c.fail(fmt.Errorf("%w: get %q: reply %q has no value", ErrProtocol, key, clip(l.String())))
	}
	return v, nil
}

func (c *Client) usable() error {
	if c.closed.Load() {
		return fmt.Errorf("%w: finalized", ErrClosed)
	}
	return c.broken
}

// Abort asks the launcher to end the whole job with exit status code, sending
// "cmd=abort exitcode=<code> message=<msg>" (no reply is expected). It does
// not exit this process: call os.Exit(code) afterwards. For a singleton it
// only marks the client closed. Errors: the connection's write error,
// ErrClosed after Finalize.
func (c *Client) Abort(code int, msg string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return fmt.Errorf("%w: finalized", ErrClosed)
	}
	if c.singleton {
		c.closed.Store(true)
		return nil
	}
	msg = sanitize(msg)
	l := NewLine("abort", "exitcode", strconv.Itoa(code))
	if msg != "" {
		l.Attrs = append(l.Attrs, Attr{Key: "message", Value: msg})
	}
	err := c.send(l)
	c.closed.Store(true)
	return err
}

// sanitize makes msg fit on one PMI line.
func sanitize(msg string) string {
	b := []byte(msg)
	for i, ch := range b {
		if ch == '\n' || ch == '\x00' || ch == '\r' {
			b[i] = ' '
		}
	}
	if len(b) > 1024 {
		b = b[:1024]
	}
	return string(b)
}

// Finalize tells the launcher this rank is done with PMI (finalize, wait for
// finalize_ack) and closes the connection. Later calls return ErrClosed; a
// second Finalize returns nil. Errors: ErrServer, ErrProtocol, ErrClosed if
// the server went away.
func (c *Client) Finalize() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Swap(true) {
		return nil
	}
	if c.singleton {
		return nil
	}
	if c.broken != nil {
		return c.broken
	}
	_, err := c.exchange(NewLine("finalize"), "finalize_ack")
	if cerr := c.conn.Close(); err == nil && cerr != nil && c.broken == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pmi: finalize: %w", err)
	}
	return nil
}
