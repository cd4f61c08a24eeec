package mpiam

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/amgo-hpc/amgo/mpiam/internal/dtype"
)

// Datatype is an MPI datatype (MPI-4.1 chapter 5): a layout of basic
// elements in memory, with a lower bound and an extent, that a
// communication call applies count times to a buffer. The predefined
// datatypes (Byte, Int32, Float64, ...) describe one Go value each; the
// constructors (TypeContiguous, TypeVector, TypeCreateStruct,
// TypeCreateSubarray, ...) build derived datatypes, which must be committed
// (Commit) before communication uses them. DatatypeOf builds one from a Go
// type.
//
// Displacements are in bytes from the start of the buffer a call is given
// (the first element of a Go slice); a call checks that every byte the
// datatype touches lies within that slice (ErrBuffer), so a wrong datatype
// cannot read or write outside it. Messages carry packed data: the basic
// elements in typemap order, as MPI_Pack produces (docs/mpi.md
// "Datatypes").
//
// A Datatype is safe for concurrent use; Free and Commit are the only
// changes, and operations already started keep the layout they were given.
type Datatype struct {
	t          *dtype.Type
	predefined bool
	committed  atomic.Bool
	freed      atomic.Bool
	name       atomic.Pointer[string]
	lay        atomic.Pointer[layout] // the layout of the count used last (layoutOf)
}

func predefined(k dtype.Kind, name string) *Datatype {
	d := &Datatype{t: dtype.Basic(k), predefined: true}
	d.committed.Store(true)
	d.name.Store(&name)
	return d
}

// The predefined datatypes (MPI-4.1 §3.2.2, Table 3.2), one per Go
// fixed-size type: MPI_BYTE, MPI_C_BOOL, MPI_INT8_T ... MPI_UINT64_T,
// MPI_FLOAT, MPI_DOUBLE, MPI_C_FLOAT_COMPLEX, MPI_C_DOUBLE_COMPLEX, and
// MPI_PACKED for data made by Pack. Int and Uint are Go's int and uint
// (64 bits on the platforms amgo runs on, as Int64 and Uint64).
var (
	Byte       = predefined(dtype.Byte, "MPI_BYTE")
	Bool       = predefined(dtype.Bool, "MPI_C_BOOL")
	Int8       = predefined(dtype.Int8, "MPI_INT8_T")
	Int16      = predefined(dtype.Int16, "MPI_INT16_T")
	Int32      = predefined(dtype.Int32, "MPI_INT32_T")
	Int64      = predefined(dtype.Int64, "MPI_INT64_T")
	Uint8      = predefined(dtype.Uint8, "MPI_UINT8_T")
	Uint16     = predefined(dtype.Uint16, "MPI_UINT16_T")
	Uint32     = predefined(dtype.Uint32, "MPI_UINT32_T")
	Uint64     = predefined(dtype.Uint64, "MPI_UINT64_T")
	Float32    = predefined(dtype.Float32, "MPI_FLOAT")
	Float64    = predefined(dtype.Float64, "MPI_DOUBLE")
	Complex64  = predefined(dtype.Complex64, "MPI_C_FLOAT_COMPLEX")
	Complex128 = predefined(dtype.Complex128, "MPI_C_DOUBLE_COMPLEX")
	Packed     = predefined(dtype.Packed, "MPI_PACKED")
	Int        = predefined(dtype.Int64, "MPI_INT64_T")
	Uint       = predefined(dtype.Uint64, "MPI_UINT64_T")
)

// Order is the storage order of the array TypeCreateSubarray describes.
type Order = dtype.Order

// OrderC (MPI_ORDER_C) stores the last dimension fastest, as Go and C store
// nested arrays; OrderFortran (MPI_ORDER_FORTRAN) the first.
const (
	OrderC       = dtype.OrderC
	OrderFortran = dtype.OrderFortran
)

