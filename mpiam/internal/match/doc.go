// Package match is amgo's MPI matching engine: it pairs posted receives with
// arrived messages by (context, source, tag), with AnySource and AnyTag,
// following MPI-4.1 §3.5 "Semantics of Point-to-Point Communication" and §3.8
// "Probe and Cancel".
//
// The engine is a pure state machine in the manner of etcd's raft package: it
// starts no goroutine, takes no lock, reads no clock and does no I/O. The MPI
// layer feeds it events (a receive is posted, a message arrives, a receive is
// cancelled, a probe) under the lock it already holds, and acts on what the
// engine returns (copy a matched eager message, answer a rendezvous
// request-to-send, release a buffer).
//
// # Usage
//
// The sender numbers its messages per (context, destination), from 0, in
// send-initiation order (mpiam keeps one atomic counter per communicator and
// destination), and puts the number in the envelope:
//
//	seq := comm.sendSeq[dest].Add(1) - 1
//	env := match.Envelope{Context: comm.ctx, Source: comm.rank, Tag: tag, Seq: seq}
//
// The receiver, for each arrived envelope (eager data or request-to-send):
//
//	out, err = eng.Arrive(env, msg, out[:0])
//	// err: release msg; the peer or transport misbehaved.
//	// out: complete each Match (copy Msg into Recv's buffer, or send the
//	// rendezvous reply); possibly none, possibly several.
//
// or first, for the common case of a message whose receive is posted (no
// message record needed, no match list built):
//
//	if req, ok := eng.ArrivePosted(env); ok { /* complete req with the data */ }
//
// For each receive:
//
//	msg, env, h, ok := eng.Post(match.Spec{Context: c, Source: src, Tag: tag}, req)
//	// ok: msg is the earliest matching unexpected message; complete req with it.
//	// !ok: req is queued; a later Arrive returns it, or eng.Cancel(h) removes it.
//
// Probe (MPI_Iprobe) looks at the message a receive would take; Take
// (MPI_Improbe) removes it from matching for a later MPI_Mrecv. DropContext
// forgets a freed communicator; DropSource removes what a failed process left.
//
// The caller's responsibilities, in order: serialize every call to an Engine;
// number messages per (context, destination) in the order sends are initiated and send
// every numbered message (a number that never arrives blocks its successors
// forever); reject a Spec whose rank is out of the communicator (Spec.Validate
// only knows AnySource and non-negative ranks); use negative tags below AnyTag
// only for internal traffic; release the messages Arrive refuses with an error.
//
// # Semantics
//
// Non-overtaking (MPI-4.1 §3.5): two messages from one source on one context
// match in the order they were sent, never the order they arrived. A message
// arriving ahead of the next expected sequence number is held, as Open MPI
// ob1 holds fragments in frags_cant_match, and becomes matchable when the gap
// fills; the held messages then drain in order. Sequence numbers are uint32
// and wrap; a number is "behind" the expected one when it is less than 2^31
// behind it, in serial-number arithmetic (RFC 1982), and refused as a duplicate.
//
// Receives match in posting order: an arriving message takes the earliest
// posted receive that matches it, whether exact, AnySource, AnyTag or both. A
// posted receive takes the earliest matchable message that matches it: for
// one source the lowest sequence number, across sources the one that became
// matchable first.
//
// AnyTag matches tags of zero or more only: ob1's rule req_tag == tag ||
// (req_tag == ANY_TAG && tag >= 0), so that collectives and other internal
// traffic with negative tags never meet a user's wildcard receive. AnyTag
// (-1) is itself not a valid message tag.
//
// # Structures, and why
//
// Posted side (ob1 keeps wild_receives and specific_receives per peer with a
// communicator-wide posting sequence; UCX keeps a wildcard list and a hash of
// exact tags with one sn): every receive is queued in exactly one of four
// FIFO lists according to its kind, and stamped with one engine-wide posting
// number:
//
//	(ctx, src, tag)          tag bucket        exact receives
//	(ctx, AnySource, tag)    tag bucket        AnySource receives
//	(ctx, src)               peer              AnyTag receives
//	(ctx)                    context           AnySource+AnyTag receives
//
// The receives that can match a message (ctx, src, tag) are exactly those in
// these four lists (two for a negative tag), and each list is in posting order,
// so the earliest posted is the one with the lowest posting number among the
// four heads: O(1) whatever the number of posted receives.
//
// Unexpected side: every matchable message is linked, by four intrusive link
// slots, into the same four kinds of list: its (ctx, src, tag) bucket, its
// (ctx, AnySource, tag) bucket, its peer's list and its context's list (messages
// with a negative tag go on separate peer and context lists that AnyTag never
// reads). Messages are appended when they become matchable, so each list is in
// matchable order, and each kind of receive finds its earliest candidate at
// the head of one list. Removing a message unlinks it from all four in O(1).
// This is where ob1's per-peer unexpected_frags would make an AnySource
// receive walk every peer, and an exact one walk the peer's list past other
// tags. The (ctx, AnySource, tag) buckets are kept only once the context has
// seen its first (AnySource, tag) receive or probe, which links the messages
// queued until then in one pass over the context's lists: until then a message
// with a tag new to the context costs one bucket, not two (a collective
// call's messages, which use a new tag per call, or a program that tags by
// iteration; BenchmarkSelfUnexpected/tag=fresh measures it).
//
// Each context has a map of peers by source and a map of tag buckets keyed by
// (src, tag) packed in one 64-bit word, with src AnySource for the second kind
// of bucket, in front of which the last key looked up or made is cached with
// its bucket, or with none (a ping-pong or a halo exchange on one tag skips
// the hashing, and so does a new tag between the arrival that finds no
// receive, its bucket and the receive that takes it). An emptied bucket stays in its map on an idle list until 256
// newer ones have emptied, then goes back to a pool: tags in steady use cost no
// map insertion or deletion per message, and programs that use many tags once
// (an iteration number, say) do not grow the maps. Peers (which hold the
// sequence state) and contexts live until DropContext.
//
// Held messages sit in a per-peer list in ascending sequence order, searched
// from the tail on insertion (arrivals are out of order by a small window,
// the number of threads racing to the network); the head is compared with the
// expected number after every match.
//
// Nodes for messages and receives and tag buckets are recycled through free
// lists, so in steady state neither Post nor Arrive allocates. Cancel finds a
// receive through its handle (a slot index and a generation that changes when
// the node is recycled, so a stale handle fails instead of naming another
// receive).
//
// # Cost
//
// Post, Arrive (per message made matchable), Cancel, Probe and Take are O(1) in
// the number of queued receives and messages: at most four map lookups and four
// list heads; the exception is a context's first (AnySource, tag) receive or
// probe, which is O(messages queued in that context) once. Holding an out-of-sequence arrival is O(number of messages held
// from that peer after it). DropContext and DropSource are O(items removed + tag
// buckets in the engine).
package match
