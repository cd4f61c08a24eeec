package pmi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
)

// ServerConfig describes the job a Server serves.
type ServerConfig struct {
	// Size is the number of ranks (connections) in the job; at least 1.
	Size int
	// KVSName is the job's kvsname (what clients see as JobID); 1..256 bytes
	// without spaces or newlines.
	KVSName string
	// AppNum is answered to get_appnum (normally 0).
	AppNum int
	// UniverseSize is answered to get_universe_size; 0 means Size.
	UniverseSize int
	// OnAbort, if set, is called (from the rank's serving goroutine) when a
	// rank sends cmd=abort, with its exitcode and message.
	OnAbort func(rank, code int, msg string)
	// OnInit and OnFinalize, if set, are called (from the rank's serving
	// goroutine) when a rank sends cmd=init and cmd=finalize, before the
	// reply: a launcher learns which ranks end without finalizing.
	OnInit, OnFinalize func(rank int)
	// OnDisconnect, if set, is called when Serve returns for an identified
	// rank (its connection ended, or finalize was answered).
	OnDisconnect func(rank int)
	// OnError, if set, is called for each protocol problem a rank causes
	// (malformed line, unknown or unsupported command, bad arguments); the
	// rank got an error reply and the job goes on.
	OnError func(rank int, err error)
}

// Server is the launcher side of PMI-1: it serves one connection per rank and
// holds the job's key-value space and barrier. Replies are formatted as
// MPICH-4 Hydra formats them (see the package documentation).
type Server struct {
	cfg ServerConfig

	mu       sync.Mutex
	kvs      map[string]string
	conns    map[int]*srvConn // rank -> connection, for barrier_out
	inBarier map[int]bool     // ranks waiting in the current barrier
	served   map[int]bool
}

type srvConn struct {
	wmu sync.Mutex
	w   io.Writer
}

func (c *srvConn) write(s string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := io.WriteString(c.w, s)
	return err
}

// NewServer returns a Server for cfg. Errors wrap ErrInvalid: Size < 1, an
// empty or overlong KVSName, or one containing a space, '\', newline or NUL.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Size < 1 {
		return nil, fmt.Errorf("%w: server size %d", ErrInvalid, cfg.Size)
	}
	if cfg.KVSName == "" || len(cfg.KVSName) > DefaultMaxes.KVSName || containsAny(cfg.KVSName, " \\\n\x00=") {
		return nil, fmt.Errorf("%w: kvsname %q", ErrInvalid, clip(cfg.KVSName))
	}
	if cfg.UniverseSize == 0 {
		cfg.UniverseSize = cfg.Size
	}
	return &Server{cfg: cfg, kvs: map[string]string{}, conns: map[int]*srvConn{},
		inBarier: map[int]bool{}, served: map[int]bool{}}, nil
}

// KVSName returns the job's kvsname.
func (s *Server) KVSName() string { return s.cfg.KVSName }

// Serve answers PMI-1 requests from rank on conn until the rank closes it
// (nil), sends finalize (nil, after finalize_ack), or a read or write fails
// (that error). With rank < 0 the rank is taken from a PMI_PORT handshake
// ("cmd=initack pmiid=<rank>"), which must be the first line. Serve does not
// close conn. Errors wrap ErrInvalid for a rank outside 0..Size-1 or one
// already being served.
func (s *Server) Serve(rank int, conn io.ReadWriter) error {
	r := newReader(conn)
	sc := &srvConn{w: conn}
	if rank < 0 {
		var err error
		if rank, err = s.handshake(r, sc); err != nil {
			return err
		}
	}
	if rank >= s.cfg.Size {
		return fmt.Errorf("%w: rank %d outside 0..%d", ErrInvalid, rank, s.cfg.Size-1)
	}
	s.mu.Lock()
	if s.served[rank] {
		s.mu.Unlock()
		return fmt.Errorf("%w: rank %d already connected", ErrInvalid, rank)
	}
	s.served[rank] = true
	s.conns[rank] = sc
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, rank)
		delete(s.inBarier, rank)
		s.mu.Unlock()
		if s.cfg.OnDisconnect != nil {
			s.cfg.OnDisconnect(rank)
		}
	}()

	for {
		line, err := readLine(r, true)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, errLineTooLong):
			s.report(rank, err)
			if werr := sc.write("cmd=error rc=1 msg=line_too_long\n"); werr != nil {
				return werr
			}
			continue
		case errors.Is(err, io.ErrUnexpectedEOF):
			s.report(rank, fmt.Errorf("%w: connection closed in the middle of a line", ErrMalformed))
			return nil
		case err != nil:
			return fmt.Errorf("pmi: server: read from rank %d: %w", rank, err)
		}
		if strings.HasPrefix(line, "mcmd=") {
			// Multi-line spawn: swallow it up to endcmd, then refuse.
			for line != "endcmd" {
				if line, err = readLine(r, true); err != nil && !errors.Is(err, errLineTooLong) {
					return nil
				}
			}
			s.report(rank, fmt.Errorf("%w: spawn is not supported", ErrInvalid))
			if err := sc.write("cmd=spawn_result rc=1 msg=spawn_not_supported\n"); err != nil {
				return err
			}
			continue
		}
		q, perr := ParseLine(line)
		if perr != nil {
			s.report(rank, perr)
			if err := sc.write("cmd=error rc=1 msg=malformed_line\n"); err != nil {
				return err
			}
			continue
		}
		done, err := s.handle(rank, sc, q)
		if err != nil {
			return fmt.Errorf("pmi: server: reply to rank %d: %w", rank, err)
		}
		if done {
			return nil
		}
	}
}

