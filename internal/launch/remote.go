package launch

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/amgo-hpc/amgo/internal/pmi"
)

// A job on several hosts (Spec.Hosts) runs one proxy per host: the launcher
// executable started again, on that host, as "<exe> --proxy <addr> <host>"
// through Spec.LauncherExec (ssh by default), as Hydra starts
// hydra_pmi_proxy. The proxy reads a one-time token from its standard input
// (so that it never appears on a command line), connects back to the
// launcher's control address, proves the token, and receives the job: the
// ranks it hosts, the program, the environment. It then does on its host
// what Run does for a one-host job (a job directory in its /dev/shm, CPU
// binding among its ranks, timer slack, output tagging) and starts its ranks
// with PMI_PORT pointing at the launcher's PMI server, which serves every
// rank of the job over TCP. Each rank's exit is reported to the launcher,
// which supervises the job exactly as a one-host job (the first failure ends
// it); the launcher's signals reach the ranks through their proxies. A proxy
// whose control connection breaks (the launcher died) ends its ranks; a
// control connection that breaks while the host's ranks run means the host
// was lost, and its ranks are reported so, by name.

// ProxyFlag is the first argument of a launcher executable started as a
// host's proxy: "<exe> --proxy <control address> <host index>". cmd/amrun
// hands such invocations to RunProxy.
const ProxyFlag = "--proxy"

// DefaultConnectTimeout bounds how long the launcher waits for every host's
// proxy to connect back.
const DefaultConnectTimeout = 60 * time.Second

// ctlMsg is one line of the control protocol between the launcher and a
// proxy: JSON, one object per line, exactly one field set.
type ctlMsg struct {
	Hello  *ctlHello  `json:"hello,omitempty"`  // proxy → launcher, first
	Job    *ctlJob    `json:"job,omitempty"`    // launcher → proxy, once
	Signal *ctlSignal `json:"signal,omitempty"` // launcher → proxy
	Exit   *ctlExit   `json:"exit,omitempty"`   // proxy → launcher, per rank
}

type ctlHello struct {
	Host  int    `json:"host"`
	Token string `json:"token"`
}

type ctlJob struct {
	Host         string   `json:"host"`  // the host's name in the launcher's list
	Ranks        []int    `json:"ranks"` // global ranks this host runs, in order
	Size         int      `json:"size"`
	Prog         string   `json:"prog"`
	Args         []string `json:"args"`
	Env          []string `json:"env"` // overlaid on the proxy's own environment
	Dir          string   `json:"dir"` // working directory, if it exists there
	PMIPort      string   `json:"pmi_port"`
	TagOutput    bool     `json:"tag_output"`
	Bind         string   `json:"bind"`
	Transport    string   `json:"transport"`
	TimerSlack   int64    `json:"timer_slack_ns"`
	Grace        int64    `json:"grace_ns"`
	JobDirParent string   `json:"job_dir_parent"`
}

type ctlSignal struct {
	Rank int `json:"rank"` // global rank
	Sig  int `json:"sig"`
}

type ctlExit struct {
	Rank   int    `json:"rank"`
	OK     bool   `json:"ok"`
	Code   int    `json:"code"`
	Detail string `json:"detail"`
}

// ctlConn is one end of a control connection; Send is safe for concurrent
// use.
type ctlConn struct {
	c   net.Conn
	mu  sync.Mutex
	enc *json.Encoder
	dec *json.Decoder
}

func newCtlConn(c net.Conn) *ctlConn {
	return &ctlConn{c: c, enc: json.NewEncoder(c), dec: json.NewDecoder(bufio.NewReader(c))}
}

func (k *ctlConn) send(m ctlMsg) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.enc.Encode(m)
}

// keepAlive makes a dead peer host show up as a broken connection within
// seconds, not the kernel's two hours.
func keepAlive(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 3})
	}
}

