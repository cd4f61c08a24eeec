package mpiam

import (
	"fmt"
	"os"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/mpiam/internal/dtype"
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
func (p *proc) sendWithSig(r *reqState, world int, rndv bool, pb handlers.Piggyback, addr, a0, a1, a2 uint64) error {
	if rndv {
		return p.ep.RequestShortWith(world, hRTSSig, pb, a0, a1, a2, uint64(r.size()), r.id, addr, r.sig)
	}
	data := r.buf
	if r.lay != nil {
		s := getScratch(r.lay.n)
		defer putScratch(s)
		r.lay.pack(s.b, r.buf, 0)
		data = s.b
	}
	return p.ep.RequestMediumWith(world, hEagerSig, data, pb, a0, a1, a2, r.sig)
}