func (s *Server) handshake(r *bufio.Reader, sc *srvConn) (int, error) {
	line, err := readLine(r, false)
	if err != nil {
		return 0, fmt.Errorf("pmi: server: handshake: %w", err)
	}
	q, err := ParseLine(line)
	if err != nil {
		return 0, fmt.Errorf("pmi: server: handshake: %w", err)
	}
	v, ok := q.Get("pmiid")
	id, cerr := strconv.Atoi(v)
	if q.Cmd != "initack" || !ok || cerr != nil || id < 0 || id >= s.cfg.Size {
		return 0, fmt.Errorf("%w: handshake: expected cmd=initack pmiid=<0..%d>, got %q", ErrProtocol, s.cfg.Size-1, clip(line))
	}
	err = sc.write(fmt.Sprintf("cmd=initack\ncmd=set size=%d\ncmd=set rank=%d\ncmd=set debug=0\n", s.cfg.Size, id))
	return id, err
}

func (s *Server) report(rank int, err error) {
	if s.cfg.OnError != nil {
		s.cfg.OnError(rank, err)
	}
}

// reply formats and writes one line.
func reply(sc *srvConn, cmd string, kv ...string) error {
	out, err := FormatLine(NewLine(cmd, kv...))
	if err != nil { // cannot happen for values that came from ParseLine
		out = "cmd=" + cmd + " rc=1 msg=unformattable_reply\n"
	}
	return sc.write(out)
}

// fail answers a bad request with rc=1 and a msg, and reports it.
func (s *Server) fail(rank int, sc *srvConn, cmd, msg string, err error) error {
	s.report(rank, err)
	return reply(sc, cmd, "rc", "1", "msg", msg)
}

var unsupported = map[string]string{
	"publish_name":   "publish_result",
	"unpublish_name": "unpublish_result",
	"lookup_name":    "lookup_result",
	"getbyidx":       "getbyidx_results",
	"create_kvs":     "newkvs",
	"destroy_kvs":    "kvs_destroyed",
	"spawn":          "spawn_result",
}

