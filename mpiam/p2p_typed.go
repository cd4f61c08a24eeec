package mpiam

import "fmt"

// The (buffer, count, datatype) forms of the point-to-point calls. buf is
// the memory the datatype's displacements count from (its first element is
// MPI's buf address); count instances of d must lie within it. Contiguous
// data (a predefined datatype, TypeContiguous of one, DatatypeOf a struct)
// takes the same zero-copy paths as the slice forms; other layouts are
// packed on the way (rndv_typed.go).

// typed checks count instances of d in buf and returns the memory and the
// layout (nil when the data is the contiguous bytes returned).
func typed[T any](buf []T, count int, d *Datatype) ([]byte, *layout, error) {
	mem, err := memOf(buf)
	if err != nil {
		return nil, nil, err
	}
	return layoutOf(mem, count, d)
}

// packedLen is the bytes a typed buffer sends or takes: mem's length when
// contiguous, else lay's packed size.
func packedLen(mem []byte, lay *layout) int {
	if lay != nil {
		return lay.n
	}
	return len(mem)
}

// sendLay is a blocking send of non-contiguous data in mode.
func (c *Comm) sendLay(mem []byte, lay *layout, mt msgType, dest, tag int, mode Mode) error {
	if err := c.checkSend(dest, tag); err != nil {
		return err
	}
	if lay != nil && !c.checking() && c.sendsEager(dest, lay.n, mode) {
		// Eager, as Send's: packed into scratch space that the request
		// copies, without an operation state.
		return c.sendPacked(mem, lay, dest, tag, mode)
	}
	r, _ := c.newSend(mem, dest, tag, mode, false)
	r.lay = lay
	r.setType(mt)
	err := c.p.startSend(r)
	if err == nil {
		_, err = r.wait()
	}
	c.p.states.put(r)
	return err
}

// isendLay starts a send of non-contiguous data in mode.
func (c *Comm) isendLay(mem []byte, lay *layout, mt msgType, dest, tag int, mode Mode) (Request, error) {
	if err := c.checkSend(dest, tag); err != nil {
		return Request{}, err
	}
	p := c.p
	if lay != nil && !c.checking() && p.tools == nil && c.sendsEager(dest, lay.n, mode) {
		// Eager: complete in this call, with a state complete from the
		// start, as Isend's (isend).
		if err := c.sendPacked(mem, lay, dest, tag, mode); err != nil {
			return Request{}, err
		}
		return c.sentRequest(mem, lay, dest, tag, mode), nil
	}
	r, h := c.newSend(mem, dest, tag, mode, true)
	r.lay = lay
	r.setType(mt)
	if err := c.p.startSend(r); err != nil {
		return Request{}, err
	}
	return h, nil
}

// packBufBytes is the size of a rank's buffer for packing eager messages.
// Larger ones to a peer over shared memory are packed in place (sendPacked):
// below it, packing into this buffer, which stays in the core's cache, and
// copying into the ring measured faster (a strided vector over shm, 2 KiB:
// 0.36 against 0.40 µs; 8 KiB level; 16 KiB 1.28 against 1.21, 64 KiB 4.47
// against 3.86), since the ring's lines for a record of a few KiB are not
// yet zeroed ahead and every one of the pack's many small stores waits for
// its line, where a copy's few wide ones overlap those waits.
const packBufBytes = 8 << 10

// sendPacked sends the non-contiguous data lay of mem eagerly to dest.
// Past packBufBytes, to a peer whose network takes a payload in place
// (am.Endpoint.PeerFills: shared memory), it is packed straight into the
// request's room in the ring (a negotiated-payload medium request,
// RequestMediumFill); otherwise packed into scratch space (the rank's
// packBuf, or a pooled buffer while another goroutine uses that), which the
// request copies.
func (c *Comm) sendPacked(mem []byte, lay *layout, dest, tag int, mode Mode) error {
	p := c.p
	if lay.n > packBufBytes && p.ep.PeerFills(c.world(dest)) && p.packMu.TryLock() {
		p.packFill = packFiller{lay: lay, mem: mem}
		pb, hasPB := p.outgoingPB()
		err := p.sendEagerFill(c, &p.packFill, lay.n, dest, tag, mode, pb, hasPB)
		p.packFill = packFiller{} // keeps no user memory alive
		p.packMu.Unlock()
		return err
	}
	if lay.n <= packBufBytes && p.packMu.TryLock() {
		// The rank's own buffer, when no other goroutine packs into it.
		if p.packBuf == nil {
			p.packBuf = make([]byte, packBufBytes)
		}
		b := p.packBuf[:lay.n]
		lay.pack(b, mem, 0)
		pb, hasPB := p.outgoingPB()
		err := p.sendEager(c, b, dest, tag, mode, pb, hasPB)
		p.packMu.Unlock()
		return err
	}
	s := getScratch(lay.n)
	lay.pack(s.b, mem, 0)
	pb, hasPB := p.outgoingPB()
	err := p.sendEager(c, s.b, dest, tag, mode, pb, hasPB)
	putScratch(s)
	return err
}

