package mpiam

import (
	"fmt"
	"reflect"
	"unsafe"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/mpiam/internal/dtype"
)

// Accumulate operations travel as a code: the operation's number in
// rmaOpNames times 256 plus the element kind (dtype.Kind); the target
// applies the predefined operation to the window's bytes with the code's
// element type. MPI allows only predefined operations in one-sided
// accumulates (MPI-4.1 §12.3.4), Replace and NoOp included.

// rmaOpNames are the operations an accumulate may carry, by code.
var rmaOpNames = []string{"sum", "prod", "max", "min", "land", "lor", "lxor", "band", "bor", "bxor", "replace", "no_op"}

// Replace is MPI_REPLACE: the accumulate's value replaces the target's
// (MPI-4.1 §12.3.4); as a reduction, inout[i] = in[i].
func Replace[T any]() Op[T] {
	return Op[T]{Name: "replace", predefined: true, Fn: func(in, io []T) { copy(io, in) }}
}

// NoOp is MPI_NO_OP: the target's value is left as it is (GetAccumulate and
// FetchAndOp then only read it).
func NoOp[T any]() Op[T] {
	return Op[T]{Name: "no_op", predefined: true, Fn: func(in, io []T) {}}
}

// rmaOpCode is op's code on elements of T, or ErrOp for an operation that is
// not predefined, or ErrType for an element type without one.
func rmaOpCode[T any](op Op[T]) (uint64, error) {
	if !op.predefined {
		return 0, fmt.Errorf("%w: %q is not predefined; one-sided accumulates take predefined operations only (MPI-4.1 §12.3.4)", ErrOp, op.Name)
	}
	num := rmaOpNumber(op.Name)
	if num < 0 {
		return 0, fmt.Errorf("%w: %q in a one-sided accumulate", ErrOp, op.Name)
	}
	k := elemKind[T]()
	if k == 0 {
		return 0, fmt.Errorf("%w: %v in a one-sided accumulate", ErrType, reflect.TypeFor[T]())
	}
	return uint64(num)<<8 | uint64(k), nil
}

// rmaOpNumber is name's index in rmaOpNames, -1 if none (a switch: no
// loop of string compares on every accumulate).
func rmaOpNumber(name string) int {
	switch name {
	case "sum":
		return 0
	case "prod":
		return 1
	case "max":
		return 2
	case "min":
		return 3
	case "land":
		return 4
	case "lor":
		return 5
	case "lxor":
		return 6
	case "band":
		return 7
	case "bor":
		return 8
	case "bxor":
		return 9
	case "replace":
		return 10
	case "no_op":
		return 11
	}
	return -1
}

// elemKind is T's element kind, 0 for a type one-sided accumulates do not
// take; the common types without reflection.
func elemKind[T any]() dtype.Kind {
	var z T
	switch any(z).(type) {
	case int8:
		return dtype.Int8
	case int16:
		return dtype.Int16
	case int32:
		return dtype.Int32
	case int64:
		return dtype.Int64
	case uint8:
		return dtype.Uint8
	case uint16:
		return dtype.Uint16
	case uint32:
		return dtype.Uint32
	case uint64:
		return dtype.Uint64
	case float32:
		return dtype.Float32
	case float64:
		return dtype.Float64
	case complex64:
		return dtype.Complex64
	case complex128:
		return dtype.Complex128
	}
	k, ok := goKinds[reflect.TypeFor[T]().Kind()] // named types, int, uint
	if !ok {
		return 0
	}
	return k
}

// rmaApply applies the operation of code to n elements: inout[i] = in[i] op
// inout[i] over the window's bytes. false: a code this rank does not know,
// or lengths that are not whole elements.
func rmaApply(code uint64, in, inout []byte) bool {
	op, k := code>>8, dtype.Kind(code&0xff)
	if op >= uint64(len(rmaOpNames)) || len(in) != len(inout) {
		return false
	}
	switch k {
	case dtype.Int8:
		return applyInt[int8](op, in, inout)
	case dtype.Int16:
		return applyInt[int16](op, in, inout)
	case dtype.Int32:
		return applyInt[int32](op, in, inout)
	case dtype.Int64:
		return applyInt[int64](op, in, inout)
	case dtype.Uint8:
		return applyInt[uint8](op, in, inout)
	case dtype.Uint16:
		return applyInt[uint16](op, in, inout)
	case dtype.Uint32:
		return applyInt[uint32](op, in, inout)
	case dtype.Uint64:
		return applyInt[uint64](op, in, inout)
	case dtype.Float32:
		return applyReal[float32](op, in, inout)
	case dtype.Float64:
		return applyReal[float64](op, in, inout)
	case dtype.Complex64:
		return applyNum[complex64](op, in, inout)
	case dtype.Complex128:
		return applyNum[complex128](op, in, inout)
	}
	return false
}

