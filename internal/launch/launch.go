package launch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amgo-hpc/amgo/internal/pmi"
)

// Errors a job can end with; Run wraps them in a *JobError.
var (
	// ErrSpec: the Spec is invalid (N < 1, no program, bad transport name).
	ErrSpec = errors.New("launch: invalid job spec")
	// ErrStart: the job could not be set up or a rank could not be started.
	ErrStart = errors.New("launch: cannot start job")
	// ErrRankFailed: a rank exited with a non-zero status or died by a signal.
	ErrRankFailed = errors.New("launch: rank failed")
	// ErrAborted: a rank called PMI abort.
	ErrAborted = errors.New("launch: rank aborted the job")
	// ErrTimeout: the job ran longer than Spec.Timeout.
	ErrTimeout = errors.New("launch: job timed out")
	// ErrInterrupted: the launcher got a signal (forwarded to the ranks) or
	// its context was cancelled.
	ErrInterrupted = errors.New("launch: job interrupted")
)

// DefaultGrace is how long ranks get between SIGTERM and SIGKILL when a job
// is torn down.
const DefaultGrace = 2 * time.Second

// DefaultDumpWait is how long ranks get to report their pending operations
// (Spec.DumpSignal) before a timed-out job is ended.
const DefaultDumpWait = time.Second

// Spec describes a job.
type Spec struct {
	// N is the number of ranks, at least 1.
	N int
	// Prog is the program to run (looked up in PATH) and Args its arguments.
	Prog string
	Args []string
	// Transport is given to ranks as AMGO_TRANSPORT; "" sets none, and each
	// rank then reaches the ranks of its node over shm and the others over
	// AMGO_NET (package job). With
	// "loop" or "sim" one process is started (PMI_SIZE=1) with
	// AMGO_LOOP_SIZE=N and runs the N ranks as goroutines.
	Transport string
	// Bind is how ranks are bound to CPUs: "core" binds rank r to the r-th
	// CPU this process may run on (modulo their number) by giving it
	// AMGO_BIND_CPU; "none" leaves ranks to the scheduler; "" (auto) binds
	// when every rank gets a CPU of its own, as Open MPI's mpirun binds two
	// or fewer processes to cores by default. Goroutine ranks (loop, sim)
	// are never bound.
	Bind string
	// Iface, if set, is given to ranks as AMGO_IFACE: the network interface
	// (a name such as "eth0", or an IP address) that network transports
	// (tcp) listen on. "" leaves AMGO_IFACE to the base environment.
	Iface string
	// TagOutput prefixes every line a rank writes with "[rank] ", stdout and
	// stderr separately, whole lines at a time.
	TagOutput bool
	// Timeout ends the job with ErrTimeout when it passes; 0 means none.
	Timeout time.Duration
	// JobDirParent is where the per-job directory amgo-<pid>-<random> is
	// created (mode 0700) and given to ranks as AMGO_JOB_DIR; "" means
	// /dev/shm if usable, else os.TempDir(). The per-job directory is removed
	// with everything in it when the job ends.
	JobDirParent string
	// Stdout and Stderr receive the ranks' output; nil means os.Stdout and
	// os.Stderr. Stdin of the ranks is /dev/null.
	Stdout, Stderr io.Writer
	// Env is the ranks' base environment; nil means os.Environ(). PMI_* and
	// the AMGO_* variables amrun sets are replaced.
	Env []string
	// Grace is the wait between SIGTERM and SIGKILL; 0 means DefaultGrace.
	Grace time.Duration
	// DumpSignal, if not 0, asks every rank to report what it waits for
	// (amgo ranks print their pending operations on SIGUSR1): when the
	// timeout passes, the ranks get it and DumpWait (0: DefaultDumpWait) to
	// report before they are ended; and when it arrives on Signals, it is
	// forwarded to every rank and the job goes on.
	DumpSignal syscall.Signal
	DumpWait   time.Duration
	// Signals, if set, are forwarded to every rank as they arrive (amrun
	// passes SIGINT and SIGTERM); the job then ends with ErrInterrupted.
	Signals <-chan os.Signal
	// TimerSlack is the timer slack the ranks start with (Linux
	// PR_SET_TIMERSLACK, in nanoseconds of a time.Duration: how late the
	// kernel may fire a rank's timed sleeps so as to batch wake-ups); 0 means
	// DefaultTimerSlack, a negative value leaves the launcher's own (50 us by
	// default). A Go process's runtime monitor thread (sysmon) sleeps 20 us
	// at a time for the first milliseconds after start and after every
	// blocking system call; each of its wake-ups takes a busy-polling rank's
	// CPU away for microseconds, which shows in small-message latency while
	// it lasts (docs/performance.md, "The Go runtime's sysmon"). With 1 ms of
	// slack it wakes about once a millisecond. The price: timed sleeps in the
	// ranks may end up to the slack late; wake-ups by events are not delayed.
	TimerSlack time.Duration
	// OnStart, if set, is called once all ranks are running, with the job
	// directory's path and the ranks' process IDs (for tests and logging);
	// for a job on Hosts, once every host's proxy has its job, with "" and
	// nil (each host has its own job directory).
	OnStart func(jobDir string, pids []int)

	// Hosts, if set, spreads the ranks over these hosts (placed by Place
	// with MapBy), each reached through LauncherExec: see RunProxy and
	// docs/launch.md. Nil runs every rank on this host as a child of Run.
	Hosts []Host
	// MapBy is how ranks are placed on Hosts: "" or "slot" in blocks,
	// "node" round-robin (Place).
	MapBy string
	// LauncherExec is the command that runs a command on a host, called as
	// "LauncherExec host command" the way ssh is; "" means ssh. Hosts
	// named localhost or this host's name are started directly.
	LauncherExec string
	// LaunchIface is the interface name or IP address at which the
	// proxies and ranks on Hosts reach the launcher (control and PMI
	// connections); "" means the address of this host's name (launchAddr).
	LaunchIface string
	// ProxyCommand is the command that runs a host's proxy, to which the
	// control address and host index are appended; nil means this
	// executable with ProxyFlag (cmd/amrun answers it with RunProxy). It
	// must exist at the same path on every host, as Hydra's proxy must.
	ProxyCommand []string
	// ConnectTimeout bounds how long the proxies of Hosts may take to
	// connect back; 0 means DefaultConnectTimeout.
	ConnectTimeout time.Duration
}

