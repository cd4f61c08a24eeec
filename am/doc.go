// Package am is amgo's Active Messages layer, in the tradition of Active
// Messages (von Eicken, Culler, Goldstein and Schauser, ISCA 1992), SP AM and
// GASNet-EX: a message names a handler, a function registered at the
// receiver, and carries a few 64-bit arguments and possibly data; the
// handler runs at the receiver when the receiver polls.
//
// # Model
//
// An Endpoint is one rank's attachment to the job's network. Handlers are
// registered in its table (package handlers) under small indices before
// communication starts, the same on every rank. A handler runs only inside a
// poll, on the polling goroutine; it must not block or poll, and may reply at
// most once through its Token.
//
//	RequestShort(dst, h, args...)         a few 64-bit arguments
//	RequestMedium(dst, h, payload, args...) arguments and up to MaxMedium bytes,
//	                                      valid while the handler runs
//	Store(dst, h, addr, data, args...)    data written into memory dst registered
//	                                      (RegisterSegment), then h runs there
//	Get(src, addr, buf)                   a single-copy read of src's registered memory
//	Token.ReplyShort / ReplyMedium        the handler's answer, which needs no credit
//	Poll, PollUntil                       run arrived handlers; wait for a condition
//	Barrier                               all ranks of the job
//
// In GASNet-EX terms: RequestShort is gex_AM_RequestShort, RequestMedium
// gex_AM_RequestMedium, Store gex_AM_RequestLong, Get gex_RMA_GetBlocking,
// Poll gex_AM_Poll, a Token gex_Token_t; in SP AM's, Store is am_store and
// Poll am_poll.
//
// # Buffers and credit
//
// Every endpoint keeps a receive buffer of Config.BufferBytes (16 KiB) for
// every peer; a sender allocates space in its buffer at the receiver without
// communicating (package flowctl), and the receiver's reply, or a coalesced
// acknowledgement, gives it back. A request reserves room for its reply, so a
// handler can always reply at once. When a peer's buffer is full the sender
// polls until space returns: back-pressure, never loss. This is the buffered
// protocol of MPI over SP AM (Chang, Czajkowski, Hawblitzel, Hu and von
// Eicken, "Low-Latency Communication on the IBM RISC System/6000 SP",
// Supercomputing 1996).
//
// # Networks
//
// The endpoint sits on a transport (package am/transport: loop, shm, tcp, udp,
// sim). On a network without ordered or reliable delivery it adds sequence
// numbers, acknowledgements and retransmission once (am/internal/reliable),
// so that above am every peer's messages arrive in order, exactly once. A
// peer that dies is reported as a *PeerError matching ErrPeerDead.
//
// # Starting a job
//
// Package am/job starts jobs: job.Run runs a function on every rank of the
// job the process belongs to (launched by amrun, MPICH's mpiexec or Slurm, or
// alone), job.RunLocal on n goroutine ranks of this process, and job.Open
// attaches this process as one rank. Package am itself knows no particular
// network: New makes an endpoint over a transport the caller opened, and
// RunJob runs an in-process job over transports the caller opened.
//
// docs/am.md describes the model, the handler rules and the credit
// arithmetic; docs/wire.md the packet format.
package am