// valid reports a nil or freed datatype (ErrType).
func (d *Datatype) valid() error {
	if d == nil {
		return fmt.Errorf("%w: nil datatype", ErrType)
	}
	if d.freed.Load() {
		return fmt.Errorf("%w: datatype %s was freed", ErrType, d.Name())
	}
	return nil
}

// usable reports a datatype communication may not use: nil, freed, or not
// committed (MPI-4.1 §5.1.9).
func (d *Datatype) usable() error {
	if err := d.valid(); err != nil {
		return err
	}
	if !d.committed.Load() {
		return fmt.Errorf("%w: datatype %s is not committed (Commit)", ErrType, d.Name())
	}
	return nil
}

func derived(t *dtype.Type, err error) (*Datatype, error) {
	if err != nil {
		if errors.Is(err, dtype.ErrInvalid) {
			return nil, fmt.Errorf("%w: %v", ErrArg, err)
		}
		return nil, err
	}
	return &Datatype{t: t}, nil
}

func types(old ...*Datatype) error {
	for _, d := range old {
		if err := d.valid(); err != nil {
			return err
		}
	}
	return nil
}

func int64s(v []int) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

// TypeContiguous is MPI_Type_contiguous (MPI-4.1 §5.1.2): count copies of
// old, each old's extent after the previous. Errors: ErrType (old nil or
// freed), ErrArg (count < 0, or a type of more than 2^63 bytes).
func TypeContiguous(count int, old *Datatype) (*Datatype, error) {
	if err := types(old); err != nil {
		return nil, err
	}
	return derived(dtype.Contiguous(int64(count), old.t))
}

// TypeVector is MPI_Type_vector (MPI-4.1 §5.1.2): count blocks of blocklen
// copies of old, the blocks' starts stride extents of old apart (stride may
// be negative). Errors as TypeContiguous.
func TypeVector(count, blocklen, stride int, old *Datatype) (*Datatype, error) {
	if err := types(old); err != nil {
		return nil, err
	}
	return derived(dtype.Vector(int64(count), int64(blocklen), int64(stride), old.t))
}

// TypeCreateHvector is MPI_Type_create_hvector: TypeVector with the stride
// in bytes. Errors as TypeContiguous.
func TypeCreateHvector(count, blocklen, strideBytes int, old *Datatype) (*Datatype, error) {
	if err := types(old); err != nil {
		return nil, err
	}
	return derived(dtype.Hvector(int64(count), int64(blocklen), int64(strideBytes), old.t))
}

// TypeIndexed is MPI_Type_indexed (MPI-4.1 §5.1.2): block i holds
// blocklens[i] copies of old, starting displs[i] extents of old from the
// origin. Errors as TypeContiguous, and ErrArg for slices of different
// lengths.
func TypeIndexed(blocklens, displs []int, old *Datatype) (*Datatype, error) {
	if err := types(old); err != nil {
		return nil, err
	}
	return derived(dtype.Indexed(int64s(blocklens), int64s(displs), old.t))
}

// TypeCreateHindexed is MPI_Type_create_hindexed: TypeIndexed with the
// displacements in bytes. Errors as TypeIndexed.
func TypeCreateHindexed(blocklens, displsBytes []int, old *Datatype) (*Datatype, error) {
	if err := types(old); err != nil {
		return nil, err
	}
	return derived(dtype.Hindexed(int64s(blocklens), int64s(displsBytes), old.t))
}

// TypeCreateIndexedBlock is MPI_Type_create_indexed_block: blocks of
// blocklen copies of old at displs extents of old. Errors as TypeIndexed.
func TypeCreateIndexedBlock(blocklen int, displs []int, old *Datatype) (*Datatype, error) {
	if err := types(old); err != nil {
		return nil, err
	}
	return derived(dtype.IndexedBlock(int64(blocklen), int64s(displs), old.t))
}