// hostLocalEnv are variables that describe the launcher's host or session,
// not the job: a proxy keeps its own host's values.
var hostLocalEnv = map[string]bool{"HOSTNAME": true, "HOST": true, "PWD": true, "OLDPWD": true, "SHLVL": true,
	"_": true, "DISPLAY": true, "SSH_CLIENT": true, "SSH_CONNECTION": true, "SSH_TTY": true, "SSH_AUTH_SOCK": true,
	"XDG_RUNTIME_DIR": true, "XDG_SESSION_ID": true, "TERM": true, "AMGO_NODE": true}

// remoteHost is the launcher's view of one host's proxy.
type remoteHost struct {
	index int
	name  string
	ranks []int
	cmd   *exec.Cmd // the launcher command (ssh ...) or the local proxy
	ctl   *ctlConn
	ended chan struct{} // closed when cmd has been waited for
	state *os.ProcessState
}

// shellQuote quotes s for a POSIX shell (ssh runs its command through the
// remote user's shell).
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// launchAddr resolves Spec.LaunchIface to the address remote proxies and
// ranks connect to: an IP address as is, an interface's first IPv4 address,
// or (empty) the host name's address when it is not a loopback one, else
// the first non-loopback IPv4 address of an interface that is up, else
// 127.0.0.1.
func launchAddr(iface string) (string, error) {
	if iface != "" {
		if ip := net.ParseIP(iface); ip != nil {
			return ip.String(), nil
		}
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return "", fmt.Errorf("launch interface %q: %w", iface, err)
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return "", fmt.Errorf("launch interface %q: %w", iface, err)
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
		}
		return "", fmt.Errorf("launch interface %q has no IPv4 address", iface)
	}
	if h, err := os.Hostname(); err == nil {
		if ips, err := net.LookupIP(h); err == nil {
			for _, ip := range ips {
				if ip.To4() != nil && !ip.IsLoopback() {
					return ip.String(), nil
				}
			}
		}
	}
	ifcs, _ := net.Interfaces()
	for _, ifc := range ifcs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				return ipn.IP.String(), nil
			}
		}
	}
	return "127.0.0.1", nil
}

// isLocalHost reports whether name is this host: its proxy is started
// directly rather than through the launcher command.
func isLocalHost(name string) bool {
	if name == "localhost" {
		return true
	}
	h, err := os.Hostname()
	return err == nil && (name == h || strings.SplitN(h, ".", 2)[0] == name)
}

func startErr(code int, format string, args ...any) *JobError {
	return &JobError{Kind: ErrStart, Rank: -1, Code: code, Detail: fmt.Sprintf(format, args...)}
}

