package mpiam

import (
	"cmp"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/amgo-hpc/amgo/internal/memcopy"
)

// Op is a reduction operation on elements of type T (MPI_Op, MPI-4.1 §6.9).
// Fn combines in into inout element-wise as inout[i] = in[i] ∘ inout[i], where
// in holds the contribution of lower ranks (MPI's user-function convention).
// An operation that is not Commutative is applied in rank order:
// x0 ∘ x1 ∘ ... ∘ x(n-1).
type Op[T any] struct {
	Name        string
	Fn          func(in, inout []T)
	Commutative bool
	// predefined marks the operations of this package (Sum, Max, ...),
	// whose behaviour their code alone decides (coll_sched.go's cache).
	predefined bool
}

// NewOp makes a user-defined operation (MPI_Op_create). fn must compute
// inout[i] = in[i] ∘ inout[i] for every i and be associative.
func NewOp[T any](name string, fn func(in, inout []T), commutative bool) Op[T] {
	return Op[T]{Name: name, Fn: fn, Commutative: commutative}
}

// Number is the set of element types with arithmetic.
type Number interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~int | ~uint |
		~float32 | ~float64 | ~complex64 | ~complex128
}

// Real is the set of ordered numeric element types.
type Real interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~int | ~uint |
		~float32 | ~float64
}

// Integer is the set of integer element types (bitwise and logical operations).
type Integer interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~int | ~uint
}

// Sum is MPI_SUM.
func Sum[T Number]() Op[T] {
	return Op[T]{Name: "sum", Commutative: true, predefined: true, Fn: sumFn[T]()}
}

// sumFn is sumInto for T. For the common element types it is a function
// value of a concrete instantiation, which needs no allocation where the
// generic one binds T's dictionary in a closure: a loop that passes Sum[T]()
// to a nonblocking collective, whose operation outlives the call,
// allocates nothing for it.
func sumFn[T Number]() func(in, io []T) {
	var f any
	switch any(*new(T)).(type) {
	case float64:
		f = sumInto[float64]
	case float32:
		f = sumInto[float32]
	case int:
		f = sumInto[int]
	case int64:
		f = sumInto[int64]
	case int32:
		f = sumInto[int32]
	case uint64:
		f = sumInto[uint64]
	case uint32:
		f = sumInto[uint32]
	default:
		return sumInto[T]
	}
	return f.(func(in, io []T))
}

// sumInto sets io[i] = in[i] + io[i], eight elements per iteration: the
// independent adds overlap, where the plain loop's wait for each other, and
// each result is the one the plain loop computes.
func sumInto[T Number](in, io []T) {
	in = in[:len(io)]
	i := 0
	for ; i+8 <= len(io); i += 8 {
		a, b := in[i:i+8:i+8], io[i:i+8:i+8]
		b[0] = a[0] + b[0]
		b[1] = a[1] + b[1]
		b[2] = a[2] + b[2]
		b[3] = a[3] + b[3]
		b[4] = a[4] + b[4]
		b[5] = a[5] + b[5]
		b[6] = a[6] + b[6]
		b[7] = a[7] + b[7]
	}
	for ; i < len(io); i++ {
		io[i] = in[i] + io[i]
	}
}

// Prod is MPI_PROD.
func Prod[T Number]() Op[T] {
	return Op[T]{Name: "prod", Commutative: true, predefined: true, Fn: func(in, io []T) {
		for i := range io {
			io[i] = in[i] * io[i]
		}
	}}
}

// Max is MPI_MAX.
func Max[T Real]() Op[T] {
	return Op[T]{Name: "max", Commutative: true, predefined: true, Fn: func(in, io []T) {
		for i := range io {
			io[i] = max(in[i], io[i])
		}
	}}
}

// Min is MPI_MIN.
func Min[T Real]() Op[T] {
	return Op[T]{Name: "min", Commutative: true, predefined: true, Fn: func(in, io []T) {
		for i := range io {
			io[i] = min(in[i], io[i])
		}
	}}
}

func truth[T Integer](b bool) T {
	if b {
		return 1
	}
	return 0
}

// LAnd is MPI_LAND: 1 if both are non-zero, else 0.
func LAnd[T Integer]() Op[T] {
	return Op[T]{Name: "land", Commutative: true, predefined: true, Fn: func(in, io []T) {
		for i := range io {
			io[i] = truth[T](in[i] != 0 && io[i] != 0)
		}
	}}
}

// LOr is MPI_LOR.
func LOr[T Integer]() Op[T] {
	return Op[T]{Name: "lor", Commutative: true, predefined: true, Fn: func(in, io []T) {
		for i := range io {
			io[i] = truth[T](in[i] != 0 || io[i] != 0)
		}
	}}
}