// TypeCreateHindexedBlock is MPI_Type_create_hindexed_block: blocks of
// blocklen copies of old at displs bytes. Errors as TypeIndexed.
func TypeCreateHindexedBlock(blocklen int, displsBytes []int, old *Datatype) (*Datatype, error) {
	if err := types(old); err != nil {
		return nil, err
	}
	return derived(dtype.HindexedBlock(int64(blocklen), int64s(displsBytes), old.t))
}

// TypeCreateStruct is MPI_Type_create_struct (MPI-4.1 §5.1.2): block i
// holds blocklens[i] copies of types[i] at displs[i] bytes. Its upper bound
// is padded to a multiple of the alignment of the most aligned basic type
// inside, as a C or Go compiler pads a struct (§5.1.6). Errors as
// TypeIndexed.
func TypeCreateStruct(blocklens, displsBytes []int, typs []*Datatype) (*Datatype, error) {
	if err := types(typs...); err != nil {
		return nil, err
	}
	ts := make([]*dtype.Type, len(typs))
	for i, d := range typs {
		ts[i] = d.t
	}
	return derived(dtype.Struct(int64s(blocklens), int64s(displsBytes), ts))
}

// TypeCreateSubarray is MPI_Type_create_subarray (MPI-4.1 §5.1.3): the
// block of subsizes elements starting at starts within an array of sizes
// elements of old, stored in order. Its lower bound is 0 and its extent the
// whole array's, so that count > 1 describes consecutive arrays. Errors as
// TypeContiguous, and ErrArg for a block outside the array or dimensions
// that disagree.
func TypeCreateSubarray(sizes, subsizes, starts []int, order Order, old *Datatype) (*Datatype, error) {
	if err := types(old); err != nil {
		return nil, err
	}
	return derived(dtype.Subarray(int64s(sizes), int64s(subsizes), int64s(starts), order, old.t))
}

// TypeCreateResized is MPI_Type_create_resized (MPI-4.1 §5.1.7): old with
// lower bound lb and extent extent, in bytes; the data stays where it was.
// Errors: ErrType.
func TypeCreateResized(old *Datatype, lb, extent int) (*Datatype, error) {
	if err := types(old); err != nil {
		return nil, err
	}
	return derived(dtype.Resized(old.t, int64(lb), int64(extent)))
}

// Dup is MPI_Type_dup: a new datatype with the same layout, committed if d
// is (MPI-4.1 §5.1.10). Errors: ErrType.
func (d *Datatype) Dup() (*Datatype, error) {
	if err := d.valid(); err != nil {
		return nil, err
	}
	n := &Datatype{t: d.t}
	n.committed.Store(d.committed.Load())
	return n, nil
}

// Commit is MPI_Type_commit: d may now be used in communication. A
// predefined or already committed datatype is left as it is. Errors:
// ErrType (nil or freed).
func (d *Datatype) Commit() error {
	if err := d.valid(); err != nil {
		return err
	}
	d.committed.Store(true)
	return nil
}

// Free is MPI_Type_free: d may no longer be used; operations under way and
// datatypes built from d are not affected. Errors: ErrType (nil, already
// freed, or predefined).
func (d *Datatype) Free() error {
	if err := d.valid(); err != nil {
		return err
	}
	if d.predefined {
		return fmt.Errorf("%w: predefined datatype %s cannot be freed", ErrType, d.Name())
	}
	if !d.freed.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: datatype freed twice", ErrType)
	}
	return nil
}

// Size is MPI_Type_size: the bytes of data in one instance of d (0 for a
// nil or freed datatype).
func (d *Datatype) Size() int {
	if d.valid() != nil {
		return 0
	}
	return int(d.t.Size())
}

// Extent is MPI_Type_get_extent: d's lower bound and extent, in bytes.
// Errors: ErrType.
func (d *Datatype) Extent() (lb, extent int, err error) {
	if err := d.valid(); err != nil {
		return 0, 0, err
	}
	l, e := d.t.Extent()
	return int(l), int(e), nil
}

