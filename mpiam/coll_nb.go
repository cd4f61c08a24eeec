package mpiam

// Nonblocking collectives (MPI-4.1 §6.12). Each takes its place in the
// communicator's order of collective calls when it is called, then runs the
// same algorithm as its blocking form on a goroutine of its own, so it
// progresses whatever the program waits on; the returned request completes
// when the operation has (Wait, Test and the multiple-completion functions
// accept it). Buffers must not be touched until then. Cancel has no effect on
// these requests.

func (c *Comm) startNB(call Call, peer, bytes int, run func(x coll) error) (*Request, error) {
	start := func() (*Request, error) {
		x, err := c.startColl(call, true)
		if err != nil {
			return nil, err
		}
		s := &reqState{p: c.p, kind: kindColl, comm: c, peer: AnySource, tag: AnyTag}
		id := c.p.collBegin(call, c, peer, bytes)
		go func() {
			err := run(x)
			c.p.collEnd(id)
			s.complete(x.status(err))
		}()
		return &Request{s: s}, nil
	}
	if c.hooked() {
		return c.p.hookReq(&Event{Call: call, Comm: c, Peer: peer, Bytes: bytes}, start)
	}
	return start()
}

// Ibarrier starts a barrier (MPI_Ibarrier): the request completes once every
// rank of c has called Ibarrier or Barrier.
func (c *Comm) Ibarrier() (*Request, error) {
	return c.startNB(CallIbarrier, AnySource, 0, func(x coll) error { return x.barrier() })
}

// Ibcast starts a broadcast (MPI_Ibcast); see Bcast.
func Ibcast[T any](c *Comm, buf []T, root int) (*Request, error) {
	if err := plain[T](); err != nil {
		return nil, err
	}
	if err := checkRoot(c, root); err != nil {
		return nil, err
	}
	return c.startNB(CallIbcast, root, len(raw(buf)), func(x coll) error { return x.bcast(raw(buf), root) })
}

// Ireduce starts a reduction to root (MPI_Ireduce); see Reduce.
func Ireduce[T any](c *Comm, send, recv []T, op Op[T], root int) (*Request, error) {
	if err := plain[T](); err != nil {
		return nil, err
	}
	if err := checkRoot(c, root); err != nil {
		return nil, err
	}
	return c.startNB(CallIreduce, root, len(raw(send)), func(x coll) error { return reduce(x, send, recv, op, root) })
}

// Iallreduce starts an allreduce (MPI_Iallreduce); see Allreduce.
func Iallreduce[T any](c *Comm, send, recv []T, op Op[T]) (*Request, error) {
	if err := plain[T](); err != nil {
		return nil, err
	}
	return c.startNB(CallIallreduce, AnySource, len(raw(recv)), func(x coll) error { return allreduce(x, send, recv, op) })
}

// Iallgather starts an allgather (MPI_Iallgather); see Allgather.
func Iallgather[T any](c *Comm, send, recv []T) (*Request, error) {
	if err := plain[T](); err != nil {
		return nil, err
	}
	return c.startNB(CallIallgather, AnySource, len(raw(send)), func(x coll) error { return allgather(x, send, recv) })
}

// Ialltoall starts an all-to-all exchange (MPI_Ialltoall); see Alltoall.
func Ialltoall[T any](c *Comm, send, recv []T) (*Request, error) {
	if err := plain[T](); err != nil {
		return nil, err
	}
	return c.startNB(CallIalltoall, AnySource, len(raw(send)), func(x coll) error { return alltoall(x, send, recv) })
}