// packFiller packs the data lay of mem into a request's payload in place
// (transport.Filler, sendPacked).
type packFiller struct {
	lay *layout
	mem []byte
}

// Fill packs the data into p, which is lay.n bytes long.
func (f *packFiller) Fill(p []byte) { f.lay.pack(p, f.mem, 0) }

// irecvLay posts a receive of non-contiguous data.
func (c *Comm) irecvLay(mem []byte, lay *layout, mt msgType, src, tag int) (Request, error) {
	if err := c.checkRecv(src, tag); err != nil {
		return Request{}, err
	}
	_, h, err := c.postLay(mem, lay, mt, src, tag, true)
	return h, err
}

// postLay posts a receive into mem laid out by lay (nil: contiguous) and
// typed mt for the checks, its arguments checked by the caller; handle:
// with a Request for a nonblocking call, else the state is the caller's to
// wait for and put back.
func (c *Comm) postLay(mem []byte, lay *layout, mt msgType, src, tag int, handle bool) (*reqState, Request, error) {
	r, h := c.newRecv(mem, src, tag, handle)
	r.lay = lay
	r.setType(mt)
	if err := c.p.startRecv(r); err != nil {
		return nil, Request{}, err
	}
	return r, h, nil
}

// recvLay is a blocking receive of non-contiguous data.
func (c *Comm) recvLay(mem []byte, lay *layout, mt msgType, src, tag int) (Status, error) {
	var st Status
	err := c.recvLayInto(mem, lay, mt, src, tag, &st)
	return st, err
}

// recvLayInto is recvLay with the status written to *st (see copyStatus).
func (c *Comm) recvLayInto(mem []byte, lay *layout, mt msgType, src, tag int, st *Status) error {
	if err := c.checkRecv(src, tag); err != nil {
		*st = Status{}
		return err
	}
	r, _, err := c.postLay(mem, lay, mt, src, tag, false)
	if err != nil {
		*st = Status{}
		return err
	}
	err = r.waitInto(st)
	c.p.states.put(r)
	return err
}

// sendTyped is the blocking typed send in mode, under the tools' hooks.
func sendTyped[T any](call Call, c *Comm, buf []T, count int, d *Datatype, dest, tag int, mode Mode) error {
	if err := c.valid(); err != nil {
		return err
	}
	mem, lay, err := typed(buf, count, d)
	if err != nil {
		return err
	}
	if lay == nil && !c.checking() {
		return c.sendCall(call, mem, dest, tag, mode)
	}
	return c.sendLayCall(call, mem, lay, typeOf(d, count), dest, tag, mode)
}

// sendLayCall is sendLay under the tools' hooks when any.
func (c *Comm) sendLayCall(call Call, mem []byte, lay *layout, mt msgType, dest, tag int, mode Mode) error {
	if c.hooked() {
		return c.p.hookErr(&Event{Call: call, Comm: c, Peer: dest, Tag: tag, Bytes: packedLen(mem, lay), Mode: mode},
			func() error { return c.sendLay(mem, lay, mt, dest, tag, mode) })
	}
	return c.sendLay(mem, lay, mt, dest, tag, mode)
}

// isendTyped starts the typed send in mode, under the tools' hooks.
func isendTyped[T any](call Call, c *Comm, buf []T, count int, d *Datatype, dest, tag int, mode Mode) (Request, error) {
	if err := c.valid(); err != nil {
		return Request{}, err
	}
	mem, lay, err := typed(buf, count, d)
	if err != nil {
		return Request{}, err
	}
	if lay == nil && !c.checking() {
		return c.isendCall(call, mem, dest, tag, mode)
	}
	return c.isendLayCall(call, mem, lay, typeOf(d, count), dest, tag, mode)
}

// isendLayCall is isendLay under the tools' hooks when any.
func (c *Comm) isendLayCall(call Call, mem []byte, lay *layout, mt msgType, dest, tag int, mode Mode) (Request, error) {
	if c.hooked() {
		return c.p.hookReq(&Event{Call: call, Comm: c, Peer: dest, Tag: tag, Bytes: packedLen(mem, lay), Mode: mode},
			func() (Request, error) { return c.isendLay(mem, lay, mt, dest, tag, mode) })
	}
	return c.isendLay(mem, lay, mt, dest, tag, mode)
}