// DefaultTimerSlack is the timer slack ranks start with when Spec.TimerSlack
// is 0: see Spec.TimerSlack.
const DefaultTimerSlack = time.Millisecond

// JobError is the error Run returns for a job that did not succeed.
type JobError struct {
	// Kind is one of the Err* values above (errors.Is matches it).
	Kind error
	// Rank is the rank that caused the failure, or -1.
	Rank int
	// Code is the exit status the launcher should exit with (1..255).
	Code int
	// Detail describes the cause: exit status, signal, abort message.
	Detail string
}

func (e *JobError) Error() string {
	if e.Rank >= 0 {
		return fmt.Sprintf("rank %d %s", e.Rank, e.Detail)
	}
	return e.Detail
}

// Unwrap returns Kind.
func (e *JobError) Unwrap() error { return e.Kind }

// ExitCode returns the exit status a launcher should use for err: 0 for nil,
// JobError.Code for a *JobError, 1 otherwise.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var je *JobError
	if errors.As(err, &je) && je.Code > 0 {
		return je.Code
	}
	return 1
}

var transportName = regexp.MustCompile(`^[a-z0-9_-]+$`)

// rank is one started process: a child of this launcher, or (host set) a
// rank on another host, run by that host's proxy.
type rank struct {
	id     int // rank in the job
	cmd    *exec.Cmd
	pgid   int
	exited bool
	outs   sync.WaitGroup // output copiers
	pipes  []*os.File     // read ends, closed at the end
	served chan struct{}  // closed when its PMI connection has been read to the end
	host   *remoteHost
	gone   atomic.Bool // remote: its end has been reported
}

// signal sends sig to the rank's process group, through its proxy for a
// remote rank.
func (rk *rank) signal(sig syscall.Signal) {
	switch {
	case rk.host != nil:
		if rk.host.ctl != nil {
			_ = rk.host.ctl.send(ctlMsg{Signal: &ctlSignal{Rank: rk.id, Sig: int(sig)}})
		}
	case rk.pgid > 0:
		_ = syscall.Kill(-rk.pgid, sig)
	}
}

