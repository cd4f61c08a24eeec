// Package pmi implements the PMI-1 "simple" wire protocol that MPICH's Hydra
// mpiexec and Slurm (srun --mpi=pmi2) speak, in pure Go: a Client that ranks
// use to find each other (it implements transport.Bootstrap) and a Server that
// the launcher amrun runs.
//
// # Wire
//
// One message per line: "cmd=<name>" then space-separated key=value pairs,
// ended by "\n". In values a backslash escapes the next byte ("\ " is a space,
// "\\" a backslash), as MPICH's parser reads them. ParseLine and FormatLine
// convert between text and Line.
//
// # Client
//
// FromEnv finds the launcher as MPICH's PMI_Init does: PMI_FD (inherited
// socket, with PMI_RANK and PMI_SIZE), else PMI_PORT (TCP, with the PMI_ID
// handshake), else a singleton of size 1. It sends
//
//	cmd=init pmi_version=1 pmi_subversion=1
//	cmd=get_maxes
//	cmd=get_my_kvsname
//	cmd=get_appnum
//
// and accepts the reply variants of MPICH-4 Hydra (rc=0 first, version 1.2),
// MPICH-3 Hydra (rc last or missing, msg=success, version 1.1) and Slurm.
// Put, Fence and Get map to put, barrier_in/barrier_out and get; any get
// reply with rc != 0 (Hydra 4 and Slurm: rc=1; Hydra 3: rc=-1
// msg=key_<k>_not_found) is ErrNotFound.
//
// # Server
//
// The server answers exactly as MPICH-4 Hydra does:
//
//	cmd=init pmi_version=1 pmi_subversion=1 -> cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=2
//	cmd=get_maxes                           -> cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024
//	cmd=get_appnum                          -> cmd=appnum rc=0 appnum=0
//	cmd=get_universe_size                   -> cmd=universe_size rc=0 size=<n>
//	cmd=get_my_kvsname                      -> cmd=my_kvsname rc=0 kvsname=<name>
//	cmd=put kvsname=<k> key=<k> value=<v>   -> cmd=put_result rc=0
//	cmd=barrier_in                          -> cmd=barrier_out  (to every rank, once all entered)
//	cmd=get kvsname=<k> key=<k>             -> cmd=get_result rc=0 value=<v> | cmd=get_result rc=1
//	cmd=finalize                            -> cmd=finalize_ack rc=0
//	cmd=abort exitcode=<n> message=<m>      -> (no reply; ServerConfig.OnAbort)
//	cmd=initack pmiid=<r> (PMI_PORT only)   -> cmd=initack, cmd=set size=<n>, cmd=set rank=<r>, cmd=set debug=0
//
// Malformed lines, unknown or unsupported commands (publish_name, spawn, ...)
// get an error reply with rc=1 and a msg (e.g. "cmd=error rc=1
// msg=malformed_line") and are reported through ServerConfig.OnError; the job
// goes on. PMI-2 framing is not served.
package pmi
