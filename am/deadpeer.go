package am

import (
	"errors"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/wire"
)

// Dead peers.
//
// A network reports a failed rank as an error wrapping transport.ErrPeer, from
// Send or Put to that rank, or from Poll. The endpoint records the rank once
// (peerFailed), fails every later request to it at once (checkDst), drops what
// it owed the rank, and makes every blocked PollUntil return the rank's
// *PeerError (the deaths epoch). A network that repeats the report on every
// Poll (shm and tcp do, while nothing else arrives) is heard once: later
// reports of a known death are swallowed, so that traffic from live ranks keeps
// flowing. Networks that cannot see a silent peer die (loop: a closed rank; tcp
// without a connection to it; the reliability layer with nothing outstanding)
// are covered by a liveness probe: a wait that has found nothing for
// probeEvery sends each live peer a probe packet (a short reply to a no-op
// handler, no credit), and a Send that fails with transport.ErrPeer records the
// rank.

// probeHandler is the reserved no-op handler of liveness probes.
const probeHandler handlers.Index = 254

// probeEvery is how long a blocked wait finds nothing before the endpoint
// probes its peers, and how often it probes at most.
var probeEvery = 500 * time.Millisecond

// DeadPeers lists the ranks recorded dead, in the order they were found.
func (ep *Endpoint) DeadPeers() []int {
	ep.deadMu.Lock()
	defer ep.deadMu.Unlock()
	return append([]int(nil), ep.deadOrder...)
}

// PeerFailure returns rank's *PeerError if the rank has been recorded dead, nil
// otherwise.
func (ep *Endpoint) PeerFailure(rank int) error {
	if rank < 0 || rank >= ep.size {
		return nil
	}
	if pe := ep.dead[rank].Load(); pe != nil {
		return pe
	}
	return nil
}

// Deaths is the number of ranks recorded dead so far: a layer above compares it
// with the value it last acted on to learn of new deaths with one atomic load.
func (ep *Endpoint) Deaths() int { return int(ep.deaths.Load()) }

// peerFailed records that rank failed if err reports it (wraps
// transport.ErrPeer), and returns the rank's *PeerError; nil when err is
// another kind of error. The first report of a rank is kept.
func (ep *Endpoint) peerFailed(rank int, err error) *PeerError {
	if !errors.Is(err, transport.ErrPeer) || rank < 0 || rank >= ep.size || rank == ep.rank {
		return nil
	}
	if pe := ep.dead[rank].Load(); pe != nil {
		return pe
	}
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != rank {
		pe = &PeerError{Rank: rank, Err: err}
	}
	ep.deadMu.Lock()
	if ep.dead[rank].CompareAndSwap(nil, pe) {
		ep.deadOrder = append(ep.deadOrder, rank)
		ep.deaths.Add(1)
	}
	ep.deadMu.Unlock()
	return ep.dead[rank].Load()
}

// pollFailure turns an error from the network's Poll into what Poll returns: a
// new death as its *PeerError (once), a known death as nil, anything else as is.
// Runs under pollMu.
func (ep *Endpoint) pollFailure(err error) error {
	if !errors.Is(err, transport.ErrPeer) {
		return err
	}
	rank := -1
	if err == ep.rx.lastErr {
		rank = ep.rx.lastBad
	} else if rank = failedRank(err, ep.rank, ep.size); rank >= 0 {
		ep.rx.lastErr, ep.rx.lastBad = err, rank
	}
	if rank < 0 {
		return err // a failure the network does not attribute: report it as is
	}
	if ep.dead[rank].Load() != nil {
		return nil
	}
	return ep.peerFailed(rank, err)
}

// failedRank returns the rank a network's peer error names: the
// *transport.PeerError in its chain (the transport contract) or am's own
// *PeerError; -1 if there is none, or it names this rank or one outside the
// job.
func failedRank(err error, self, size int) int {
	r := -1
	var te *transport.PeerError
	var pe *PeerError
	switch {
	case errors.As(err, &pe):
		r = pe.Rank
	case errors.As(err, &te):
		r = te.Rank
	}
	if r < 0 || r >= size || r == self {
		return -1
	}
	return r
}

// firstDead returns the *PeerError of the first rank recorded dead.
func (ep *Endpoint) firstDead() error {
	ep.deadMu.Lock()
	defer ep.deadMu.Unlock()
	if len(ep.deadOrder) == 0 {
		return nil
	}
	return ep.dead[ep.deadOrder[0]].Load()
}

// deadSince returns the *PeerError of the first rank recorded dead after the
// first epoch deaths.
func (ep *Endpoint) deadSince(epoch int64) error {
	ep.deadMu.Lock()
	defer ep.deadMu.Unlock()
	if int(epoch) >= len(ep.deadOrder) {
		return nil
	}
	return ep.dead[ep.deadOrder[epoch]].Load()
}

// maybeProbe sends a liveness probe to every peer not known dead, at most once
// per probeEvery for the endpoint, and returns the *PeerError of the first
// rank it finds dead. A peer whose lock is busy, or whose network refuses the
// probe for now, is being talked to: it is skipped.
func (ep *Endpoint) maybeProbe() error {
	now := time.Now().UnixNano()
	last := ep.lastProbe.Load()
	if now-last < int64(probeEvery) || !ep.lastProbe.CompareAndSwap(last, now) {
		return nil
	}
	h := wire.Header{Kind: wire.KindReplyShort, Handler: uint8(probeHandler), Src: uint32(ep.rank)}
	var found error
	for dst := range ep.peers {
		if dst == ep.rank || ep.dead[dst].Load() != nil {
			continue
		}
		p := &ep.peers[dst]
		if !p.mu.TryLock() {
			continue
		}
		var err error
		if len(p.backlog) == 0 {
			n := wire.Encode(p.scratch[:], &h, nil)
			err = ep.tr.Send(dst, p.scratch[:n], nil)
		}
		p.mu.Unlock()
		if err != nil && !errors.Is(err, transport.ErrWouldBlock) {
			if pe := ep.peerFailed(dst, err); pe != nil && found == nil {
				found = pe
			}
		}
	}
	return found
}
