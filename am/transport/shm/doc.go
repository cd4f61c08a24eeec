// Package shm is amgo's transport between processes on one host: lock-free
// single-producer single-consumer rings in shared-memory files for packets, a
// futex doorbell to sleep on, and Cross Memory Attach (process_vm_writev,
// process_vm_readv) for single-copy puts and gets. It registers itself as "shm"; open it with
// transport.Open("shm", bootstrap, opts) or New.
//
// # Files
//
// Every rank creates one file for its inbound traffic in the job directory:
// $AMGO_JOB_DIR (set by amrun, which removes it at the end of the job) or, when
// that is unset, /dev/shm/amgo-<job id>-<uid>, created with mode 0700. The file
// has mode 0600 and holds
//
//	offset 0     header: magic "amgoSHM1", version (2), rank, size, pid,
//	             ring stride, state
//	offset 128   this rank's doorbell (futex word and sleeper count)
//	offset 4096  announcements: a 32-bit count, then from offset 4160 one
//	             32-bit slot per rank
//	then, from the next 4 KiB boundary, one ring region per peer (including
//	             itself), in rank order, each ring.RegionSize(ring_bytes)
//	             rounded up to 4 KiB (the stride)
//
// The rank publishes the file's path under "amgo.shm.<rank>", fences, maps
// every peer's file, fences again and then unlinks its own file: from then on
// only the mappings keep it, so nothing is left behind even after a crash.
// Peers' files must be owned by the same user.
//
// Rings are made on first contact. The file is created empty (zero bytes,
// no page allocated); the first Send from rank s to rank d formats the ring
// region s of d's file (ring.Init, zeroing the data area: its pages fault
// in and its lines are warm once, not one per record over the first lap), takes a
// slot with an atomic add on d's count and stores s+1 in it. d's Poll, seeing
// the count move, attaches to the rings named in the new slots (a slot still
// zero is its producer between the add and the store: taken on a later
// look) and from then on visits them, and only them, round-robin; Wait
// counts a new announcement as an arrival. A rank that talks to k peers
// therefore touches k rings' pages in its file and polls k rings, whatever
// the job's size: the mappings of all peers' files (address space and the
// kernel's page tables for what is touched) are what grows with the job.
//
// # Packets
//
// Send copies the header and payload into the ring from this rank in the
// destination's file (one copy) and rings the destination's doorbell if it
// sleeps. Poll visits the inbound rings round-robin, a few records from each per
// visit, hands each record to the Receiver in place (no copy) and then frees it.
// Wait spins on the rings for a bounded time (option "spin", default 15us: a
// futex wake-up costs 30-40 us on small VMs) and then sleeps on its doorbell.
//
// # Puts and gets
//
// Put writes into a peer's registered memory with process_vm_writev, one copy
// and no involvement of the peer. New calls prctl(PR_SET_PTRACER,
// PR_SET_PTRACER_ANY) so that hosts with Yama ptrace_scope=1 allow it. A peer
// that refuses (EPERM: another user, or not dumpable) yields an error wrapping
// transport.ErrPutUnsupported, and later Puts to it fail the same way at once;
// the caller falls back to packets. Put writes give no ordering with packets:
// the caller sends a packet after Put returns to tell the peer.
//
// Get reads a peer's memory with process_vm_readv (transport.Getter), under
// the same permission: a refusal yields transport.ErrGetUnsupported and is
// remembered for both directions.
//
// # Dead peers
//
// A peer that exits without Close leaves its rings mapped but silent. When a
// Send finds a ring full for long, when Poll has been idle for long, and when
// Wait times out, the transport checks the peers' pids with kill(pid, 0); a
// peer that is gone without having closed makes Send to it and Poll return an
// error wrapping transport.ErrPeer (Poll first delivers what the peer left).
//
// # Concurrency
//
// As transport.Transport says: Sends to different destinations, Poll and Wait
// may run concurrently; Poll runs on one goroutine at a time, and so do Sends to
// one destination. Wait only reads shared words to decide whether to sleep.
// Close must not run concurrently with anything else.
//
// # Trust
//
// Peers are processes of the same user in the same job. A peer that writes
// nonsense into a ring is detected (bounds checks; Poll and Send return an
// error wrapping transport.ErrPeer) rather than read out of bounds, but a peer
// that truncates its file can still make this process fault with SIGBUS: the
// shared mapping cannot protect against a hostile process of the same user.
//
// # Performance
//
// An 8-byte ping-pong between two processes costs little more than a bare
// flag ping-pong through the same kind of mapping (BenchmarkPingPongProc
// against BenchmarkFlagPingPongProc); Put copies at memory bandwidth, faster
// when both buffers are backed by transparent huge pages (MADV_HUGEPAGE),
// which registered buffers of a MiB or more should be. Figures, with the
// machine, are in docs/performance.md.
//
// # Options
//
//	ring_bytes  data bytes of each directed ring (env AMGO_SHM_RING_BYTES; default
//	            DefaultRingBytesFor the node's rank count: 256 KiB up to 8
//	            ranks, 128 KiB up to 32, 64 KiB above; rounded up to a power
//	            of two; suffixes k and m allowed). MaxPacket is about half of
//	            it, and a peer's buffer (Caps.BufferBytes) all of it.
//	spin        how long Wait spins before sleeping, a Go duration (env
//	            AMGO_SHM_SPIN; default 15us).
//	lap_bytes   the short lap of each ring's small records (env
//	            AMGO_SHM_LAP_BYTES; default DefaultLapBytes, 16 KiB; 0 turns
//	            it off): records of up to a quarter of it go back to the
//	            ring's start once past it while the receiver keeps up, so
//	            that a stream of them stays in the first-level caches
//	            (ring.Producer.SetLap); paused for a peer that streams
//	            records back (ring.Producer.PauseLap). A lap of half the
//	            ring or more is off.
//	dir         the job directory, overriding $AMGO_JOB_DIR (tests).
//	prefix      a prefix of this job's file names in the job directory, for
//	            several shared-memory jobs in one directory (package job
//	            opens one per node of a job, and emulated nodes share a
//	            directory).
package shm
