// Package launch runs an amgo job: it starts N rank processes of one program,
// serves them PMI-1 (package pmi) over one socketpair each, and supervises
// them. cmd/amrun is a thin command-line wrapper around Run.
//
// Each rank gets its end of an AF_UNIX socketpair as file descriptor 3 and the
// environment
//
//	PMI_FD=3 PMI_RANK=<r> PMI_SIZE=<n>
//	AMGO_TRANSPORT=<transport>  (only with Spec.Transport; without it each rank
//	                            chooses a network per peer: package job)
//	AMGO_JOB_DIR=<dir>          (per-job directory, mode 0700)
//
// With Spec.Transport "loop" a single process is started with PMI_SIZE=1,
// PMI_RANK=0 and AMGO_LOOP_SIZE=N; the program's library then runs N ranks as
// goroutines.
//
// The per-job directory amgo-<pid>-<random> is created under /dev/shm (else
// os.TempDir(), or Spec.JobDirParent) and removed with all its content when the
// job ends, however it ends.
//
// With Spec.Hosts the ranks are spread over several hosts: a proxy per host
// (the launcher executable run again with ProxyFlag, through ssh or
// Spec.LauncherExec) starts that host's ranks with PMI_PORT and PMI_ID
// pointing at one TCP PMI server for the whole job, and reports their exits;
// see remote.go and docs/launch.md.
//
// Every rank runs in its own process group, so that the launcher can always
// kill it and whatever it started. The first failure ends the job: a rank
// exiting non-zero or by a signal, a PMI abort, Spec.Timeout, a signal from
// Spec.Signals (forwarded to all ranks) or the context's cancellation. The
// other ranks then get SIGTERM (or the forwarded signal) and, after
// Spec.Grace (DefaultGrace, 2 s), SIGKILL. Run returns a *JobError naming the
// rank and cause; ExitCode maps it to the launcher's exit status.
package launch
