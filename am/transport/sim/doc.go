// Package sim is amgo's deterministic, seeded, in-process network for tests:
// the ranks of a job are goroutines of one process, and every packet meets
// faults drawn from a seed, namely loss, reordering, duplication, delay, partitions
// (pairs of ranks that cannot talk for a while) and dead ranks (a rank that
// stops sending and receiving, as a crashed process). It registers itself as
// "sim". Its Caps say neither Ordered nor Reliable, so package am puts the
// reliability layer (am/internal/reliable) on top of it, exactly as on udp:
// sim is where that layer, and everything above it, is tested under faults
// that the kernel cannot inject (docs/transports.md).
//
// # Use
//
// NewJob opens all n ranks at once:
//
//	ts, _ := sim.NewJob(4, sim.Config{Seed: seed, Loss: 0.1, Reorder: 0.3, Duplicate: 0.01})
//	for _, tr := range ts { ep, _ := am.New(tr, am.Config{}); ... }
//
// A program run with job.Run gets a sim job of AMGO_LOOP_SIZE goroutine ranks
// with AMGO_TRANSPORT=sim; the faults then come from ParseOptions (AMGO_SIM_SEED,
// AMGO_SIM_LOSS, ...). The factory registered as "sim" opens only jobs of
// size 1, as loop's does.
//
// # Model
//
// Each destination rank has an inbox: a queue of packet copies ordered by the
// time each becomes deliverable. Send draws, from the generator of the link
// (src, dst), whether the packet is duplicated and, for each copy, whether it
// is lost and whether it is held back (an extra delay drawn uniformly from
// (0, ReorderWindow], so that later packets overtake it); a copy that
// survives is copied into the inbox, due after Config.Delay plus its extra
// delay. Poll hands up the copies whose time has come, earliest first. A
// full inbox (QueueLimit copies) drops, as a socket buffer does; a
// partition, a dead sender or a dead or closed receiver loses the copy. Send
// never fails for any of these reasons: a lossy network loses silently.
// Stats counts every fate.
//
// # Determinism
//
// Every random decision comes from the seed. The link (src, dst) has its own
// generator seeded with (Seed, src, dst), and Send draws the same numbers for
// every packet whatever happens to it, so the k-th packet on a link meets the
// same fate in every run with that seed. What is not fixed by the seed is the
// order in which goroutines run and the wall clock: which packet is the k-th
// on a link depends on the retransmissions of the layer above, and whether a
// held-back packet is actually overtaken depends on what is sent meanwhile.
// A run therefore replays closely, not bit for bit. Tests print the seed
// (seed=N) and read it back from AMGO_SIM_SEED (EnvSeed).
//
// # Waiting
//
// Wait polls the inbox for a few microseconds (yielding the processor, since
// ranks are goroutines that may outnumber the cores), then parks on a channel
// until a sender signals, the earliest waiting copy falls due, or the timeout
// passes (Caps.Wakeup).
//
// # Options (ParseOptions; option key [environment variable])
//
//	seed            seed, default 1 [AMGO_SIM_SEED]
//	loss            probability 0..1 or a percentage such as 10% [AMGO_SIM_LOSS]
//	reorder         probability [AMGO_SIM_REORDER]
//	dup             probability [AMGO_SIM_DUP]
//	delay           one-way delay, a Go duration [AMGO_SIM_DELAY]
//	reorder_window  longest extra delay of a reordered packet, default 200us [AMGO_SIM_REORDER_WINDOW]
//	max_packet      largest packet in bytes, default 65536 [AMGO_SIM_MAX_PACKET]
//	queue           inbox bound in packets, default 8192 [AMGO_SIM_QUEUE]
package sim