// TrueExtent is MPI_Type_get_true_extent: the lower bound and extent of the
// bytes d's data occupies, ignoring TypeCreateResized. Errors: ErrType.
func (d *Datatype) TrueExtent() (lb, extent int, err error) {
	if err := d.valid(); err != nil {
		return 0, 0, err
	}
	l, e := d.t.TrueExtent()
	return int(l), int(e), nil
}

// SetName is MPI_Type_set_name.
func (d *Datatype) SetName(name string) {
	if d != nil {
		d.name.Store(&name)
	}
}

// Name is MPI_Type_get_name: the name SetName gave, the MPI name of a
// predefined datatype, or a description of how d was built.
func (d *Datatype) Name() string {
	if d == nil {
		return "MPI_DATATYPE_NULL"
	}
	if n := d.name.Load(); n != nil {
		return *n
	}
	return d.t.String()
}

// String is Name.
func (d *Datatype) String() string { return d.Name() }

// GetCount is MPI_Get_count with a datatype: the number of whole instances
// of d the status's message holds, or Undefined when it is not a whole
// number (or d is invalid).
func (s Status) GetCount(d *Datatype) int {
	if d.valid() != nil {
		return Undefined
	}
	sz := d.Size()
	if sz == 0 {
		if s.Bytes == 0 {
			return 0
		}
		return Undefined
	}
	if s.Bytes%sz != 0 {
		return Undefined
	}
	return s.Bytes / sz
}

// GetElements is MPI_Get_elements (MPI-4.1 §5.1.11): the number of basic
// elements of d's typemap the status's message holds (the message may end
// inside an instance of d), or Undefined when it ends inside a basic
// element (or d is invalid).
func (s Status) GetElements(d *Datatype) int {
	if d.valid() != nil {
		return Undefined
	}
	sz := int64(d.Size())
	if sz == 0 {
		return 0
	}
	count := (int64(s.Bytes) + sz - 1) / sz
	e, exact := d.t.ElementsIn(count, int64(s.Bytes))
	if !exact {
		return Undefined
	}
	return int(e)
}

// memOf views a slice of plain values as the bytes a datatype's
// displacements count from. Errors: ErrBuffer when T holds pointers.
func memOf[T any](buf []T) ([]byte, error) {
	if err := plain[T](); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBuffer, err)
	}
	return raw(buf), nil
}

// layoutOf checks count instances of d against mem and returns the packed
// view: the contiguous bytes when they are one run (lay nil), else the
// layout. Errors: ErrType (d unusable), ErrCount (count < 0), ErrBuffer
// (data outside mem).
func layoutOf(mem []byte, count int, d *Datatype) ([]byte, *layout, error) {
	if err := d.usable(); err != nil {
		return nil, nil, err
	}
	// The layout of the count used last, checked against its span: a loop
	// sending the same datatype skips the general checks.
	if l := d.lay.Load(); l != nil && l.count == int64(count) && l.hi <= int64(len(mem)) {
		return mem, l, nil
	}
	if count < 0 {
		return nil, nil, fmt.Errorf("%w: %d", ErrCount, count)
	}
	if err := d.t.Check(int64(count), int64(len(mem))); err != nil {
		if errors.Is(err, dtype.ErrInvalid) {
			return nil, nil, fmt.Errorf("%w: %v", ErrCount, err)
		}
		return nil, nil, fmt.Errorf("%w: %v", ErrBuffer, err)
	}
	n := int64(count) * d.t.Size()
	if off, ok := d.t.Contiguous(int64(count)); ok {
		return mem[off : off+n : off+n], nil, nil
	}
	// A layout is immutable: the one of the count used last is kept, so that
	// a loop sending the same datatype allocates none.
	_, hi := d.t.Span(int64(count))
	l := &layout{t: d.t, count: int64(count), n: int(n), hi: hi}
	d.lay.Store(l)
	return mem, l, nil
}