// ended reports whether the rank has ended although supervise may not have
// handled its exit yet.
func (rk *rank) ended() bool {
	if rk.host != nil {
		return rk.gone.Load()
	}
	return rk.cmd != nil && rk.cmd.Process != nil && processEnded(rk.cmd.Process.Pid)
}

// exitEvent is a rank's end: rank indexes job.ranks; state and err come
// from a child's Wait, remote from a proxy's report.
type exitEvent struct {
	rank   int
	state  *os.ProcessState
	err    error
	remote *ctlExit
}

type abortEvent struct {
	rank, code int
	msg        string
}

// Run starts the job described by spec, serves it PMI-1, and waits for every
// rank to end. It returns nil only if every rank exited with status 0.
// Otherwise it returns a *JobError: the first failure (a rank's non-zero exit
// or death by signal, a PMI abort, the timeout, a forwarded signal or ctx's
// cancellation) names the cause; the remaining ranks then get SIGTERM and,
// after the grace period, SIGKILL (each rank runs in its own process group,
// which is killed as a whole). The job directory is removed in every case.
func Run(ctx context.Context, spec Spec) error {
	if spec.N < 1 {
		return &JobError{Kind: ErrSpec, Rank: -1, Code: 2, Detail: fmt.Sprintf("need at least 1 rank, got %d", spec.N)}
	}
	if spec.Prog == "" {
		return &JobError{Kind: ErrSpec, Rank: -1, Code: 2, Detail: "no program given"}
	}
	if spec.Transport != "" && !transportName.MatchString(spec.Transport) {
		return &JobError{Kind: ErrSpec, Rank: -1, Code: 2, Detail: fmt.Sprintf("bad transport name %q", spec.Transport)}
	}
	if spec.Stdout == nil {
		spec.Stdout = os.Stdout
	}
	if spec.Stderr == nil {
		spec.Stderr = os.Stderr
	}
	if spec.DumpWait <= 0 {
		spec.DumpWait = DefaultDumpWait
	}
	if spec.Grace <= 0 {
		spec.Grace = DefaultGrace
	}
	if spec.Env == nil {
		spec.Env = os.Environ()
	}
	if spec.TimerSlack == 0 {
		spec.TimerSlack = DefaultTimerSlack
	}
	if len(spec.Hosts) > 0 {
		return runHosts(ctx, spec)
	}
	cpus, err := bindCPUs(spec)
	if err != nil {
		return &JobError{Kind: ErrSpec, Rank: -1, Code: 2, Detail: err.Error()}
	}
	path, err := exec.LookPath(spec.Prog)
	if err != nil {
		return &JobError{Kind: ErrStart, Rank: -1, Code: 127, Detail: err.Error()}
	}

	jobDir, err := makeJobDir(spec.JobDirParent)
	if err != nil {
		return &JobError{Kind: ErrStart, Rank: -1, Code: 1, Detail: err.Error()}
	}
	defer os.RemoveAll(jobDir)

	nproc := spec.N
	if inProcess(spec.Transport) {
		nproc = 1
	}
	aborts := make(chan abortEvent, nproc)
	pmiState := make([]atomic.Uint32, nproc) // pmiInit, then pmiFinalized
	outMu, errMu := new(sync.Mutex), new(sync.Mutex)
	if spec.Stdout == spec.Stderr {
		errMu = outMu
	}
	// The PMI server reports from one goroutine per rank, beside the ranks'
	// own output: under the same lock.
	srv, err := pmi.NewServer(serverConfig(nproc, strings.ReplaceAll(lastElem(jobDir), "-", "_"), aborts, pmiState,
		&lockedWriter{mu: errMu, w: spec.Stderr}))
	if err != nil {
		return &JobError{Kind: ErrStart, Rank: -1, Code: 1, Detail: err.Error()}
	}

	j := &job{spec: spec, srv: srv, exits: make(chan exitEvent, nproc), cpus: cpus, pmiState: pmiState}
	defer j.cleanup()
	secret, err := jobSecret()
	if err != nil {
		return &JobError{Kind: ErrStart, Rank: -1, Code: 1, Detail: err.Error()}
	}
	env := rankEnv(spec.Env, spec.Transport, jobDir, spec.N)
	env = append(env, "AMGO_JOB_SECRET="+secret)
	if spec.Iface != "" {
		env = append(env, "AMGO_IFACE="+spec.Iface)
	}
	if !spec.TagOutput {
		// exec copies non-file writers from several goroutines: serialize.
		if _, isFile := spec.Stdout.(*os.File); !isFile {
			j.spec.Stdout = &lockedWriter{mu: outMu, w: spec.Stdout}
		}
		if _, isFile := spec.Stderr.(*os.File); !isFile {
			j.spec.Stderr = &lockedWriter{mu: errMu, w: spec.Stderr}
		}
	}
	for r := 0; r < nproc; r++ {
		if err := j.start(r, r, nproc, path, env, outMu, errMu); err != nil {
			j.killAll(syscall.SIGKILL)
			j.waitAll()
			return &JobError{Kind: ErrStart, Rank: r, Code: 1, Detail: "could not be started: " + err.Error()}
		}
	}
	if spec.OnStart != nil {
		pids := make([]int, nproc)
		for i, rk := range j.ranks {
			pids[i] = rk.cmd.Process.Pid
		}
		spec.OnStart(jobDir, pids)
	}
	return j.supervise(ctx, aborts)
}

