// Package mpiam is MPI in pure Go, layered on amgo's Active Messages (package
// am): point-to-point communication with the four send modes, nonblocking and
// persistent requests, communicators and groups, collectives, error classes,
// and tool support (interposition hooks, a piggybacked value on every message,
// overhead-compensated profiles, traces).
//
// # Using it
//
// A program hands its rank function to Run, which runs it on every rank of
// the job and finalizes afterwards:
//
//	err := mpiam.Run(mpiam.Config{}, func(world *mpiam.Comm) error {
//		buf := make([]float64, 1024)
//		if world.Rank() == 0 {
//			return mpiam.Send(world, buf, 1, 7)
//		}
//		_, err := mpiam.Recv(world, buf, 0, 7)
//		return err
//	})
//
// Under amrun (one rank per process over shared memory, or --transport
// tcp/udp), MPICH's mpiexec or Slurm's srun, each process runs one rank; a
// program started alone, or with amrun --transport loop, runs its ranks as
// goroutines. RunLocal(n, ...) runs n goroutine ranks in the calling process
// (tests, embedding); Init and Finalize are the process-per-rank form.
//
// Buffers are typed slices of Go's fixed-size numeric types ([]byte,
// []float64, []int32, ...), sent as their memory without a copy. The Typed
// forms (SendTyped, RecvTyped, ...) take MPI's (buffer, count, datatype)
// triple instead, with derived datatypes (TypeVector, TypeCreateStruct,
// TypeCreateSubarray, ...; DatatypeOf for a Go struct type). Every
// function is safe for concurrent use (MPI_THREAD_MULTIPLE). Errors are Go
// errors that wrap one sentinel per MPI error class: errors.Is(err,
// ErrTruncate), ErrorClass(err). A peer that fails is reported as
// ErrProcFailed naming it, in the manner of ULFM.
//
// # MPI names
//
// The MPI standard's names map to Go names without the MPI_ prefix; functions
// that take a buffer are generic functions, the others methods of *Comm or
// Request (a value; its zero value is MPI_REQUEST_NULL):
//
//	MPI_Init, MPI_Init_thread, MPI_Finalize    Init, InitThread, Finalize; or Run, RunLocal
//	MPI_COMM_WORLD                             the *Comm that Run (or Init) hands you
//	MPI_COMM_NULL                              a nil *Comm (Split with color Undefined)
//	MPI_Comm_rank, MPI_Comm_size               (*Comm).Rank, Size
//	MPI_Comm_dup, _split, _create, _free       (*Comm).Dup, Split, Create, Free
//	MPI_Comm_split_type, MPI_COMM_TYPE_SHARED  (*Comm).SplitType, CommTypeShared
//	MPI_Comm_group, MPI_Group_*                (*Comm).Group; Group methods
//	MPI_Send, MPI_Bsend, MPI_Ssend, MPI_Rsend  Send, Bsend, Ssend, Rsend
//	MPI_Isend, MPI_Ibsend, MPI_Issend, ...     Isend, Ibsend, Issend, Irsend: Request
//	MPI_Recv, MPI_Irecv                        Recv (returns Status), Irecv
//	MPI_Wait, MPI_Test                         (*Request).Wait, Test
//	MPI_Waitall, _any, _some; MPI_Testall, ... Waitall, Waitany, Waitsome, Testall, ...
//	MPI_Cancel, MPI_Test_cancelled             (*Request).Cancel, Status.TestCancelled
//	MPI_Probe, MPI_Iprobe, MPI_Mprobe, ...     (*Comm).Probe, Iprobe, Mprobe, Improbe; Mrecv
//	MPI_Sendrecv, MPI_Sendrecv_replace         Sendrecv, SendrecvReplace
//	MPI_Send_init, MPI_Recv_init, MPI_Start    SendInit, RecvInit, (*Request).Start, Startall
//	MPI_Buffer_attach, MPI_Buffer_detach       (*Comm).BufferAttach, BufferDetach
//	MPI_Get_count                              GetCount[T](status); status.GetCount(datatype)
//	MPI_DOUBLE, MPI_INT32_T, ...               Float64, Int32, ... (*Datatype)
//	MPI_Type_vector, _create_struct, ...       TypeVector, TypeCreateStruct, ...; DatatypeOf[T]
//	MPI_Type_commit, _free, _get_extent        (*Datatype).Commit, Free, Extent
//	MPI_Pack, MPI_Unpack, MPI_Pack_size        Pack, Unpack, PackSize
//	MPI_Send(buf, count, datatype, ...)        SendTyped, RecvTyped, IsendTyped, ... (every p2p call)
//	type matching checks (debug)               AMGO_CHECK_TYPES=1 (EnvCheckTypes): ErrType on a signature mismatch
//	MPI_Bcast(buf, count, datatype, ...)       BcastTyped, AllreduceTyped, GatherTyped, ..., IbcastTyped, ...
//	MPI_Alltoallw, MPI_Neighbor_alltoallw      Alltoallw, Ialltoallw, NeighborAlltoallw, IneighborAlltoallw
//	MPI_Barrier, MPI_Ibarrier                  (*Comm).Barrier, Ibarrier
//	MPI_Bcast, MPI_Reduce, MPI_Allreduce, ...  Bcast, Reduce, Allreduce, Gather, Scan, ...
//	MPI_Reduce_scatter(_block)                 ReduceScatter, ReduceScatterBlock
//	MPI_Ibcast, MPI_Igather(v), ...            Ibcast, Ireduce, Iallreduce, Igather(v), Iscatter(v), Iallgather(v),
//	                                           Ialltoall(v), IreduceScatter(Block), Iscan, Iexscan
//	MPI_Barrier_init, MPI_Allreduce_init, ...  (*Comm).BarrierInit, BcastInit, ReduceInit, AllreduceInit, GatherInit,
//	                                           GathervInit, ScatterInit, ScattervInit, AllgatherInit, AllgathervInit,
//	                                           AlltoallInit, AlltoallvInit, AlltoallwInit, ReduceScatterInit,
//	                                           ReduceScatterBlockInit, ScanInit, ExscanInit, NeighborAllgatherInit, ...
//	MPI_SUM, MPI_MAX, MPI_Op_create            Sum[T](), Max[T](), ...; an Op[T] of your own
//	MPI_Abort                                  (*Comm).Abort
//	MPI_Comm_set_name, MPI_Comm_get_name       (*Comm).SetName, Name
//	MPI_Get_version, MPI_Get_library_version   GetVersion, GetLibraryVersion (Version, Subversion)
//	MPI_Get_processor_name                     GetProcessorName
//	MPI_Wtime, MPI_Wtick                       Wtime, Wtick
//	MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_PROC_NULL AnySource, AnyTag, ProcNull
//	MPI_TAG_UB, MPI_UNDEFINED                  TagUB, Undefined
//	MPI_ERR_TRUNCATE, MPI_ERR_RANK, ...        ErrTruncate, ErrRank, ... (ErrorClass)
//	PMPI interposition                         Tool, (*Comm).AddTool, RegisterTool
//
// # Protocols
//
// Messages up to the eager limit travel with their envelope in one AM medium
// request into the sender's space of the per-peer buffer; larger ones by
// rendezvous (the receiver reads the send buffer with one copy, or the sender
// stores into the receive buffer), as in MPI over SP AM (Chang, Czajkowski,
// Hawblitzel, Hu and von Eicken, "Low-Latency Communication on the IBM RISC
// System/6000 SP", Supercomputing 1996). The send modes follow MPI-4.1 §3.4,
// matching and non-overtaking §3.5, progress §3.7.4. docs/mpi.md describes the
// protocols message by message, docs/collectives.md the collective
// algorithms, docs/tools.md the tools (overhead compensation after Shende,
// Malony, Morris and Wolf, EuroPVM/MPI 2005; traces with OTF2's record kinds).
package mpiam