// LXor is MPI_LXOR.
func LXor[T Integer]() Op[T] {
	return Op[T]{Name: "lxor", Commutative: true, predefined: true, Fn: func(in, io []T) {
		for i := range io {
			io[i] = truth[T]((in[i] != 0) != (io[i] != 0))
		}
	}}
}

// BAnd is MPI_BAND.
func BAnd[T Integer]() Op[T] {
	return Op[T]{Name: "band", Commutative: true, predefined: true, Fn: func(in, io []T) {
		for i := range io {
			io[i] = in[i] & io[i]
		}
	}}
}

// BOr is MPI_BOR.
func BOr[T Integer]() Op[T] {
	return Op[T]{Name: "bor", Commutative: true, predefined: true, Fn: func(in, io []T) {
		for i := range io {
			io[i] = in[i] | io[i]
		}
	}}
}

// BXor is MPI_BXOR.
func BXor[T Integer]() Op[T] {
	return Op[T]{Name: "bxor", Commutative: true, predefined: true, Fn: func(in, io []T) {
		for i := range io {
			io[i] = in[i] ^ io[i]
		}
	}}
}

// ValueIndex is the element of MaxLoc and MinLoc (MPI_DOUBLE_INT and its
// kin): a value and the index (usually a rank) where it was found.
type ValueIndex[T Real] struct {
	Value T
	Index int64
}

// MaxLoc is MPI_MAXLOC: the largest value, and the smallest index among equal ones.
func MaxLoc[T Real]() Op[ValueIndex[T]] {
	return Op[ValueIndex[T]]{Name: "maxloc", Commutative: true, Fn: func(in, io []ValueIndex[T]) {
		for i := range io {
			if c := cmp.Compare(in[i].Value, io[i].Value); c > 0 || c == 0 && in[i].Index < io[i].Index {
				io[i] = in[i]
			}
		}
	}}
}

// MinLoc is MPI_MINLOC: the smallest value, and the smallest index among equal ones.
func MinLoc[T Real]() Op[ValueIndex[T]] {
	return Op[ValueIndex[T]]{Name: "minloc", Commutative: true, Fn: func(in, io []ValueIndex[T]) {
		for i := range io {
			if c := cmp.Compare(in[i].Value, io[i].Value); c < 0 || c == 0 && in[i].Index < io[i].Index {
				io[i] = in[i]
			}
		}
	}}
}

var plainTypes sync.Map // reflect.Type -> error (nil: plain)

// plainSeen remembers types plain accepted, by their type descriptor's
// address, direct-mapped: a hit costs a load and a compare, where the type
// switch below costs a dozen branches on every call.
var plainSeen [64]atomic.Uintptr

// typeWord is the address of *T's type descriptor: it names T uniquely and
// never moves (descriptors of compiled types live in the binary).
func typeWord[T any]() uintptr {
	var e any = (*T)(nil)
	return uintptr((*[2]unsafe.Pointer)(unsafe.Pointer(&e))[0])
}

// plain checks that T's memory can travel as bytes: no pointers, maps,
// slices, strings, interfaces, channels or funcs anywhere in it.
func plain[T any]() error {
	k := typeWord[T]()
	slot := &plainSeen[(k>>4)&63]
	if slot.Load() == k {
		return nil
	}
	if err := plainSlow[T](); err != nil {
		return err
	}
	slot.Store(k)
	return nil
}

func plainSlow[T any]() error {
	var zero T
	switch any(zero).(type) { // the common element types, without reflection or the cache
	case bool, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64,
		float32, float64, complex64, complex128:
		return nil
	}
	t := reflect.TypeFor[T]()
	if v, ok := plainTypes.Load(t); ok {
		if v == nil {
			return nil
		}
		return v.(error)
	}
	var err error
	if !isPlain(t) {
		err = fmt.Errorf("%w: %v holds pointers; collectives move fixed-size values only", ErrType, t)
	}
	if err == nil {
		plainTypes.Store(t, nil)
	} else {
		plainTypes.Store(t, err)
	}
	return err
}

func isPlain(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return true
	case reflect.Array:
		return isPlain(t.Elem())
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			if !isPlain(t.Field(i).Type) {
				return false
			}
		}
		return true
	}
	return false
}

// copyT is copy for a collective's local data, which may be large: plain
// values of 1 MiB or more move in pieces that keep the destination in the
// caches (internal/memcopy).
func copyT[T any](dst, src []T) int {
	var z T
	sz := int(unsafe.Sizeof(z))
	if sz == 0 || min(len(dst), len(src))*sz < memcopy.Min || plain[T]() != nil {
		return copy(dst, src)
	}
	return memcopy.Copy(raw(dst), raw(src)) / sz
}

// raw views a slice of plain values as bytes, without copying.
func raw[T any](buf []T) []byte {
	if len(buf) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(buf))), len(buf)*int(unsafe.Sizeof(z)))
}