// serverConfig is the PMI server's configuration for a job of size ranks:
// aborts are queued for supervise, init and finalize recorded in pmiState,
// protocol errors reported on stderr.
func serverConfig(size int, kvsName string, aborts chan<- abortEvent, pmiState []atomic.Uint32, stderr io.Writer) pmi.ServerConfig {
	return pmi.ServerConfig{
		Size:    size,
		KVSName: kvsName,
		OnAbort: func(r, code int, msg string) {
			select {
			case aborts <- abortEvent{r, code, msg}:
			default:
			}
		},
		OnInit:     func(r int) { pmiState[r].CompareAndSwap(0, pmiInit) },
		OnFinalize: func(r int) { pmiState[r].Store(pmiFinalized) },
		OnError: func(r int, err error) {
			fmt.Fprintf(stderr, "amrun: rank %d: PMI: %v\n", r, err)
		},
	}
}

type job struct {
	spec   Spec
	srv    *pmi.Server
	ranks  []*rank
	conns  []net.Conn
	exits  chan exitEvent
	served sync.WaitGroup
	cpus   []int // ranks[i] is bound to cpus[i%len(cpus)]; nil: not bound
	// pmiState[r] is 0 until rank r's PMI init, then pmiInit, then
	// pmiFinalized: a rank that exits 0 in between never finalized.
	pmiState []atomic.Uint32
	// pmiPort, if set, is the launcher's PMI address (a proxy's ranks
	// connect to it: PMI_PORT, PMI_ID); else each rank gets a socketpair.
	pmiPort string
	dir     string // the ranks' working directory; "": inherited
	remote  bool   // the ranks run on Hosts, under proxies
}

// remoteSettle is how long a job on several hosts waits for other hosts'
// reports before it blames a rank that ended after Init without Finalize or
// aborted (supervise's settle).
const remoteSettle = 200 * time.Millisecond

const (
	pmiInit      = 1
	pmiFinalized = 2
)

func lastElem(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }

// makeJobDir creates the per-job directory (mode 0700), named after this
// launcher's pid. It first removes what launchers that were killed before
// they could clean up left in the same parent (removeStaleJobDirs).
func makeJobDir(parent string) (string, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("amgo-%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
	parents := []string{parent}
	if parent == "" {
		parents = []string{"/dev/shm", os.TempDir()}
	}
	var lastErr error
	for _, p := range parents {
		removeStaleJobDirs(p)
		d := p + "/" + name
		if err := os.Mkdir(d, 0o700); err != nil {
			lastErr = err
			continue
		}
		return d, nil
	}
	return "", fmt.Errorf("create job directory: %w", lastErr)
}

// jobDirName matches the name makeJobDir gives a job directory.
var jobDirName = regexp.MustCompile(`^amgo-([0-9]+)-[0-9a-f]{12}$`)

// removeStaleJobDirs removes the job directories in parent that belong to
// this user and whose launcher no longer runs (a launcher killed by SIGKILL
// cannot remove its own). A directory whose pid is alive, or that cannot be
// checked, is left alone: at worst a reused pid keeps one stale directory.
func removeStaleJobDirs(parent string) {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range ents {
		m := jobDirName.FindStringSubmatch(e.Name())
		if m == nil || !e.IsDir() {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		var st unix.Stat_t
		if unix.Lstat(parent+"/"+e.Name(), &st) != nil || int(st.Uid) != os.Getuid() {
			continue
		}
		if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
			continue // alive (or not ours to signal): not stale
		}
		_ = os.RemoveAll(parent + "/" + e.Name())
	}
}

// jobSecret returns a fresh per-job secret, 16 random bytes in hex, given to
// every rank as AMGO_JOB_SECRET: network transports (tcp) make each new
// connection prove it before they accept its traffic.
func jobSecret() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("job secret: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// EnvBindCPU names the CPU a rank binds itself to (package am does it when
// it opens the rank's endpoint); amrun sets it when it binds ranks.
const EnvBindCPU = "AMGO_BIND_CPU"

// bindCPUs returns the CPUs ranks are bound to, in rank order (rank r gets
// element r modulo the length), or nil for no binding.
func bindCPUs(spec Spec) ([]int, error) {
	switch spec.Bind {
	case "", "core", "none":
	default:
		return nil, fmt.Errorf("bad binding %q: want core or none", spec.Bind)
	}
	if spec.Bind == "none" || inProcess(spec.Transport) {
		return nil, nil
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		if spec.Bind == "core" {
			return nil, fmt.Errorf("binding: reading this process's CPUs: %w", err)
		}
		return nil, nil
	}
	var cpus []int
	for c := 0; c < len(set)*64 && len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if spec.Bind == "" && spec.N > len(cpus) {
		return nil, nil // oversubscribed: binding would only pile ranks up
	}
	return cpus, nil
}

// rankEnv is base without variables amrun owns, plus the shared ones.
func rankEnv(base []string, transport, jobDir string, n int) []string {
	drop := map[string]bool{"PMI_FD": true, "PMI_PORT": true, "PMI_ID": true, "PMI_RANK": true, "PMI_SIZE": true,
		"PMI_SPAWNED": true, "AMGO_TRANSPORT": true, "AMGO_JOB_DIR": true, "AMGO_LOOP_SIZE": true, "AMGO_JOB_SECRET": true, EnvBindCPU: true, "AMGO_BIND": true}
	var env []string
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			env = append(env, kv)
		}
	}
	if transport != "" {
		env = append(env, "AMGO_TRANSPORT="+transport)
	}
	env = append(env, "AMGO_JOB_DIR="+jobDir)
	if inProcess(transport) {
		env = append(env, "AMGO_LOOP_SIZE="+strconv.Itoa(n))
	}
	return env
}

// inProcess reports whether a network runs the job's ranks as goroutines of
// one process: loop, and sim (the simulated faulty network).
func inProcess(transport string) bool { return transport == "loop" || transport == "sim" }