// elems is b as elements of T; false when b is not whole elements.
func elems[T any](b []byte) ([]T, bool) {
	var z T
	if len(b)%int(unsafe.Sizeof(z)) != 0 {
		return nil, false
	}
	return fromRaw[T](b), true
}

// The operations' numbers in rmaOpNames.
const (
	opSum = iota
	opProd
	opMax
	opMin
	opLAnd
	opLOr
	opLXor
	opBAnd
	opBOr
	opBXor
	opReplace
	opNoOp
)

// applyNum applies the operations every Number has: plain loops, no
// operation value made per call (a predefined Op captures its type's
// dictionary, an allocation).
func applyNum[T Number](op uint64, in, inout []byte) bool {
	a, ok1 := elems[T](in)
	b, ok2 := elems[T](inout)
	if !ok1 || !ok2 {
		return false
	}
	switch op {
	case opSum:
		sumInto(a, b)
	case opProd:
		for i := range b {
			b[i] *= a[i]
		}
	case opReplace:
		copy(b, a)
	case opNoOp:
	default:
		return false
	}
	return true
}

func applyReal[T Real](op uint64, in, inout []byte) bool {
	if op != opMax && op != opMin {
		return applyNum[T](op, in, inout)
	}
	a, ok1 := elems[T](in)
	b, ok2 := elems[T](inout)
	if !ok1 || !ok2 {
		return false
	}
	if op == opMax {
		for i := range b {
			b[i] = max(a[i], b[i])
		}
	} else {
		for i := range b {
			b[i] = min(a[i], b[i])
		}
	}
	return true
}

func applyInt[T Integer](op uint64, in, inout []byte) bool {
	if op < opLAnd || op > opBXor {
		return applyReal[T](op, in, inout)
	}
	a, ok1 := elems[T](in)
	b, ok2 := elems[T](inout)
	if !ok1 || !ok2 {
		return false
	}
	for i := range b {
		switch op {
		case opLAnd:
			b[i] = truth[T](a[i] != 0 && b[i] != 0)
		case opLOr:
			b[i] = truth[T](a[i] != 0 || b[i] != 0)
		case opLXor:
			b[i] = truth[T]((a[i] != 0) != (b[i] != 0))
		case opBAnd:
			b[i] &= a[i]
		case opBOr:
			b[i] |= a[i]
		case opBXor:
			b[i] ^= a[i]
		}
	}
	return true
}

// Accumulate combines origin into target's window at displacement disp with
// op, element by element (MPI_Accumulate, MPI-4.1 §12.3.4): target[i] =
// origin[i] op target[i]. op must be predefined (Sum, Max, BXor, ...,
// Replace). Accumulates to the same location are atomic with respect to
// each other, element by element. Completion as Put's. Errors as Put's, plus
// ErrOp.
func Accumulate[T Number](w *Win, origin []T, target, disp int, op Op[T]) error {
	code, err := rmaOpCode(op)
	if err != nil {
		return err
	}
	data := raw(origin)
	off, world, err := w.access(target, disp, len(data), "Accumulate")
	if err != nil || len(data) == 0 {
		return err
	}
	if w.local != nil && w.local[target] != nil {
		w.lockPart(target) // applied here, through the node mapping
		rmaApply(code, data, w.local[target][off:off+len(data)])
		w.unlockPart(target)
		return nil
	}
	var z T
	return w.sendPieces(data, target, world, off, int(unsafe.Sizeof(z)), hRMAAcc, code, "Accumulate")
}

