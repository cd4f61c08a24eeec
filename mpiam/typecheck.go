package mpiam

import (
	"fmt"
	"os"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/mpiam/internal/dtype"
	"github.com/amgo-hpc/amgo/mpiam/internal/sched"
)

// EnvCheckTypes turns on the type-signature checking mode when set to "1"
// (or "true"): every point-to-point message carries the hash of its type
// signature, and a receive whose datatype's signature does not begin with
// the message's completes with ErrType (MPI-4.1 §3.3.1, type matching; the
// standard leaves the check to the implementation, and this is the debug
// mode its advice to implementors describes). Off by default: the check
// costs a hash per message and a longer header.
const EnvCheckTypes = "AMGO_CHECK_TYPES"

// checkTypesFromEnv reads EnvCheckTypes.
func checkTypesFromEnv() bool {
	v := os.Getenv(EnvCheckTypes)
	return v == "1" || v == "true"
}

// msgType is the type of a send's data or a receive's buffer: count
// instances of t (t nil: not checked).
type msgType struct {
	t     *dtype.Type
	count int64
}

// sliceType is the type of a slice of n elements of T: n instances of T's
// datatype (DatatypeOf), or none when T has none. A []byte is raw bytes,
// Go's untyped buffer, and matches any data as MPI_BYTE does.
func sliceType[T any](n int) msgType {
	var z T
	if _, ok := any(z).(byte); ok {
		return msgType{}
	}
	d, err := DatatypeOf[T]()
	if err != nil {
		return msgType{}
	}
	return msgType{d.t, int64(n)}
}

// typeOf is the type of count instances of d.
func typeOf(d *Datatype, count int) msgType { return msgType{d.t, int64(count)} }

// untyped reports whether mt's data is bytes without a type (Byte or
// Packed elements only, or no type), which MPI lets match any data of the
// same bytes: such messages and receives are not checked.
func (mt msgType) untyped() bool {
	if mt.t == nil {
		return true
	}
	k := mt.t.Homogeneous()
	return k == dtype.Byte || k == dtype.Packed
}

// checking reports whether c's rank checks type signatures.
func (c *Comm) checking() bool { return c != nil && c.p != nil && c.p.checkTypes }

// setType records the type of r's data: a send's signature hash for its
// header, a receive's type for the check.
func (r *reqState) setType(mt msgType) {
	if !r.p.checkTypes || mt.untyped() {
		return
	}
	if r.kind == kindSend {
		r.sig, r.hasSig = mt.t.PackedHash(mt.count), true
		return
	}
	r.useCold()
	r.rtype = mt
}

// sigErr checks n received bytes of a message with signature hash sig
// (hasSig: the sender sent one) against receive r's type: the first
// elements of the receive's signature must be the message's (MPI-4.1
// §3.3.1). It returns an ErrType error naming the message, or nil.
func (p *proc) sigErr(r *reqState, n int, sig uint64, hasSig bool, env envelopeInfo) error {
	if !p.checkTypes || !hasSig || r.rtype.untyped() {
		return nil
	}
	t, count := r.rtype.t, r.rtype.count
	elems, whole := t.ElementsIn(count, int64(n))
	if whole {
		if h, ok := t.Signature(count, elems); ok && h == sig {
			return nil
		}
	}
	return fmt.Errorf("%w: the type signature of the message from rank %d, tag %d (%d bytes) does not match the receive's datatype %s (MPI-4.1 §3.3.1; %s=1)",
		ErrType, env.src, env.tag, n, t, EnvCheckTypes)
}

// envelopeInfo names a message in errors.
type envelopeInfo struct{ src, tag int }

// sendWithSig sends r's eager message or request-to-send with its type
// signature hash after the usual arguments (hEagerSig, hRTSSig).
func (p *proc) sendWithSig(r *reqState, world int, rndv bool, pb handlers.Piggyback, addr, a0, a1 uint64) error {
	if rndv {
		return p.ep.RequestShortWith(world, hRTSSig, pb, a0, a1, uint64(r.size()), r.id, addr, r.sig)
	}
	data := r.buf
	if r.lay != nil {
		s := getScratch(r.lay.n)
		defer putScratch(s)
		r.lay.pack(s.b, r.buf, 0)
		data = s.b
	}
	return p.ep.RequestMediumWith(world, hEagerSig, data, pb, a0, a1, r.sig)
}

