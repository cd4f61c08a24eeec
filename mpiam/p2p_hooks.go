package mpiam

// Exported point-to-point calls that go through tool hooks (tool.go) when a
// tool is attached; the work is done by their unexported counterparts.

// Sendrecv sends sendbuf to dest and receives into recvbuf from src, without
// deadlock whatever the peers do first (MPI_Sendrecv, MPI-4.1 §3.10).
func Sendrecv[S, R Elem](c *Comm, sendbuf []S, dest, sendtag int, recvbuf []R, src, recvtag int) (Status, error) {
	if c.hooked() {
		return c.p.hookStatus(&Event{Call: CallSendrecv, Comm: c, Peer: dest, Tag: sendtag, Bytes: len(bytesOf(sendbuf))},
			func() (Status, error) {
				var st Status
				err := sendrecv(c, sendbuf, dest, sendtag, recvbuf, src, recvtag, &st)
				return st, err
			})
	}
	// The status a field at a time, as Recv's: see copyStatus.
	var st Status
	err := sendrecv(c, sendbuf, dest, sendtag, recvbuf, src, recvtag, &st)
	return Status{Source: st.Source, Tag: st.Tag, Err: st.Err, Bytes: st.Bytes,
		Cancelled: st.Cancelled, Piggyback: st.Piggyback, HasPiggyback: st.HasPiggyback}, err
}

// SendrecvReplace sends buf to dest and receives a message from src into the
// same buffer (MPI_Sendrecv_replace): the outgoing data is copied first.
func SendrecvReplace[T Elem](c *Comm, buf []T, dest, sendtag, src, recvtag int) (Status, error) {
	if c.hooked() {
		return c.p.hookStatus(&Event{Call: CallSendrecvReplace, Comm: c, Peer: dest, Tag: sendtag, Bytes: len(bytesOf(buf))},
			func() (Status, error) {
				var st Status
				err := sendrecvReplace(c, buf, dest, sendtag, src, recvtag, &st)
				return st, err
			})
	}
	var st Status
	err := sendrecvReplace(c, buf, dest, sendtag, src, recvtag, &st)
	return Status{Source: st.Source, Tag: st.Tag, Err: st.Err, Bytes: st.Bytes,
		Cancelled: st.Cancelled, Piggyback: st.Piggyback, HasPiggyback: st.HasPiggyback}, err
}

// Start starts an inactive persistent request (MPI_Start). Errors: ErrRequest
// for a request that is not persistent or still active.
func (r *Request) Start() error {
	s := r.state()
	if s == nil || s.p == nil || s.p.tools == nil {
		return r.start()
	}
	return s.p.hookErr(&Event{Call: CallStart, Comm: s.comm, Request: *r, Peer: s.peer, Tag: s.tag, Bytes: s.size(), Mode: s.mode}, r.start)
}

// Startall starts every request (MPI_Startall).
func Startall(reqs []Request) error {
	var p *proc
	for _, r := range reqs {
		if s := r.state(); s != nil && s.p != nil {
			p = s.p
			break
		}
	}
	if p == nil || p.tools == nil {
		return startall(reqs)
	}
	return p.hookErr(&Event{Call: CallStartall, Requests: append([]Request(nil), reqs...)}, func() error { return startall(reqs) })
}

// Iprobe reports whether a message matching (src, tag) can be received on c
// (MPI_Iprobe, MPI-4.1 §3.8.1), polling once, and its status (Bytes is its
// size). The message stays to be received.
func (c *Comm) Iprobe(src, tag int) (bool, Status, error) {
	if !c.hooked() {
		return c.iprobe(src, tag)
	}
	e := Event{Call: CallIprobe, Comm: c, Peer: src, Tag: tag}
	c.p.around(&e, func(e *Event) { e.Flag, e.Status, e.Err = c.iprobe(src, tag) })
	return e.Flag, e.Status, e.Err
}

// Probe blocks until a message matching (src, tag) can be received on c
// (MPI_Probe) and returns its status.
func (c *Comm) Probe(src, tag int) (Status, error) {
	if !c.hooked() {
		return c.probeWait(src, tag)
	}
	return c.p.hookStatus(&Event{Call: CallProbe, Comm: c, Peer: src, Tag: tag}, func() (Status, error) { return c.probeWait(src, tag) })
}

// Improbe is Iprobe that also removes the message from matching and returns a
// handle to receive it with Mrecv (MPI_Improbe): no other receive can take it.
func (c *Comm) Improbe(src, tag int) (bool, *Message, Status, error) {
	if !c.hooked() {
		return c.improbeAPI(src, tag)
	}
	var m *Message
	e := Event{Call: CallImprobe, Comm: c, Peer: src, Tag: tag}
	c.p.around(&e, func(e *Event) { e.Flag, m, e.Status, e.Err = c.improbeAPI(src, tag) })
	return e.Flag, m, e.Status, e.Err
}

// Mprobe blocks until a matching message arrives and removes it from matching
// (MPI_Mprobe); receive it with Mrecv.
func (c *Comm) Mprobe(src, tag int) (*Message, Status, error) {
	if !c.hooked() {
		return c.mprobe(src, tag)
	}
	var m *Message
	e := Event{Call: CallMprobe, Comm: c, Peer: src, Tag: tag}
	c.p.around(&e, func(e *Event) { m, e.Status, e.Err = c.mprobe(src, tag) })
	return m, e.Status, e.Err
}

// Imrecv starts receiving a message taken by Mprobe or Improbe into buf
// (MPI_Imrecv). Errors: ErrRequest for a nil or already received message.
func Imrecv[T Elem](m *Message, buf []T) (Request, error) {
	if m == nil || !m.comm.hooked() {
		return imrecv(m, buf)
	}
	return m.comm.p.hookReq(&Event{Call: CallImrecv, Comm: m.comm, Peer: int(m.env.Source), Tag: int(m.env.Tag), Bytes: len(bytesOf(buf))},
		func() (Request, error) { return imrecv(m, buf) })
}

// Mrecv receives a message taken by Mprobe or Improbe into buf (MPI_Mrecv).
func Mrecv[T Elem](m *Message, buf []T) (Status, error) {
	if m == nil || !m.comm.hooked() {
		return mrecv(m, buf)
	}
	return m.comm.p.hookStatus(&Event{Call: CallMrecv, Comm: m.comm, Peer: int(m.env.Source), Tag: int(m.env.Tag), Bytes: len(bytesOf(buf))},
		func() (Status, error) { return mrecv(m, buf) })
}