// sendPieces sends data to byte offset off of target's window in medium
// requests of handler h (arguments: window id, offset, then code when h is
// hRMAAcc), each at most the peer's medium size in whole es-byte elements,
// counting each as outstanding.
func (w *Win) sendPieces(data []byte, target, world, off, es int, h handlers.Index, code uint64, call string) error {
	chunk := w.p.ep.MaxMediumTo(world) / es * es
	for len(data) > 0 {
		n := min(len(data), chunk)
		w.begin(target)
		var err error
		if h == hRMAAcc {
			err = w.p.ep.RequestMedium(world, h, data[:n], uint64(w.id), uint64(off), code)
		} else {
			err = w.p.ep.RequestMedium(world, h, data[:n], uint64(w.id), uint64(off))
		}
		if err != nil {
			w.abandon(target)
			return w.p.netErr(w.c, world, fmt.Sprintf("%s to rank %d", call, target), err)
		}
		data, off = data[n:], off+n
	}
	return nil
}

// onRMAAcc runs at the target: apply an accumulate's operands to the window.
func (p *proc) onRMAAcc(tok *handlers.Token, a []uint64, payload []byte) {
	p.mu.Lock()
	w := p.winLocked(a[0])
	st := uint64(rmaOK)
	if w == nil {
		st = rmaNoWin
	} else if cur := w.regionLocked(a[1], uint64(len(payload))); cur == nil {
		st = rmaRange
	} else {
		w.lockPart(w.c.rank)
		if !rmaApply(a[2], payload, cur) {
			st = rmaBadOp
		}
		w.unlockPart(w.c.rank)
	}
	p.mu.Unlock()
	rmaAck(tok, a[0], st)
}

// rmaCAS marks a fetch request's code as CompareAndSwap.
const rmaCAS = 1 << 16

// FetchAndOp combines origin into the element of T at displacement disp of
// target's window with op and returns the element's previous value in
// *result (MPI_Fetch_and_op, MPI-4.1 §12.3.4), atomically with respect to
// the window's other accumulates. *result is set once a Flush, Unlock or
// Fence that follows returns (NoOp: an atomic read). Errors as Accumulate's.
func FetchAndOp[T Number](w *Win, origin T, result *T, target, disp int, op Op[T]) error {
	code, err := rmaOpCode(op)
	if err != nil {
		return err
	}
	if result == nil {
		return fmt.Errorf("%w: nil result", ErrBuffer)
	}
	var z T
	if w.fetchLocal(unsafe.Pointer(&origin), unsafe.Pointer(result), int(unsafe.Sizeof(z)), target, disp, code, "FetchAndOp") {
		return nil
	}
	in := []T{origin}
	return w.fetch(raw(in), raw(unsafe.Slice(result, 1)), target, disp, code, "FetchAndOp")
}

// fetchLocal is a fetch operation of one n-byte element (in: the operand,
// then the comparand) applied here when target's memory is in this rank's
// node mapping; false when it is not, or when the call has an error for
// the general path to report. It allocates nothing, where the network's
// path needs its operands on the heap.
func (w *Win) fetchLocal(in, result unsafe.Pointer, n, target, disp int, code uint64, call string) bool {
	if w == nil || w.local == nil || target < 0 || target >= len(w.local) || w.local[target] == nil {
		return false
	}
	off, _, err := w.access(target, disp, n, call)
	if err != nil {
		return false
	}
	operand := unsafe.Slice((*byte)(in), n)
	if code&rmaCAS != 0 {
		operand = unsafe.Slice((*byte)(in), 2*n)
	}
	w.lockPart(target)
	fetchApply(w.local[target][off:off+n], operand, unsafe.Slice((*byte)(result), n), code&^rmaCAS, code&rmaCAS != 0)
	w.unlockPart(target)
	return true
}

// CompareAndSwap replaces the element of T at displacement disp of target's
// window with origin if it equals compare, and returns its previous value in
// *result (MPI_Compare_and_swap, MPI-4.1 §12.3.4), atomically with respect to
// the window's accumulates. *result is set once a Flush, Unlock or Fence that
// follows returns. Errors as Put's.
func CompareAndSwap[T Integer](w *Win, origin, compare T, result *T, target, disp int) error {
	code, err := rmaOpCode(Replace[T]())
	if err != nil {
		return err
	}
	if result == nil {
		return fmt.Errorf("%w: nil result", ErrBuffer)
	}
	var z T
	pair := [2]T{origin, compare}
	if w.fetchLocal(unsafe.Pointer(&pair), unsafe.Pointer(result), int(unsafe.Sizeof(z)), target, disp, code|rmaCAS, "CompareAndSwap") {
		return nil
	}
	in := []T{origin, compare}
	return w.fetch(raw(in), raw(unsafe.Slice(result, 1)), target, disp, code|rmaCAS, "CompareAndSwap")
}