// start launches job rank id as j.ranks[idx]: with its end of a fresh
// socketpair as fd 3 served by j.srv, or with PMI_PORT when j.pmiPort is set.
func (j *job) start(idx, id, nproc int, path string, env []string, outMu, errMu *sync.Mutex) error {
	cmd := exec.Command(path, j.spec.Args...)
	cmd.Args[0] = j.spec.Prog
	cmd.Dir = j.dir
	var conn net.Conn
	if j.pmiPort != "" {
		cmd.Env = append(env[:len(env):len(env)], "PMI_PORT="+j.pmiPort, "PMI_ID="+strconv.Itoa(id),
			"PMI_RANK="+strconv.Itoa(id), "PMI_SIZE="+strconv.Itoa(nproc))
	} else {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socketpair: %w", err)
		}
		mine := os.NewFile(uintptr(fds[0]), fmt.Sprintf("pmi-%d", id))
		theirs := os.NewFile(uintptr(fds[1]), fmt.Sprintf("pmi-%d-child", id))
		defer theirs.Close()
		conn, err = net.FileConn(mine)
		mine.Close()
		if err != nil {
			return fmt.Errorf("PMI socket: %w", err)
		}
		j.conns = append(j.conns, conn)
		cmd.Env = append(env[:len(env):len(env)], "PMI_FD=3", "PMI_RANK="+strconv.Itoa(id), "PMI_SIZE="+strconv.Itoa(nproc))
		cmd.ExtraFiles = []*os.File{theirs}
	}
	if len(j.cpus) > 0 {
		cmd.Env = append(cmd.Env, EnvBindCPU+"="+strconv.Itoa(j.cpus[idx%len(j.cpus)]))
	} else {
		cmd.Env = append(cmd.Env, "AMGO_BIND=none") // the launcher decided: the rank does not bind itself
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second // do not wait forever for output held by orphans
	rk := &rank{id: id, cmd: cmd}
	if j.spec.TagOutput {
		for _, o := range []struct {
			dst *io.Writer
			w   io.Writer
			mu  *sync.Mutex
		}{{&cmd.Stdout, j.spec.Stdout, outMu}, {&cmd.Stderr, j.spec.Stderr, errMu}} {
			pr, pw, err := os.Pipe()
			if err != nil {
				for _, p := range rk.pipes {
					p.Close()
				}
				return fmt.Errorf("pipe: %w", err)
			}
			*o.dst = pw
			rk.pipes = append(rk.pipes, pr, pw)
			rk.outs.Add(1)
			go func() { defer rk.outs.Done(); tagCopy(o.w, o.mu, pr, fmt.Sprintf("[%d] ", id)) }()
		}
	} else {
		cmd.Stdout, cmd.Stderr = j.spec.Stdout, j.spec.Stderr
	}
	err := startWithSlack(cmd, j.spec.TimerSlack)
	// The write ends belong to the child now.
	for i := 1; i < len(rk.pipes); i += 2 {
		rk.pipes[i].Close()
	}
	if err != nil {
		for _, p := range rk.pipes {
			p.Close()
		}
		return err
	}
	rk.pgid = cmd.Process.Pid
	j.ranks = append(j.ranks, rk)
	rk.served = make(chan struct{})
	if conn != nil {
		j.served.Add(1)
		go func() { defer j.served.Done(); defer close(rk.served); _ = j.srv.Serve(id, conn) }()
	}
	go func() {
		err := cmd.Wait()
		j.exits <- exitEvent{rank: idx, state: cmd.ProcessState, err: err}
	}()
	return nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// tagCopy copies r to w line by line with prefix, holding mu per line.
func tagCopy(w io.Writer, mu *sync.Mutex, r io.Reader, prefix string) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			buf := make([]byte, 0, len(prefix)+len(line)+1)
			buf = append(append(buf, prefix...), line...)
			if line[len(line)-1] != '\n' {
				buf = append(buf, '\n') // partial last line or overlong chunk
			}
			mu.Lock()
			_, _ = w.Write(buf)
			mu.Unlock()
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// killAll sends sig to each running rank's process group.
func (j *job) killAll(sig syscall.Signal) {
	for _, rk := range j.ranks {
		if !rk.exited {
			rk.signal(sig)
		}
	}
}

func (j *job) running() int {
	n := 0
	for _, rk := range j.ranks {
		if !rk.exited {
			n++
		}
	}
	return n
}

// waitAll collects exit events of all started ranks (used after a failed
// start, when everything was killed).
func (j *job) waitAll() {
	for j.running() > 0 {
		ev := <-j.exits
		j.ranks[ev.rank].exited = true
	}
}

// describe turns a process state into "exited with status 3" / "was killed
// by signal 9 (killed)".
func describe(ev exitEvent) (detail string, code int, ok bool) {
	if ev.remote != nil {
		return ev.remote.Detail, ev.remote.Code, ev.remote.OK
	}
	st := ev.state
	if st == nil {
		return fmt.Sprintf("could not be waited for: %v", ev.err), 1, false
	}
	if ws, isWS := st.Sys().(syscall.WaitStatus); isWS && ws.Signaled() {
		sig := ws.Signal()
		return fmt.Sprintf("was killed by signal %d (%v)", int(sig), sig), 128 + int(sig), false
	}
	if c := st.ExitCode(); c != 0 {
		return fmt.Sprintf("exited with status %d", c), c, false
	}
	return "", 0, true
}

// supervise waits for the ranks, reacting to the first failure.
func (j *job) supervise(ctx context.Context, aborts <-chan abortEvent) error {
	var failure *JobError
	var timeout <-chan time.Time
	if j.spec.Timeout > 0 {
		tm := time.NewTimer(j.spec.Timeout)
		defer tm.Stop()
		timeout = tm.C
	}
	var killTimer <-chan time.Time
	var dumpEnd <-chan time.Time // the ranks' time to report (Spec.DumpSignal)
	terminating := false
	teardown := func(f *JobError, sig syscall.Signal) {
		if failure == nil {
			failure = f
		}
		if !terminating {
			terminating = true
			j.killAll(sig)
			killTimer = time.After(j.spec.Grace)
		}
	}
	ctxDone := ctx.Done()
	var onAbort func(a abortEvent)
	var onExit func(ev exitEvent)
	// settle gives the other hosts' reports a moment before a rank that may
	// have ended because of a peer is blamed: a lost host is known only when
	// its proxy's connection is read to its end, which may come after a
	// survivor's report of its own end (on one host, endedRanks sees the
	// dead processes at once).
	settle := func() {
		if !j.remote {
			return
		}
		deadline := time.After(remoteSettle)
		for failure == nil {
			select {
			case ev := <-j.exits:
				onExit(ev)
			case <-deadline:
				return
			}
		}
	}
	onExit = func(ev exitEvent) {
		j.ranks[ev.rank].exited = true
		if failure != nil {
			return
		}
		detail, code, ok := describe(ev)
		if !ok {
			// A rank that aborts writes its abort, then exits: the exit can
			// reach this loop first. Its connection read to the end, an
			// abort it sent is the better report.
			select {
			case <-j.ranks[ev.rank].served:
			case <-time.After(200 * time.Millisecond):
			}
			var others []abortEvent
			for drained := false; !drained; {
				select {
				case a := <-aborts:
					if a.rank == ev.rank && failure == nil {
						onAbort(a)
					} else {
						others = append(others, a)
					}
				default:
					drained = true
				}
			}
			if failure == nil {
				teardown(&JobError{Kind: ErrRankFailed, Rank: ev.rank, Code: clampCode(code), Detail: detail}, syscall.SIGTERM)
			}
			for _, a := range others {
				onAbort(a) // the job is failing already: these only end it
			}
			return
		}
		if j.pmiState != nil && j.pmiState[ev.rank].Load() == pmiInit {
			// As Hydra does: a rank that took part in the job (PMI init) and
			// ended without finalizing leaves its peers waiting for it. It
			// may have ended so because a peer died (as an abort may): a
			// rank that ended before it is the cause.
			settle()
			j.awaitEnded(j.endedRanks(ev.rank), time.Second, onExit)
			if failure == nil {
				teardown(&JobError{Kind: ErrRankFailed, Rank: ev.rank, Code: 1,
					Detail: "exited with status 0 without calling Finalize (after Init)"}, syscall.SIGTERM)
			}
		}
	}
	onAbort = func(a abortEvent) {
		// A rank that aborts because a peer died (its connection broke)
		// may reach the launcher before that peer's exit does: a peer
		// that had already ended is the cause, and is named.
		if failure == nil {
			settle()
			j.awaitEnded(j.endedRanks(a.rank), time.Second, onExit)
		}
		detail := fmt.Sprintf("called PMI abort with exit code %d", a.code)
		if a.msg != "" {
			detail += ": " + a.msg
		}
		code := a.code
		if code == 0 {
			code = 1
		}
		teardown(&JobError{Kind: ErrAborted, Rank: a.rank, Code: clampCode(code), Detail: detail}, syscall.SIGTERM)
	}
	for j.running() > 0 {
		select {
		case ev := <-j.exits:
			onExit(ev)
		case a := <-aborts:
			onAbort(a)
		case <-timeout:
			timeout = nil
			tf := &JobError{Kind: ErrTimeout, Rank: -1, Code: 124,
				Detail: fmt.Sprintf("job timed out after %v; killed %d running rank(s)", j.spec.Timeout, j.running())}
			if j.spec.DumpSignal != 0 && failure == nil && !terminating {
				// Ask the ranks what they wait for, then end the job. The
				// timeout is the cause, whatever the ranks do meanwhile (a
				// program that does not handle the signal dies of it).
				failure = tf
				j.killAll(j.spec.DumpSignal)
				dumpEnd = time.After(j.spec.DumpWait)
				continue
			}
			teardown(tf, syscall.SIGTERM)
		case <-dumpEnd:
			dumpEnd = nil
			teardown(failure, syscall.SIGTERM)
		case <-ctxDone:
			ctxDone = nil
			teardown(&JobError{Kind: ErrInterrupted, Rank: -1, Code: 130, Detail: "job cancelled: " + context.Cause(ctx).Error()}, syscall.SIGTERM)
		case sig := <-j.spec.Signals:
			s, _ := sig.(syscall.Signal)
			if s == 0 {
				s = syscall.SIGTERM
			}
			if s == j.spec.DumpSignal {
				j.killAll(s) // a request for a report, not for an end
				continue
			}
			if terminating {
				j.killAll(syscall.SIGKILL)
				continue
			}
			teardown(&JobError{Kind: ErrInterrupted, Rank: -1, Code: 128 + int(s),
				Detail: fmt.Sprintf("got signal %v; forwarded it to all ranks", sig)}, s)
		case <-killTimer:
			killTimer = nil
			j.killAll(syscall.SIGKILL)
		}
	}
	if failure != nil {
		return failure
	}
	return nil
}

// endedRanks returns the ranks other than except whose process has ended but
// whose exit supervise has not handled yet (processEnded).
func (j *job) endedRanks(except int) []int {
	var ended []int
	for r, rk := range j.ranks {
		if r == except || rk.exited {
			continue
		}
		if rk.ended() {
			ended = append(ended, r)
		}
	}
	return ended
}

// processEnded reports whether the child pid has ended, without reaping it
// (its Wait does that): waitid(2) with WNOWAIT finds it exited, or it was
// already reaped (ECHILD), or /proc shows it a zombie or gone (the kernel
// hides a zombie from other waiters while one of them reaps it).
func processEnded(pid int) bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	if errors.Is(err, unix.ECHILD) || (err == nil && info.Signo == int32(unix.SIGCHLD)) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // gone (ENOENT), or going (ESRCH while it is reaped)
	}
	// The state follows the command name, which is in parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// awaitEnded hands the exits of the ranks in ended (which have ended, so