// SendTyped is MPI_Send with a datatype (MPI-4.1 §3.2.1): count instances
// of d from buf to rank dest of c with tag. Non-contiguous data is packed
// on the way, never staged whole (docs/mpi.md "Datatypes"). Errors as Send,
// plus ErrType (d nil, freed or not committed), ErrCount (count < 0),
// ErrBuffer (the data lies outside buf, or T holds pointers).
func SendTyped[T any](c *Comm, buf []T, count int, d *Datatype, dest, tag int) error {
	return sendTyped(CallSend, c, buf, count, d, dest, tag, Standard)
}

// BsendTyped is MPI_Bsend with a datatype; see Bsend and SendTyped.
func BsendTyped[T any](c *Comm, buf []T, count int, d *Datatype, dest, tag int) error {
	return sendTyped(CallBsend, c, buf, count, d, dest, tag, Buffered)
}

// SsendTyped is MPI_Ssend with a datatype; see Ssend and SendTyped.
func SsendTyped[T any](c *Comm, buf []T, count int, d *Datatype, dest, tag int) error {
	return sendTyped(CallSsend, c, buf, count, d, dest, tag, Synchronous)
}

// RsendTyped is MPI_Rsend with a datatype; see Rsend and SendTyped.
func RsendTyped[T any](c *Comm, buf []T, count int, d *Datatype, dest, tag int) error {
	return sendTyped(CallRsend, c, buf, count, d, dest, tag, Ready)
}

// IsendTyped is MPI_Isend with a datatype; see Isend and SendTyped. buf
// must not change until the request completes.
func IsendTyped[T any](c *Comm, buf []T, count int, d *Datatype, dest, tag int) (Request, error) {
	return isendTyped(CallIsend, c, buf, count, d, dest, tag, Standard)
}

// IbsendTyped is MPI_Ibsend with a datatype; see Ibsend and SendTyped.
func IbsendTyped[T any](c *Comm, buf []T, count int, d *Datatype, dest, tag int) (Request, error) {
	return isendTyped(CallIbsend, c, buf, count, d, dest, tag, Buffered)
}

// IssendTyped is MPI_Issend with a datatype; see Issend and SendTyped.
func IssendTyped[T any](c *Comm, buf []T, count int, d *Datatype, dest, tag int) (Request, error) {
	return isendTyped(CallIssend, c, buf, count, d, dest, tag, Synchronous)
}

// IrsendTyped is MPI_Irsend with a datatype; see Irsend and SendTyped.
func IrsendTyped[T any](c *Comm, buf []T, count int, d *Datatype, dest, tag int) (Request, error) {
	return isendTyped(CallIrsend, c, buf, count, d, dest, tag, Ready)
}

// RecvTyped is MPI_Recv with a datatype (MPI-4.1 §3.2.4): it receives up
// to count instances of d into buf. Status.Bytes counts packed bytes;
// Status.GetCount(d) and GetElements(d) convert. A longer message fills the
// count instances and reports ErrTruncate. Errors as Recv, plus those of
// SendTyped.
func RecvTyped[T any](c *Comm, buf []T, count int, d *Datatype, src, tag int) (Status, error) {
	if err := c.valid(); err != nil {
		return Status{}, err
	}
	mem, lay, err := typed(buf, count, d)
	if err != nil {
		return Status{}, err
	}
	if c.hooked() {
		f := func() (Status, error) {
			if lay == nil && !c.checking() {
				return c.recv(mem, src, tag)
			}
			return c.recvLay(mem, lay, typeOf(d, count), src, tag)
		}
		return c.p.hookStatus(&Event{Call: CallRecv, Comm: c, Peer: src, Tag: tag, Bytes: packedLen(mem, lay)}, f)
	}
	// The status a field at a time, as Recv's: see copyStatus.
	var st Status
	if lay == nil && !c.checking() {
		err = c.recvInto(mem, src, tag, &st)
	} else {
		err = c.recvLayInto(mem, lay, typeOf(d, count), src, tag, &st)
	}
	return Status{Source: st.Source, Tag: st.Tag, Err: st.Err, Bytes: st.Bytes,
		Cancelled: st.Cancelled, Piggyback: st.Piggyback, HasPiggyback: st.HasPiggyback}, err
}

// IrecvTyped is MPI_Irecv with a datatype; see RecvTyped. buf must not be
// read or changed until the request completes.
func IrecvTyped[T any](c *Comm, buf []T, count int, d *Datatype, src, tag int) (Request, error) {
	if err := c.valid(); err != nil {
		return Request{}, err
	}
	mem, lay, err := typed(buf, count, d)
	if err != nil {
		return Request{}, err
	}
	n := packedLen(mem, lay)
	f := func() (Request, error) {
		if lay == nil && !c.checking() {
			return c.irecv(mem, src, tag)
		}
		return c.irecvLay(mem, lay, typeOf(d, count), src, tag)
	}
	if c.hooked() {
		return c.p.hookReq(&Event{Call: CallIrecv, Comm: c, Peer: src, Tag: tag, Bytes: n}, f)
	}
	return f()
}