// fetch sends a FetchAndOp's or CompareAndSwap's request: in is the operand
// (and the comparand), result where the old value goes.
func (w *Win) fetch(in, result []byte, target, disp int, code uint64, call string) error {
	off, world, err := w.access(target, disp, len(result), call)
	if err != nil {
		return err
	}
	if w.local != nil && w.local[target] != nil {
		w.lockPart(target) // applied here, through the node mapping
		fetchApply(w.local[target][off:off+len(result)], in, result, code&^rmaCAS, code&rmaCAS != 0)
		w.unlockPart(target)
		return nil
	}
	p := w.p
	p.mu.Lock()
	w.cookie++
	cookie := w.cookie
	if w.fetches == nil {
		w.fetches = map[uint64][]byte{}
	}
	w.fetches[cookie] = result
	w.pending[target]++
	w.npending++
	w.settleLocked()
	p.mu.Unlock()
	if err := p.ep.RequestMedium(world, hRMAFetch, in, uint64(w.id), uint64(off), code, cookie); err != nil {
		p.mu.Lock()
		delete(w.fetches, cookie)
		w.doneLocked(target, nil)
		p.mu.Unlock()
		return p.netErr(w.c, world, fmt.Sprintf("%s to rank %d", call, target), err)
	}
	return nil
}

// onRMAFetch runs at the target: read the element, apply the operation (or
// compare and swap), and send the old value back.
func (p *proc) onRMAFetch(tok *handlers.Token, a []uint64, payload []byte) {
	id, off, code, cookie := a[0], a[1], a[2], a[3]
	cas := code&rmaCAS != 0
	code &^= rmaCAS
	n := uint64(len(payload))
	if cas {
		n /= 2
	}
	var old [16]byte
	st := uint64(rmaOK)
	p.mu.Lock()
	w := p.winLocked(id)
	switch {
	case w == nil:
		st = rmaNoWin
	case n > uint64(len(old)) || cas && uint64(len(payload)) != 2*n:
		st = rmaBadOp
	case w.regionLocked(off, n) == nil:
		st = rmaRange
	default:
		w.lockPart(w.c.rank)
		if !fetchApply(w.regionLocked(off, n), payload, old[:n], code, cas) {
			st = rmaBadOp
		}
		w.unlockPart(w.c.rank)
	}
	p.mu.Unlock()
	if st != rmaOK {
		n = 0
	}
	_ = tok.ReplyMedium(hRMAFetched, old[:n], id, cookie, st)
}

// fetchApply is a fetch operation on cur: its old bytes into old, then the
// operation of code with operand in, or (cas) in's first half stored if
// cur equals its second half. false: an operation it does not know.
func fetchApply(cur, in, old []byte, code uint64, cas bool) bool {
	copy(old, cur)
	if !cas {
		return rmaApply(code, in, cur)
	}
	n := len(cur)
	if string(in[n:]) == string(cur) { // compare: bytes of an integer
		copy(cur, in[:n])
	}
	return true
}

// onRMAFetched runs at the origin: a FetchAndOp's or CompareAndSwap's old
// value.
func (p *proc) onRMAFetched(tok *handlers.Token, a []uint64, payload []byte) {
	src := tok.Source()
	p.mu.Lock()
	defer p.mu.Unlock()
	w, t := p.originLocked(a[0], src)
	if t < 0 {
		return
	}
	res, ok := w.fetches[a[1]]
	if !ok {
		return
	}
	delete(w.fetches, a[1])
	err := rmaErr(a[2], src)
	if err == nil && len(payload) == len(res) {
		copy(res, payload)
	} else if err == nil {
		err = fmt.Errorf("%w: world rank %d sent %d bytes for a %d-byte result", ErrIntern, src, len(payload), len(res))
	}
	w.doneLocked(t, err)
}