// runHosts runs a job on spec.Hosts (see the comment at the top of the file).
func runHosts(ctx context.Context, spec Spec) error {
	if inProcess(spec.Transport) {
		return &JobError{Kind: ErrSpec, Rank: -1, Code: 2, Detail: fmt.Sprintf("transport %s runs the job in one process: it cannot span hosts", spec.Transport)}
	}
	place, err := Place(spec.N, spec.Hosts, spec.MapBy)
	if err != nil {
		return &JobError{Kind: ErrSpec, Rank: -1, Code: 2, Detail: err.Error()}
	}
	if _, err := bindCPUs(Spec{Bind: spec.Bind, N: 1}); err != nil {
		return &JobError{Kind: ErrSpec, Rank: -1, Code: 2, Detail: err.Error()}
	}
	launcher := spec.LauncherExec
	if launcher == "" {
		launcher = "ssh"
	}
	proxy := spec.ProxyCommand
	if len(proxy) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return startErr(1, "the launcher's own path, for its proxies: %v", err)
		}
		proxy = []string{exe, ProxyFlag}
	}
	prog := spec.Prog
	if strings.ContainsRune(prog, '/') && !filepath.IsAbs(prog) {
		if prog, err = filepath.Abs(prog); err != nil {
			return startErr(1, "%v", err)
		}
	}
	addr, err := launchAddr(spec.LaunchIface)
	if err != nil {
		return &JobError{Kind: ErrSpec, Rank: -1, Code: 2, Detail: err.Error()}
	}
	pmiLn, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return startErr(1, "PMI listener: %v", err)
	}
	defer pmiLn.Close()
	ctlLn, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return startErr(1, "control listener: %v", err)
	}
	defer ctlLn.Close()
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return startErr(1, "token: %v", err)
	}
	token := hex.EncodeToString(tok[:])
	secret, err := jobSecret()
	if err != nil {
		return startErr(1, "%v", err)
	}

	n := spec.N
	aborts := make(chan abortEvent, n)
	pmiState := make([]atomic.Uint32, n)
	j := &job{spec: spec, exits: make(chan exitEvent, n), pmiState: pmiState, remote: true}
	hosts := make([]*remoteHost, len(spec.Hosts))
	for k, h := range spec.Hosts {
		hosts[k] = &remoteHost{index: k, name: h.Name, ended: make(chan struct{})}
	}
	for r := range n {
		h := hosts[place[r]]
		h.ranks = append(h.ranks, r)
		j.ranks = append(j.ranks, &rank{id: r, host: h, served: make(chan struct{})})
	}
	// Each host's launcher command copies output on goroutines of its own,
	// and the PMI server reports from one per rank.
	outMu, errMu := new(sync.Mutex), new(sync.Mutex)
	if spec.Stdout == spec.Stderr {
		errMu = outMu
	}
	stdout, stderr := spec.Stdout, spec.Stderr
	if _, isFile := stdout.(*os.File); !isFile {
		stdout = &lockedWriter{mu: outMu, w: spec.Stdout}
	}
	if _, isFile := stderr.(*os.File); !isFile {
		stderr = &lockedWriter{mu: errMu, w: spec.Stderr}
	}

	cfg := serverConfig(n, "amgo_"+token[:12], aborts, pmiState, stderr)
	// Once per rank: the server refuses a second connection for a rank
	// before it would call this.
	cfg.OnDisconnect = func(r int) { close(j.ranks[r].served) }
	j.srv, err = pmi.NewServer(cfg)
	if err != nil {
		return startErr(1, "%v", err)
	}
	var connMu sync.Mutex
	go func() { // PMI: one TCP connection per rank, identified by PMI_ID
		for {
			c, err := pmiLn.Accept()
			if err != nil {
				return
			}
			connMu.Lock()
			j.conns = append(j.conns, c)
			connMu.Unlock()
			j.served.Add(1)
			go func() {
				defer j.served.Done()
				// A connection that breaks is a rank that died, which its
				// proxy reports; protocol errors go to OnError.
				_ = j.srv.Serve(-1, c)
				c.Close()
			}()
		}
	}()
	defer func() {
		pmiLn.Close()
		connMu.Lock()
		for _, c := range j.conns {
			c.Close()
		}
		connMu.Unlock()
		j.served.Wait()
	}()

	env := rankEnv(spec.Env, spec.Transport, "", n)
	env = append(env, "AMGO_JOB_SECRET="+secret)
	if spec.Iface != "" {
		env = append(env, "AMGO_IFACE="+spec.Iface)
	}
	fwd := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !hostLocalEnv[k] && k != "AMGO_JOB_DIR" {
			fwd = append(fwd, kv)
		}
	}
	wd, _ := os.Getwd()
	// Start every host's proxy.
	var stdins []io.Closer
	defer func() {
		for _, c := range stdins {
			c.Close()
		}
	}()
	hostEnded := make(chan *remoteHost, len(hosts))
	used := 0
	for _, h := range hosts {
		if len(h.ranks) == 0 {
			close(h.ended)
			continue
		}
		used++
		args := append(append([]string(nil), proxy...), ctlLn.Addr().String(), strconv.Itoa(h.index))
		var cmd *exec.Cmd
		if isLocalHost(h.name) {
			cmd = exec.Command(args[0], args[1:]...)
		} else {
			q := make([]string, len(args))
			for i, a := range args {
				q[i] = shellQuote(a)
			}
			cmd = exec.Command(launcher, h.name, strings.Join(q, " "))
		}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		cmd.WaitDelay = time.Second
		in, err := cmd.StdinPipe()
		if err != nil {
			return startErr(1, "host %s: %v", h.name, err)
		}
		stdins = append(stdins, in)
		if err := cmd.Start(); err != nil {
			j.endHosts(hosts)
			return startErr(127, "host %s: cannot run the launcher command %q: %v", h.name, launcher, err)
		}
		h.cmd = cmd
		go func() {
			_ = cmd.Wait()
			h.state = cmd.ProcessState
			close(h.ended)
			hostEnded <- h
		}()
		go func() { _, _ = io.WriteString(in, token+"\n") }() // a pipe write may wait for the reader
	}
	defer j.endHosts(hosts)

	// Wait for every proxy to connect back and prove the token.
	conns := make(chan net.Conn)
	go func() {
		for {
			c, err := ctlLn.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c
		}
	}()
	connectTimeout := spec.ConnectTimeout
	if connectTimeout <= 0 {
		connectTimeout = DefaultConnectTimeout
	}
	deadline := time.After(connectTimeout)
	for connected := 0; connected < used; {
		select {
		case c, ok := <-conns:
			if !ok {
				return startErr(1, "control listener closed")
			}
			h := hello(c, token, hosts)
			if h == nil {
				c.Close()
				continue
			}
			keepAlive(c)
			h.ctl = newCtlConn(c)
			connected++
		case h := <-hostEnded:
			if h.ctl == nil {
				return startErr(255, "host %s: the launcher command (%s) ended with %v before the host's proxy connected back to %s (is the same amrun at %s on that host?)",
					h.name, launcher, h.state, ctlLn.Addr(), proxy[0])
			}
		case <-deadline:
			var missing []string
			for _, h := range hosts {
				if h.ctl == nil && len(h.ranks) > 0 {
					missing = append(missing, h.name)
				}
			}
			return startErr(1, "no proxy connected back from host(s) %s within %v (is %s reachable from them? set --launch-iface)",
				strings.Join(missing, ", "), connectTimeout, ctlLn.Addr())
		case <-ctx.Done():
			return &JobError{Kind: ErrInterrupted, Rank: -1, Code: 130, Detail: "job cancelled: " + context.Cause(ctx).Error()}
		}
	}
	go func() { // late or stray connections
		for c := range conns {
			c.Close()
		}
	}()
	for _, h := range hosts {
		if h.ctl == nil {
			continue
		}
		err := h.ctl.send(ctlMsg{Job: &ctlJob{
			Host: h.name, Ranks: h.ranks, Size: n, Prog: prog, Args: spec.Args, Env: fwd, Dir: wd,
			PMIPort: pmiLn.Addr().String(), TagOutput: spec.TagOutput, Bind: spec.Bind, Transport: spec.Transport,
			TimerSlack: int64(spec.TimerSlack), Grace: int64(spec.Grace), JobDirParent: spec.JobDirParent,
		}})
		if err != nil {
			return startErr(1, "host %s: sending the job to its proxy: %v", h.name, err)
		}
		go j.readHost(h)
	}
	if spec.OnStart != nil {
		spec.OnStart("", nil)
	}
	return j.supervise(ctx, aborts)
}