// SendrecvTyped is MPI_Sendrecv with datatypes: it sends sendcount
// instances of sendtype from sendbuf to dest and receives up to recvcount
// instances of recvtype into recvbuf from src, and returns the receive's
// status. Errors as SendTyped and RecvTyped.
func SendrecvTyped[S, R any](c *Comm, sendbuf []S, sendcount int, sendtype *Datatype, dest, sendtag int,
	recvbuf []R, recvcount int, recvtype *Datatype, src, recvtag int) (Status, error) {
	if err := c.valid(); err != nil {
		return Status{}, err
	}
	smem, slay, err := typed(sendbuf, sendcount, sendtype)
	if err != nil {
		return Status{}, err
	}
	rmem, rlay, err := typed(recvbuf, recvcount, recvtype)
	if err != nil {
		return Status{}, err
	}
	smt, rmt := typeOf(sendtype, sendcount), typeOf(recvtype, recvcount)
	if c.hooked() {
		return c.p.hookStatus(&Event{Call: CallSendrecv, Comm: c, Peer: dest, Tag: sendtag, Bytes: packedLen(smem, slay)},
			func() (Status, error) {
				var st Status
				err := c.sendrecvLayInto(smem, slay, smt, dest, sendtag, rmem, rlay, rmt, src, recvtag, &st)
				return st, err
			})
	}
	// The status a field at a time, as Recv's: see copyStatus.
	var st Status
	err = c.sendrecvLayInto(smem, slay, smt, dest, sendtag, rmem, rlay, rmt, src, recvtag, &st)
	return Status{Source: st.Source, Tag: st.Tag, Err: st.Err, Bytes: st.Bytes,
		Cancelled: st.Cancelled, Piggyback: st.Piggyback, HasPiggyback: st.HasPiggyback}, err
}

// SendInitTyped is MPI_Send_init with a datatype (and the mode variants):
// an inactive persistent send of count instances of d from buf; Start
// begins each send. Errors as SendTyped, and ErrArg for a bad mode.
func SendInitTyped[T any](c *Comm, buf []T, count int, d *Datatype, dest, tag int, mode Mode) (Request, error) {
	if err := c.checkSend(dest, tag); err != nil {
		return Request{}, err
	}
	if mode > Ready {
		return Request{}, fmt.Errorf("%w: send mode %d", ErrArg, mode)
	}
	mem, lay, err := typed(buf, count, d)
	if err != nil {
		return Request{}, err
	}
	r, _ := c.newSend(mem, dest, tag, mode, false)
	r.lay = lay
	r.setType(typeOf(d, count))
	r.persistent = true
	return handleOf(r), nil
}

// RecvInitTyped is MPI_Recv_init with a datatype: an inactive persistent
// receive of up to count instances of d into buf. Errors as RecvTyped.
func RecvInitTyped[T any](c *Comm, buf []T, count int, d *Datatype, src, tag int) (Request, error) {
	if err := c.checkRecv(src, tag); err != nil {
		return Request{}, err
	}
	mem, lay, err := typed(buf, count, d)
	if err != nil {
		return Request{}, err
	}
	r, _ := c.newRecv(mem, src, tag, false)
	r.lay = lay
	r.setType(typeOf(d, count))
	r.persistent = true
	return handleOf(r), nil
}

// MrecvTyped is MPI_Mrecv with a datatype: it receives the message Mprobe
// or Improbe took into up to count instances of d in buf. Errors as
// Mrecv and RecvTyped.
func MrecvTyped[T any](m *Message, buf []T, count int, d *Datatype) (Status, error) {
	r, err := ImrecvTyped(m, buf, count, d)
	if err != nil {
		return Status{}, err
	}
	return r.Wait()
}

// ImrecvTyped is MPI_Imrecv with a datatype; see MrecvTyped.
func ImrecvTyped[T any](m *Message, buf []T, count int, d *Datatype) (Request, error) {
	mem, lay, err := typed(buf, count, d)
	if err != nil {
		return Request{}, err
	}
	if m == nil || !m.comm.hooked() {
		return imrecvLay(m, mem, lay, typeOf(d, count))
	}
	n := packedLen(mem, lay)
	return m.comm.p.hookReq(&Event{Call: CallImrecv, Comm: m.comm, Peer: int(m.env.Source), Tag: int(m.env.Tag), Bytes: n},
		func() (Request, error) { return imrecvLay(m, mem, lay, typeOf(d, count)) })
}