// layout is the non-contiguous data of a typed buffer: count instances of
// t, whose first origin is the start of the request's buf.
type layout struct {
	t     *dtype.Type
	count int64
	n     int   // packed bytes
	hi    int64 // the end of the bytes the data touches (its lowest is at least 0, checked)
}

func (l *layout) pack(dst, mem []byte, from int) int {
	return l.t.Pack(dst, mem, l.count, int64(from))
}

// packNT is pack for a destination that another process reads next (a
// shared stage): with non-temporal stores, fenced (dtype.Type.PackNT).
func (l *layout) packNT(dst, mem []byte, from int) int {
	return l.t.PackNT(dst, mem, l.count, int64(from))
}

func (l *layout) unpack(mem, src []byte, from int) int {
	return l.t.Unpack(mem, src, l.count, int64(from))
}

// PackSize is MPI_Pack_size: an upper bound (here the exact size) of the
// bytes Pack writes for count instances of d. Errors: ErrType, ErrCount.
func PackSize(count int, d *Datatype) (int, error) {
	if err := d.valid(); err != nil {
		return 0, err
	}
	if count < 0 {
		return 0, fmt.Errorf("%w: %d", ErrCount, count)
	}
	return count * d.Size(), nil
}

// Pack is MPI_Pack (MPI-4.1 §5.2.1): it packs count instances of d from in
// into out at position (bytes) and returns the position after them.
// Errors: ErrType (d unusable), ErrCount, ErrBuffer (in's data outside in,
// or T holds pointers), ErrTruncate (out too small; nothing is written).
func Pack[T any](in []T, count int, d *Datatype, out []byte, position int) (int, error) {
	mem, err := memOf(in)
	if err != nil {
		return position, err
	}
	contig, lay, err := layoutOf(mem, count, d)
	if err != nil {
		return position, err
	}
	n := count * d.Size()
	if position < 0 || position > len(out) || n > len(out)-position {
		return position, fmt.Errorf("%w: packing %d bytes at %d of a buffer of %d", ErrTruncate, n, position, len(out))
	}
	if lay == nil {
		copy(out[position:], contig)
	} else {
		lay.pack(out[position:position+n], mem, 0)
	}
	return position + n, nil
}

// Unpack is MPI_Unpack (MPI-4.1 §5.2.1): it unpacks count instances of d
// into out from in at position (bytes) and returns the position after
// them. Errors as Pack, with ErrTruncate when in holds fewer bytes.
func Unpack[T any](in []byte, position int, out []T, count int, d *Datatype) (int, error) {
	mem, err := memOf(out)
	if err != nil {
		return position, err
	}
	contig, lay, err := layoutOf(mem, count, d)
	if err != nil {
		return position, err
	}
	n := count * d.Size()
	if position < 0 || position > len(in) || n > len(in)-position {
		return position, fmt.Errorf("%w: unpacking %d bytes at %d of a buffer of %d", ErrTruncate, n, position, len(in))
	}
	if lay == nil {
		copy(contig, in[position:position+n])
	} else {
		lay.unpack(mem, in[position:position+n], 0)
	}
	return position + n, nil
}

// Displacement is the byte distance from base to field, the Go form of
// MPI_Aint_diff(MPI_Get_address(field), MPI_Get_address(base)): with base
// the first element of a buffer and field a value inside it (a struct
// field, an element), it is field's displacement for TypeCreateStruct and
// TypeCreateHindexed.
func Displacement[T, F any](base *T, field *F) int {
	return int(uintptr(unsafe.Pointer(field)) - uintptr(unsafe.Pointer(base)))
}

var goTypes sync.Map // reflect.Type -> *Datatype