// Collectives in the checking mode. Every rank of a collective call
// contributes blocks of the same type signature (a Bcast's buffer, each
// rank's block of a Gather or Alltoall, the vector of a reduction): before
// the operation the ranks agree on the hash of one block's signature, with
// an Allreduce of (hash, ^hash) under Max, and a disagreement fails the call
// on every rank with ErrType. Untyped blocks ([]byte) contribute (0, 0) and
// match anything. The v collectives and the typed forms are not checked
// this way (their blocks differ by rank, or are staged as bytes).

// blockSig is the Allreduce contribution of a block of k elements of T.
func blockSig[T any](k int) [2]uint64 {
	mt := sliceType[T](k)
	if mt.untyped() {
		return [2]uint64{}
	}
	h := mt.t.PackedHash(int64(k))
	return [2]uint64{h, ^h}
}

// sigsDisagree reports whether the Max-reduced contributions show two
// typed blocks of different signatures.
func sigsDisagree(v [2]uint64) bool { return v[1] != 0 && v[0] != ^v[1] }

// sigErrColl is the error of a collective call whose ranks' blocks differ.
func sigErrColl(call Call) error {
	return fmt.Errorf("%w: the ranks' blocks of %s have different type signatures (MPI-4.1 §6.1; %s=1)", ErrType, call, EnvCheckTypes)
}

// agreeType runs the agreement of a blocking collective call on c whose
// blocks are k elements of T (checking mode only).
func agreeType[T any](c *Comm, call Call, k int) error {
	if !c.checking() {
		return nil
	}
	x, err := c.startColl(CallAllreduce, false)
	if err != nil {
		return err
	}
	mine, all := blockSig[T](k), [2]uint64{}
	if err := allreduce(x, mine[:], all[:], Max[uint64]()); err != nil {
		return err
	}
	if sigsDisagree(all) {
		return sigErrColl(call)
	}
	return nil
}

// sigCheck is the type-signature agreement that checking mode prepends to
// a nonblocking or persistent collective's schedule (on false: none).
type sigCheck struct {
	on   bool
	call Call
	mine [2]uint64
}

// sigCheckOf is the agreement of a call of k elements of T on c.
func sigCheckOf[T any](c *Comm, call Call, k int) sigCheck {
	if !c.checking() {
		return sigCheck{}
	}
	return sigCheck{on: true, call: call, mine: blockSig[T](k)}
}

// add prepends the agreement to the schedule b builds: the contributions
// are reduced in rounds of their own, and a disagreement ends the schedule
// with ErrType before any data moves. Kept apart from the collective's own
// builder, so that a call's builder (a closure over its arguments) stays on
// its stack outside checking mode.
func (k sigCheck) add(x coll, b *sched.Builder) {
	if !k.on {
		return
	}
	in, out := b.Temp(16), b.Temp(16)
	b.Call(func() error { copy(in, raw(k.mine[:])); return nil })
	sched.Allreduce(b, x.group(), in, out, reduction(Max[uint64]()), checkSteps)
	b.Call(func() error {
		if sigsDisagree([2]uint64(fromRaw[uint64](out))) {
			return sigErrColl(k.call)
		}
		return nil
	})
	b.Fence()
}

// checkedSched is build with the agreement prepended (checking mode only):
// for persistent collectives, built once.
func checkedSched[T any](c *Comm, call Call, k int, build func(x coll, b *sched.Builder) error) func(x coll, b *sched.Builder) error {
	chk := sigCheckOf[T](c, call, k)
	if !chk.on {
		return build
	}
	return func(x coll, b *sched.Builder) error {
		chk.add(x, b)
		return build(x, b)
	}
}

// checkSteps is the step base of the agreement's messages, clear of every
// algorithm's and level's steps (coll_node.go).
const checkSteps = 200

// rootBlock is the block of a rooted collective: mine elements away from
// root, at root all/p (its receive or send buffer holds p blocks).
func rootBlock(c *Comm, root, mine, all int) int {
	if c == nil || c.rank != root || c.size == 0 {
		return mine
	}
	return all / c.size
}

// perRank is a buffer of all elements split among c's ranks.
func perRank(c *Comm, all int) int {
	if c == nil || c.size == 0 {
		return all
	}
	return all / c.size
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sizeIf is c's size when cond holds, else 1 (an in-place reduce-scatter's
// buffer holds every rank's block).
func (c *Comm) sizeIf(cond bool) int {
	if !cond || c == nil {
		return 1
	}
	return c.size
}