// hello reads and checks a proxy's first line; it returns the host it
// proved to be, or nil.
func hello(c net.Conn, token string, hosts []*remoteHost) *remoteHost {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	line, err := bufio.NewReaderSize(c, 512).ReadSlice('\n')
	if err != nil {
		return nil
	}
	var m ctlMsg
	if json.Unmarshal(line, &m) != nil || m.Hello == nil || m.Hello.Host < 0 || m.Hello.Host >= len(hosts) {
		return nil
	}
	if subtle.ConstantTimeCompare([]byte(m.Hello.Token), []byte(token)) != 1 {
		return nil
	}
	h := hosts[m.Hello.Host]
	if h.ctl != nil || len(h.ranks) == 0 {
		return nil
	}
	return h
}

// readHost turns a proxy's reports into exit events; when its connection
// breaks with ranks unreported, those ranks were lost with the host.
func (j *job) readHost(h *remoteHost) {
	left := map[int]bool{}
	for _, r := range h.ranks {
		left[r] = true
	}
	var err error
	for len(left) > 0 {
		var m ctlMsg
		if err = h.ctl.dec.Decode(&m); err != nil {
			break
		}
		if m.Exit == nil || !left[m.Exit.Rank] {
			continue
		}
		delete(left, m.Exit.Rank)
		j.ranks[m.Exit.Rank].gone.Store(true)
		j.exits <- exitEvent{rank: m.Exit.Rank, remote: m.Exit}
	}
	if len(left) == 0 {
		return
	}
	if errors.Is(err, io.EOF) {
		err = errors.New("connection closed")
	}
	lost := make([]int, 0, len(left))
	for _, r := range h.ranks {
		if left[r] {
			lost = append(lost, r)
		}
	}
	detail := fmt.Sprintf("was lost with host %s (ranks %s there): its proxy's control connection broke (%v)",
		h.name, rankList(lost), err)
	for _, r := range lost {
		j.ranks[r].gone.Store(true)
	}
	for _, r := range lost {
		j.exits <- exitEvent{rank: r, remote: &ctlExit{Rank: r, Code: 1, Detail: detail}}
	}
}