func (s *Server) handle(rank int, sc *srvConn, q Line) (done bool, err error) {
	switch q.Cmd {
	case "init":
		v, _ := q.Get("pmi_version")
		sv, _ := q.Get("pmi_subversion")
		vn, err1 := strconv.Atoi(v)
		svn, err2 := strconv.Atoi(sv)
		if err1 != nil || err2 != nil || vn != 1 || svn > 2 {
			return false, s.fail(rank, sc, "response_to_init", "unsupported_pmi_version",
				fmt.Errorf("%w: init asks for PMI version %q.%q; this server speaks 1.1/1.2 text", ErrInvalid, v, sv))
		}
		if s.cfg.OnInit != nil {
			s.cfg.OnInit(rank)
		}
		return false, reply(sc, "response_to_init", "rc", "0", "pmi_version", "1", "pmi_subversion", "2")
	case "get_maxes":
		return false, reply(sc, "maxes", "rc", "0", "kvsname_max", strconv.Itoa(DefaultMaxes.KVSName),
			"keylen_max", strconv.Itoa(DefaultMaxes.Key), "vallen_max", strconv.Itoa(DefaultMaxes.Val))
	case "get_appnum":
		return false, reply(sc, "appnum", "rc", "0", "appnum", strconv.Itoa(s.cfg.AppNum))
	case "get_universe_size":
		return false, reply(sc, "universe_size", "rc", "0", "size", strconv.Itoa(s.cfg.UniverseSize))
	case "get_my_kvsname":
		return false, reply(sc, "my_kvsname", "rc", "0", "kvsname", s.cfg.KVSName)
	case "put":
		key, kok := q.Get("key")
		val, vok := q.Get("value")
		if msg, err := s.checkKVS(q); err != nil {
			return false, s.fail(rank, sc, "put_result", msg, err)
		}
		if !kok || !vok || key == "" {
			return false, s.fail(rank, sc, "put_result", "missing_key_or_value",
				fmt.Errorf("%w: put without key or value: %q", ErrInvalid, clip(q.String())))
		}
		if len(key) > DefaultMaxes.Key || len(val) > DefaultMaxes.Val {
			return false, s.fail(rank, sc, "put_result", "key_or_value_too_long",
				fmt.Errorf("%w: put of key %q (%d bytes) value of %d bytes", ErrTooLong, clip(key), len(key), len(val)))
		}
		s.mu.Lock()
		s.kvs[key] = val
		s.mu.Unlock()
		return false, reply(sc, "put_result", "rc", "0")
	case "get":
		key, ok := q.Get("key")
		if msg, err := s.checkKVS(q); err != nil {
			return false, s.fail(rank, sc, "get_result", msg, err)
		}
		if !ok || key == "" {
			return false, s.fail(rank, sc, "get_result", "missing_key",
				fmt.Errorf("%w: get without key", ErrInvalid))
		}
		s.mu.Lock()
		val, found := s.kvs[key]
		s.mu.Unlock()
		if !found {
			return false, reply(sc, "get_result", "rc", "1")
		}
		return false, reply(sc, "get_result", "rc", "0", "value", val)
	case "barrier_in":
		return false, s.barrierIn(rank, sc)
	case "finalize":
		if s.cfg.OnFinalize != nil {
			s.cfg.OnFinalize(rank)
		}
		return true, reply(sc, "finalize_ack", "rc", "0")
	case "abort":
		code := 1
		if v, ok := q.Get("exitcode"); ok {
			if n, err := strconv.Atoi(v); err == nil {
				code = n
			}
		}
		msg, _ := q.Get("message")
		if s.cfg.OnAbort != nil {
			s.cfg.OnAbort(rank, code, msg)
		}
		return false, nil
	case "initack":
		return false, s.fail(rank, sc, "initack", "unexpected_initack",
			fmt.Errorf("%w: initack on an already identified connection", ErrProtocol))
	}
	resp, ok := unsupported[q.Cmd]
	if !ok {
		resp = q.Cmd + "_result"
	}
	return false, s.fail(rank, sc, resp, "unsupported_command",
		fmt.Errorf("%w: unsupported command %q", ErrInvalid, clip(q.Cmd)))
}

func (s *Server) checkKVS(q Line) (string, error) {
	if k, ok := q.Get("kvsname"); ok && k != s.cfg.KVSName {
		return "unknown_kvsname", fmt.Errorf("%w: %s for kvsname %q, this job is %q", ErrInvalid, q.Cmd, clip(k), s.cfg.KVSName)
	}
	return "", nil
}

// barrierIn records rank in the barrier; the last rank to enter releases all
// with cmd=barrier_out (no rc, as Hydra).
func (s *Server) barrierIn(rank int, sc *srvConn) error {
	s.mu.Lock()
	if s.inBarier[rank] {
		s.mu.Unlock()
		return s.fail(rank, sc, "barrier_out", "already_in_barrier",
			fmt.Errorf("%w: barrier_in twice", ErrProtocol))
	}
	s.inBarier[rank] = true
	if len(s.inBarier) < s.cfg.Size {
		s.mu.Unlock()
		return nil
	}
	waiting := make([]*srvConn, 0, len(s.inBarier))
	var ranks []int
	for r := range s.inBarier {
		if c := s.conns[r]; c != nil {
			waiting = append(waiting, c)
			ranks = append(ranks, r)
		}
	}
	clear(s.inBarier)
	s.mu.Unlock()
	var own error
	for i, c := range waiting {
		if err := c.write("cmd=barrier_out\n"); err != nil {
			if c == sc {
				own = err
			} else {
				s.report(ranks[i], fmt.Errorf("pmi: server: barrier_out: %w", err))
			}
		}
	}
	return own
}
