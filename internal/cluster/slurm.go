package cluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Slurm is a Slurm cluster over an emulated cluster: slurmctld in the root
// namespace on the bridge's address, one slurmd per node inside the node's
// namespaces, munge for authentication. Conf is the slurm.conf that srun
// needs (SLURM_CONF).
type Slurm struct {
	Conf string
	c    *Cluster
}

// StartSlurm starts Slurm on c and stops it when the test ends. It skips
// the test when Slurm's daemons or munge are not installed, and fails it
// when the cluster does not come up within 30 s.
func (c *Cluster) StartSlurm(t testing.TB) *Slurm {
	t.Helper()
	for _, tool := range []string{"slurmctld", "slurmd", "srun", "sinfo", "munged"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("Slurm is not installed (%s: %v); .ci/run installs slurm-wlm and munge", tool, err)
		}
	}
	dir := filepath.Join(c.Dir, "slurm")
	for _, d := range []string{"state", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := &Slurm{Conf: filepath.Join(dir, "slurm.conf"), c: c}
	if err := startMunge(dir); err != nil {
		t.Fatalf("cluster: munge: %v", err)
	}
	host, _ := os.Hostname()
	ctlPort, nodePort := freePort(), freePort()
	conf := fmt.Sprintf(`ClusterName=amgo
SlurmctldHost=%s(%s)
SlurmctldPort=%d
SlurmdPort=%d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
StateSaveLocation=%[5]s/state
SlurmdSpoolDir=%[5]s/spool-%%n
SlurmdPidFile=%[5]s/slurmd-%%n.pid
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmctldLogFile=%[5]s/log/slurmctld.log
SlurmdLogFile=%[5]s/log/slurmd-%%n.log
SlurmctldTimeout=30
SlurmdTimeout=30
`, host, c.BridgeAddr, ctlPort, nodePort, dir)
	var names []string
	for _, nd := range c.Nodes {
		if err := os.MkdirAll(filepath.Join(dir, "spool-"+nd.Name), 0o755); err != nil {
			t.Fatal(err)
		}
		conf += fmt.Sprintf("NodeName=%s NodeAddr=%s CPUs=2 State=UNKNOWN\n", nd.Name, nd.Addr)
		names = append(names, nd.Name)
	}
	conf += "PartitionName=amgo Nodes=" + strings.Join(names, ",") + " Default=YES MaxTime=INFINITE State=UP\n"
	if err := os.WriteFile(s.Conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	ctl := exec.Command("slurmctld", "-D", "-i", "-f", s.Conf)
	ctlLog := logFile(dir, "slurmctld.out")
	ctl.Stdout, ctl.Stderr = ctlLog, ctlLog
	if err := ctl.Start(); err != nil {
		t.Fatalf("cluster: slurmctld: %v", err)
	}
	t.Cleanup(func() { _ = ctl.Process.Kill(); _ = ctl.Wait() })
	for k, nd := range c.Nodes {
		d := c.Command(k, "slurmd", "-D", "-f", s.Conf, "-N", nd.Name)
		dLog := logFile(dir, "slurmd-"+nd.Name+".out")
		d.Stdout, d.Stderr = dLog, dLog
		if err := d.Start(); err != nil {
			t.Fatalf("cluster: slurmd on %s: %v", nd.Name, err)
		}
		t.Cleanup(func() { _ = d.Process.Kill(); _ = d.Wait() })
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		info := exec.Command("sinfo", "-h", "-o", "%t", "-N")
		info.Env = append(os.Environ(), "SLURM_CONF="+s.Conf)
		out, err := info.Output()
		states := strings.Fields(string(out))
		idle := err == nil && len(states) == len(c.Nodes)
		for _, st := range states {
			idle = idle && st == "idle"
		}
		if idle {
			return s
		}
		if time.Now().After(deadline) {
			logs, _ := exec.Command("sh", "-c", "tail -n 20 "+dir+"/log/* "+dir+"/*.out").CombinedOutput()
			t.Fatalf("cluster: Slurm nodes not idle after 30 s (sinfo: %q, %v)\n%s", out, err, logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Srun returns the command srun args... against this cluster.
func (s *Slurm) Srun(args ...string) *exec.Cmd {
	cmd := exec.Command("srun", args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+s.Conf)
	return cmd
}

// startMunge starts munged (once per host) with a key of its own, when it
// is not running already.
func startMunge(dir string) error {
	if _, err := os.Stat("/run/munge/munge.socket.2"); err == nil {
		if exec.Command("munge", "-n").Run() == nil {
			return nil
		}
	}
	if err := os.MkdirAll("/run/munge", 0o755); err != nil {
		return err
	}
	_ = exec.Command("chown", "munge:munge", "/run/munge").Run()
	if _, err := os.Stat("/etc/munge/munge.key"); err != nil {
		if out, err := exec.Command("mungekey", "-c").CombinedOutput(); err != nil {
			return fmt.Errorf("mungekey: %v: %s", err, out)
		}
		_ = exec.Command("chown", "munge:munge", "/etc/munge/munge.key").Run()
	}
	out, err := exec.Command("runuser", "-u", "munge", "--", "munged").CombinedOutput()
	if err != nil {
		return fmt.Errorf("munged: %v: %s", err, out)
	}
	for range 50 {
		if exec.Command("munge", "-n").Run() == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("munged does not answer")
}

// freePort returns a TCP port free on this host now.
func freePort() int {
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		return 6817
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// logFile opens a daemon's output file in dir/log (the daemon inherits it;
// the process keeps it until it exits). On failure output is discarded.
func logFile(dir, name string) *os.File {
	f, err := os.OpenFile(filepath.Join(dir, "log", name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		f, _ = os.Open(os.DevNull)
	}
	return f
}