// DatatypeOf returns the committed datatype of the Go type T: a predefined
// datatype for Go's fixed-size numeric types and bool, TypeContiguous for
// arrays, and for structs TypeCreateStruct of the fields at their offsets,
// resized to the Go size of T (its padding included), so that a []T is count
// instances. It is built once per type, by reflection, and cached. Errors:
// ErrType when T holds pointers, strings, slices, maps, interfaces,
// channels or funcs, or is an empty struct.
func DatatypeOf[T any]() (*Datatype, error) {
	return datatypeOfType(reflect.TypeFor[T]())
}

func datatypeOfType(rt reflect.Type) (*Datatype, error) {
	if v, ok := goTypes.Load(rt); ok {
		return v.(*Datatype), nil
	}
	t, err := goLayout(rt)
	if err != nil {
		return nil, err
	}
	if k := t.Kind(); k != 0 {
		d := basicTypes[k] // a Go numeric type or bool: its predefined datatype
		goTypes.Store(rt, d)
		return d, nil
	}
	d := &Datatype{t: t}
	name := rt.String()
	d.name.Store(&name)
	d.committed.Store(true)
	v, _ := goTypes.LoadOrStore(rt, d)
	return v.(*Datatype), nil
}

// basicTypes is the predefined datatype of each basic kind.
var basicTypes = func() map[dtype.Kind]*Datatype {
	m := map[dtype.Kind]*Datatype{}
	for _, d := range []*Datatype{Byte, Bool, Int8, Int16, Int32, Int64, Uint8, Uint16, Uint32, Uint64,
		Float32, Float64, Complex64, Complex128} {
		m[d.t.Kind()] = d
	}
	return m
}()

// goKinds maps Go's numeric kinds and bool to basic kinds.
var goKinds = map[reflect.Kind]dtype.Kind{
	reflect.Bool: dtype.Bool, reflect.Int8: dtype.Int8, reflect.Int16: dtype.Int16, reflect.Int32: dtype.Int32,
	reflect.Int64: dtype.Int64, reflect.Int: dtype.Int64, reflect.Uint8: dtype.Uint8, reflect.Uint16: dtype.Uint16,
	reflect.Uint32: dtype.Uint32, reflect.Uint64: dtype.Uint64, reflect.Uint: dtype.Uint64, reflect.Uintptr: dtype.Uint64,
	reflect.Float32: dtype.Float32, reflect.Float64: dtype.Float64, reflect.Complex64: dtype.Complex64,
	reflect.Complex128: dtype.Complex128,
}

func goLayout(rt reflect.Type) (*dtype.Type, error) {
	if k, ok := goKinds[rt.Kind()]; ok {
		if dtype.Basic(k).Size() != int64(rt.Size()) {
			return nil, fmt.Errorf("%w: %v is %d bytes here", ErrType, rt, rt.Size())
		}
		return dtype.Basic(k), nil
	}
	switch rt.Kind() {
	case reflect.Array:
		e, err := goLayout(rt.Elem())
		if err != nil {
			return nil, err
		}
		return dtype.Contiguous(int64(rt.Len()), e)
	case reflect.Struct:
		var blens, displs []int64
		var ts []*dtype.Type
		for i := range rt.NumField() {
			f := rt.Field(i)
			if f.Type.Size() == 0 {
				continue
			}
			ft, err := goLayout(f.Type)
			if err != nil {
				return nil, fmt.Errorf("%w (field %s of %v)", err, f.Name, rt)
			}
			blens, displs, ts = append(blens, 1), append(displs, int64(f.Offset)), append(ts, ft)
		}
		if len(ts) == 0 {
			return nil, fmt.Errorf("%w: %v has no data", ErrType, rt)
		}
		s, err := dtype.Struct(blens, displs, ts)
		if err != nil {
			return nil, err
		}
		return dtype.Resized(s, 0, int64(rt.Size()))
	}
	return nil, fmt.Errorf("%w: %v is not a fixed-size value (pointers, strings, slices, maps, interfaces, channels and funcs cannot travel)", ErrType, rt)
}