// rankList formats ranks as "2, 3, 5".
func rankList(rs []int) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = strconv.Itoa(r)
	}
	return strings.Join(s, ", ")
}

// endHosts closes the control connections (a proxy then ends what is left
// of its ranks and exits) and waits a little for the proxies' launcher
// commands, killing those that stay.
func (j *job) endHosts(hosts []*remoteHost) {
	for _, h := range hosts {
		if h.ctl != nil {
			h.ctl.c.Close()
		}
	}
	deadline := time.After(j.spec.Grace + time.Second)
	for _, h := range hosts {
		if h.cmd == nil {
			continue
		}
		select {
		case <-h.ended:
		case <-deadline:
			_ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
			<-h.ended
		}
	}
}

// RunProxy runs a host's part of a job that spans hosts: args are what
// follows ProxyFlag on its command line (the launcher's control address and
// this host's index), the one-time token comes on stdin. It returns the
// proxy's exit status: 0 once every rank of this host has ended and been
// reported (the ranks' own statuses go to the launcher), 1 when the job
// could not be received, 2 for bad arguments.
func RunProxy(args []string, stdin io.Reader, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintf(stderr, "amrun proxy: want %s <control address> <host index>, got %q\n", ProxyFlag, args)
		return 2
	}
	host, err := strconv.Atoi(args[1])
	if err != nil || host < 0 {
		fmt.Fprintf(stderr, "amrun proxy: bad host index %q\n", args[1])
		return 2
	}
	tok := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdin).ReadString('\n')
		tok <- strings.TrimSpace(line)
	}()
	var token string
	select {
	case token = <-tok:
	case <-time.After(30 * time.Second):
		fmt.Fprintln(stderr, "amrun proxy: no token on standard input")
		return 1
	}
	c, err := net.DialTimeout("tcp", args[0], 30*time.Second)
	if err != nil {
		fmt.Fprintf(stderr, "amrun proxy: connect to the launcher: %v\n", err)
		return 1
	}
	defer c.Close()
	keepAlive(c)
	ctl := newCtlConn(c)
	if err := ctl.send(ctlMsg{Hello: &ctlHello{Host: host, Token: token}}); err != nil {
		fmt.Fprintf(stderr, "amrun proxy: %v\n", err)
		return 1
	}
	var m ctlMsg
	if err := ctl.dec.Decode(&m); err != nil || m.Job == nil {
		fmt.Fprintf(stderr, "amrun proxy: no job from the launcher: %v\n", err)
		return 1
	}
	runProxyJob(ctl, m.Job, stderr)
	return 0
}