// their Wait returns at once) to onExit, and any other exit that comes first,
// waiting at most d in all.
func (j *job) awaitEnded(ended []int, d time.Duration, onExit func(exitEvent)) {
	if len(ended) == 0 {
		return
	}
	deadline := time.After(d)
	for _, r := range ended {
		for !j.ranks[r].exited {
			select {
			case ev := <-j.exits:
				onExit(ev)
			case <-deadline:
				return
			}
		}
	}
}

func clampCode(c int) int {
	if c <= 0 || c > 255 {
		return 1
	}
	return c
}

// cleanup kills leftovers in the ranks' process groups, closes PMI
// connections and waits (briefly) for output to drain.
func (j *job) cleanup() {
	for _, rk := range j.ranks {
		if rk.pgid > 0 {
			_ = syscall.Kill(-rk.pgid, syscall.SIGKILL) // orphans of finished ranks
		}
	}
	for _, c := range j.conns {
		c.Close()
	}
	j.served.Wait()
	done := make(chan struct{})
	go func() {
		for _, rk := range j.ranks {
			rk.outs.Wait()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
	}
	for _, rk := range j.ranks {
		for i := 0; i < len(rk.pipes); i += 2 {
			rk.pipes[i].Close()
		}
	}
}

// startWithSlack starts cmd from an OS thread whose timer slack is slack
// (when positive), so that the child and every thread it creates start with
// it: the kernel copies a thread's timer slack into the tasks it clones, and
// execve keeps it. The thread gets its own slack back before it returns to
// the Go scheduler; it must not exit, since the child's Pdeathsig fires when
// the thread that forked it ends. A slack the kernel refuses is skipped: it
// only steadies timings.
func startWithSlack(cmd *exec.Cmd, slack time.Duration) error {
	if slack > 0 {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		old, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
		if err == nil && unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(slack.Nanoseconds()), 0, 0, 0) == nil {
			defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(old), 0, 0, 0)
		}
	}
	return cmd.Start()
}