// runProxyJob starts a host's ranks, reports their exits and obeys the
// launcher's signals until every rank has ended.
func runProxyJob(ctl *ctlConn, jb *ctlJob, stderr io.Writer) {
	report := func(r int, e ctlExit) {
		e.Rank = r
		_ = ctl.send(ctlMsg{Exit: &e})
	}
	failAll := func(code int, detail string) {
		for _, r := range jb.Ranks {
			report(r, ctlExit{Code: code, Detail: detail})
		}
	}
	host := jb.Host
	jobDir, err := makeJobDir(jb.JobDirParent)
	if err != nil {
		failAll(1, fmt.Sprintf("could not be started on host %s: %v", host, err))
		return
	}
	defer os.RemoveAll(jobDir)
	path, err := exec.LookPath(jb.Prog)
	if err != nil {
		failAll(127, fmt.Sprintf("could not be started on host %s: %v", host, err))
		return
	}
	env := os.Environ()
	for _, kv := range jb.Env {
		k, _, _ := strings.Cut(kv, "=")
		if !hostLocalEnv[k] {
			env = append(env, kv) // the last value of a key wins (os/exec)
		}
	}
	env = append(env, "AMGO_JOB_DIR="+jobDir)
	spec := Spec{N: len(jb.Ranks), Args: jb.Args, Prog: jb.Prog, Transport: jb.Transport, Bind: jb.Bind,
		TagOutput: jb.TagOutput, TimerSlack: time.Duration(jb.TimerSlack), Grace: time.Duration(jb.Grace),
		Stdout: os.Stdout, Stderr: os.Stderr}
	if spec.Grace <= 0 {
		spec.Grace = DefaultGrace
	}
	cpus, err := bindCPUs(spec)
	if err != nil {
		failAll(2, err.Error())
		return
	}
	p := &job{spec: spec, exits: make(chan exitEvent, len(jb.Ranks)), cpus: cpus, pmiPort: jb.PMIPort}
	defer p.cleanup()
	if st, err := os.Stat(jb.Dir); err == nil && st.IsDir() {
		p.dir = jb.Dir
	}
	outMu, errMu := new(sync.Mutex), new(sync.Mutex)
	for i, r := range jb.Ranks {
		if err := p.start(i, r, jb.Size, path, env, outMu, errMu); err != nil {
			p.ranks = append(p.ranks, &rank{id: r, exited: true})
			report(r, ctlExit{Code: 1, Detail: fmt.Sprintf("could not be started on host %s: %v", host, err)})
		}
	}
	msgs := make(chan ctlMsg)
	go func() {
		defer close(msgs)
		for {
			var m ctlMsg
			if ctl.dec.Decode(&m) != nil {
				return
			}
			msgs <- m
		}
	}()
	var killTimer <-chan time.Time
	for p.running() > 0 {
		select {
		case ev := <-p.exits:
			rk := p.ranks[ev.rank]
			rk.exited = true
			detail, code, ok := describe(ev)
			report(rk.id, ctlExit{OK: ok, Code: code, Detail: detail})
		case m, ok := <-msgs:
			if !ok { // the launcher is gone: end the ranks
				msgs = nil
				p.killAll(syscall.SIGTERM)
				killTimer = time.After(spec.Grace)
				continue
			}
			if m.Signal != nil {
				for _, rk := range p.ranks {
					if (rk.id == m.Signal.Rank || m.Signal.Rank < 0) && !rk.exited {
						_ = syscall.Kill(-rk.pgid, syscall.Signal(m.Signal.Sig))
					}
				}
			}
		case <-killTimer:
			killTimer = nil
			p.killAll(syscall.SIGKILL)
		}
	}
}
