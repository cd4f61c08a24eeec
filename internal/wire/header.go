// Package wire holds amgo's packet format: a versioned, little-endian header
// that every packet on every transport starts with (a 24-byte core, then the
// extensions its kind and flags call for), followed by up to MaxArgs 64-bit
// handler arguments and then the payload. It is the only package that reads or
// writes packet bytes; docs/wire.md documents every field.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// Version is the header version this package writes and the only one it accepts.
const Version = 4

// HeaderLen is the size of the core header in bytes, the smallest header:
// the extensions (sequence, store, free, piggyback) and the arguments follow it.
const HeaderLen = 24

// Sizes of the header extensions, in bytes.
const (
	SeqExtLen       = 8  // seq, ack (FlagSeq)
	StoreExtLen     = 16 // addr, frag, total (request-store and store-done)
	FreeExtLen      = 8  // free off, free len (requests with FlagFree)
	PiggybackExtLen = 8  // piggyback (FlagPiggyback)
)

// SeqOffset and AckOffset are where the sequence extension puts Seq and Ack
// (when FlagSeq is set): the reliability layer writes them in place.
const (
	SeqOffset = HeaderLen
	AckOffset = HeaderLen + 4
)

// MaxArgs is the most 64-bit handler arguments a packet carries: 16, the GASNet-EX
// minimum for gex_AM_MaxArgs() on 64-bit platforms (GASNet-1 spec §AM "MaxArgs").
const MaxArgs = 16

// MaxHeaderLen is the largest encoded header, with every extension and
// MaxArgs arguments, in bytes (192).
const MaxHeaderLen = HeaderLen + SeqExtLen + StoreExtLen + FreeExtLen + PiggybackExtLen + 8*MaxArgs

// Kind says what a packet is.
type Kind uint8

// Packet kinds. Requests and replies run a handler; Ack only returns credit.
const (
	KindInvalid Kind = iota
	// KindRequestShort is a request with arguments and no payload.
	KindRequestShort
	// KindRequestMedium is a request whose payload the sender placed in its space
	// (Off, Reserve) of the receiver's per-peer buffer.
	KindRequestMedium
	// KindRequestStore is one fragment of a Store (am_store) sent through the
	// transport: the payload belongs at Addr+Frag in memory the receiver registered;
	// the handler runs with the last fragment (FlagLast), and Total gives the
	// store's whole length there.
	KindRequestStore
	// KindReplyShort is a reply with arguments and no payload.
	KindReplyShort
	// KindReplyMedium is a reply with arguments and a payload.
	KindReplyMedium
	// KindAck returns the credit of a request that was answered without a reply
	// (or whose payload the receiver retained and has now released).
	KindAck
	// KindStoreDone tells the receiver that a Store whose data was written with a
	// single-copy Put has landed; its handler runs on arrival.
	KindStoreDone
	// KindRequestImmediate is a request with arguments and a small payload
	// that reserves nothing in the receiver's per-peer buffer: its handler
	// may neither reply nor retain it, and the network's own queue bounds
	// what is in flight. Its header is the 4-byte immediate core
	// (ImmediateHeaderLen), not the 24-byte core: no source (the network
	// names it), no reservation, no extensions, no length (the network
	// delimits packets).
	KindRequestImmediate
	kindEnd
)

var kindNames = [...]string{"invalid", "request-short", "request-medium", "request-store",
	"reply-short", "reply-medium", "ack", "store-done", "request-immediate"}

// String names the kind as docs/wire.md does.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// IsRequest reports whether the kind runs a request handler and takes
// credit (an immediate request runs one but takes none: not included).
func (k Kind) IsRequest() bool {
	return k == KindRequestShort || k == KindRequestMedium || k == KindRequestStore || k == KindStoreDone
}

// IsReply reports whether the kind runs a reply handler.
func (k Kind) IsReply() bool { return k == KindReplyShort || k == KindReplyMedium }

// Flag bits of Header.Flags.
const (
	// FlagLast marks the last fragment of a Store.
	FlagLast uint16 = 1 << iota
	// FlagFree says that the packet returns credit: a range of the
	// destination's reservation in this packet's sender's per-peer buffer that
	// is now free. Replies and acks name it in Off and Reserve; requests, whose
	// Off and Reserve are their own reservation, in the free extension
	// (FreeOff, FreeLen).
	FlagFree
	// FlagPiggyback says that the piggyback extension carries a tool value
	// (docs/tools.md).
	FlagPiggyback
	// FlagSeq says that the sequence extension (Seq, Ack) follows the core:
	// set on every packet of a network under the reliability layer.
	FlagSeq
	flagAll = FlagLast | FlagFree | FlagPiggyback | FlagSeq
)

// Header is the decoded header. Field sizes and the extensions that carry
// Seq/Ack, Addr/Frag/Total, FreeOff/FreeLen and Piggyback are in docs/wire.md; fields whose
// extension a packet lacks decode as zero, and Encode leaves them out.
type Header struct {
	Kind    Kind   // packet kind
	Handler uint8  // handler index in the receiver's table
	NArgs   uint8  // number of 64-bit arguments after the header, 0..MaxArgs
	Flags   uint16 // Flag* bits
	Src     uint32 // sender's rank
	Len     uint32 // payload bytes after the arguments
	Seq     uint32 // per-peer sequence number (reliability layer, FlagSeq)
	Ack     uint32 // cumulative acknowledgement (reliability layer, FlagSeq)
	Off     uint32 // request: offset of the sender's reservation in the receiver's per-peer buffer; reply/ack with FlagFree: offset freed
	Reserve uint32 // request: bytes reserved at Off; reply/ack with FlagFree: bytes freed
	Addr    uint64 // store kinds: address of the destination region, inside memory the receiver registered
	Frag    uint32 // store: byte offset of this fragment within the region
	Total   uint32 // store: bytes of the whole region (the handler's payload)
	FreeOff uint32 // request with FlagFree: offset of the range freed
	FreeLen uint32 // request with FlagFree: bytes freed
	// Piggyback is a tool value carried on every message when FlagPiggyback is set.
	Piggyback uint64
}

// Errors returned by Decode. Every malformed input yields one of them, wrapped with detail.
var (
	ErrShort   = errors.New("wire: packet shorter than its header")
	ErrVersion = errors.New("wire: unsupported header version")
	ErrKind    = errors.New("wire: invalid packet kind")
	ErrArgs    = errors.New("wire: too many arguments")
	ErrFlags   = errors.New("wire: unknown flag bits or reserved bytes set")
	ErrLength  = errors.New("wire: payload length does not match packet")
)

// HasStoreExt reports whether packets of kind k carry the store extension
// (Addr, Frag, Total): request-store and store-done.
func (k Kind) HasStoreExt() bool { return k == KindRequestStore || k == KindStoreDone }

// extLen is the size of the extensions a header of kind k with flags carries.
func extLen(k Kind, flags uint16) int {
	n := 0
	if flags&FlagSeq != 0 {
		n += SeqExtLen
	}
	if k.HasStoreExt() {
		n += StoreExtLen
	}
	if flags&FlagFree != 0 && k.IsRequest() {
		n += FreeExtLen
	}
	if flags&FlagPiggyback != 0 {
		n += PiggybackExtLen
	}
	return n
}

// EncodedLen is the length of h encoded with its arguments, in bytes.
// An immediate request's header is the immediate core and the arguments.
func (h *Header) EncodedLen() int {
	if h.Kind == KindRequestImmediate {
		return ImmediateHeaderLen + 8*int(h.NArgs)
	}
	return HeaderLen + extLen(h.Kind, h.Flags) + 8*int(h.NArgs)
}

// Encode writes h and args (len(args) must equal h.NArgs) into b, which must hold
// EncodedLen bytes, and returns the number of bytes written: the core, the
// extensions h's kind and flags call for, the arguments (for an immediate
// request: EncodeImmediate of h's handler and arguments; its header has no
// length, so h.Len is not written). It does not allocate.
func Encode(b []byte, h *Header, args []uint64) int {
	if h.Kind == KindRequestImmediate {
		return EncodeImmediate(b, h.Handler, args[:h.NArgs])
	}
	_ = b[HeaderLen-1]
	// The core as three little-endian words: one store each rather than one
	// per field (every packet passes here).
	binary.LittleEndian.PutUint64(b, uint64(Version)|uint64(h.Kind)<<8|uint64(h.Handler)<<16|
		uint64(h.NArgs)<<24|uint64(h.Flags)<<32)
	binary.LittleEndian.PutUint64(b[8:], uint64(h.Src)|uint64(h.Len)<<32)
	binary.LittleEndian.PutUint64(b[16:], uint64(h.Off)|uint64(h.Reserve)<<32)
	n := HeaderLen
	if h.Flags&(FlagSeq|FlagFree|FlagPiggyback) != 0 || h.Kind.HasStoreExt() {
		n = encodeExt(b, h)
	}
	args = args[:h.NArgs]
	a := b[n : n+8*len(args)]
	for i, v := range args {
		binary.LittleEndian.PutUint64(a[8*i:], v)
	}
	return n + len(a)
}

// encodeExt writes the extensions h's kind and flags call for after the
// core and returns the offset after them.
func encodeExt(b []byte, h *Header) int {
	n := HeaderLen
	if h.Flags&FlagSeq != 0 {
		binary.LittleEndian.PutUint32(b[n:], h.Seq)
		binary.LittleEndian.PutUint32(b[n+4:], h.Ack)
		n += SeqExtLen
	}
	if h.Kind.HasStoreExt() {
		binary.LittleEndian.PutUint64(b[n:], h.Addr)
		binary.LittleEndian.PutUint32(b[n+8:], h.Frag)
		binary.LittleEndian.PutUint32(b[n+12:], h.Total)
		n += StoreExtLen
	}
	if h.Flags&FlagFree != 0 && h.Kind.IsRequest() {
		binary.LittleEndian.PutUint32(b[n:], h.FreeOff)
		binary.LittleEndian.PutUint32(b[n+4:], h.FreeLen)
		n += FreeExtLen
	}
	if h.Flags&FlagPiggyback != 0 {
		binary.LittleEndian.PutUint64(b[n:], h.Piggyback)
		n += PiggybackExtLen
	}
	return n
}

// noPayload has bit k set for the kinds that carry no payload.
const noPayload = 1<<KindRequestShort | 1<<KindReplyShort | 1<<KindAck | 1<<KindStoreDone

// Decode parses the header at the start of pkt into h and the arguments into
// args (which must have room for MaxArgs), and returns the payload that follows.
// pkt must be exactly header, arguments and payload; anything else is an error.
// Decode never panics and does not allocate on success.
func Decode(pkt []byte, h *Header, args *[MaxArgs]uint64) (payload []byte, err error) {
	if IsImmediate(pkt) {
		handler, a, payload, err := DecodeImmediate(pkt, args)
		if err != nil {
			return nil, err
		}
		if len(a) > 0 && &a[0] != &args[0] {
			copy(args[:], a) // Decode's arguments are always args'
		}
		*h = Header{Kind: KindRequestImmediate, Handler: handler, NArgs: uint8(len(a)), Len: uint32(len(payload))}
		return payload, nil
	}
	if len(pkt) < HeaderLen {
		return nil, fmt.Errorf("%w: %d bytes, need %d", ErrShort, len(pkt), HeaderLen)
	}
	w0 := binary.LittleEndian.Uint64(pkt)
	k, nargs, flags := Kind(w0>>8), uint8(w0>>24), uint16(w0>>32)
	if uint8(w0) != Version {
		return nil, fmt.Errorf("%w: %d (want %d)", ErrVersion, pkt[0], Version)
	}
	if k == KindInvalid || k >= kindEnd {
		return nil, fmt.Errorf("%w: %d", ErrKind, pkt[1])
	}
	if nargs > MaxArgs {
		return nil, fmt.Errorf("%w: %d (max %d)", ErrArgs, nargs, MaxArgs)
	}
	if flags&^flagAll != 0 {
		return nil, fmt.Errorf("%w: %#x", ErrFlags, flags)
	}
	if w0>>48 != 0 {
		return nil, fmt.Errorf("%w: reserved bytes 6-7 are %#x %#x, must be zero", ErrFlags, pkt[6], pkt[7])
	}
	at := HeaderLen
	if flags&(FlagSeq|FlagPiggyback|FlagFree) != 0 || k.HasStoreExt() {
		at += extLen(k, flags)
	}
	n := at + 8*int(nargs)
	if len(pkt) < n {
		return nil, fmt.Errorf("%w: %d bytes, a %s header with flags %#x and %d arguments needs %d", ErrShort, len(pkt), k, flags, nargs, n)
	}
	w1, w2 := binary.LittleEndian.Uint64(pkt[8:]), binary.LittleEndian.Uint64(pkt[16:])
	h.Kind, h.Handler, h.NArgs, h.Flags = k, uint8(w0>>16), nargs, flags
	h.Src, h.Len, h.Off, h.Reserve = uint32(w1), uint32(w1>>32), uint32(w2), uint32(w2>>32)
	if at != HeaderLen {
		decodeExt(pkt, h)
	} else {
		h.Seq, h.Ack, h.Addr, h.Frag, h.Total, h.FreeOff, h.FreeLen, h.Piggyback = 0, 0, 0, 0, 0, 0, 0, 0
	}
	a := pkt[at:n]
	for i := range args[:nargs] {
		args[i] = binary.LittleEndian.Uint64(a[8*i:])
	}
	if uint64(len(pkt)-n) != uint64(h.Len) {
		return nil, fmt.Errorf("%w: header says %d, packet holds %d", ErrLength, h.Len, len(pkt)-n)
	}
	if h.Len != 0 && noPayload>>k&1 != 0 {
		return nil, fmt.Errorf("%w: %s carries no payload, header says %d", ErrLength, k, h.Len)
	}
	return pkt[n:], nil
}

// decodeExt reads the extensions h's kind and flags call for, which pkt
// holds (Decode checked its length).
func decodeExt(pkt []byte, h *Header) {
	h.Seq, h.Ack, h.Addr, h.Frag, h.Total, h.FreeOff, h.FreeLen, h.Piggyback = 0, 0, 0, 0, 0, 0, 0, 0
	at := HeaderLen
	if h.Flags&FlagSeq != 0 {
		h.Seq = binary.LittleEndian.Uint32(pkt[at:])
		h.Ack = binary.LittleEndian.Uint32(pkt[at+4:])
		at += SeqExtLen
	}
	if h.Kind.HasStoreExt() {
		h.Addr = binary.LittleEndian.Uint64(pkt[at:])
		h.Frag = binary.LittleEndian.Uint32(pkt[at+8:])
		h.Total = binary.LittleEndian.Uint32(pkt[at+12:])
		at += StoreExtLen
	}
	if h.Flags&FlagFree != 0 && h.Kind.IsRequest() {
		h.FreeOff = binary.LittleEndian.Uint32(pkt[at:])
		h.FreeLen = binary.LittleEndian.Uint32(pkt[at+4:])
		at += FreeExtLen
	}
	if h.Flags&FlagPiggyback != 0 {
		h.Piggyback = binary.LittleEndian.Uint64(pkt[at:])
	}
}

// ImmediateHeaderLen is the size of an immediate request's header, in bytes:
// version, kind, handler and nargs bytes. The arguments and the payload
// follow; the payload is the rest of the packet, whose length the network
// gives. A header of 4 bytes puts the arguments 8-byte aligned where the
// packet starts 4 bytes past an 8-byte boundary, as a shared-memory ring
// places it (docs/wire.md, "Record").
const ImmediateHeaderLen = 4

// IsImmediate reports whether pkt is (or claims to be) an immediate request,
// which DecodeImmediate parses rather than Decode's general path.
func IsImmediate(pkt []byte) bool {
	return len(pkt) >= ImmediateHeaderLen && Kind(pkt[1]) == KindRequestImmediate
}

// unalignedWords: EncodeImmediate may store the arguments as native words at
// any alignment, which these architectures allow at full speed (the same
// set as internal/ring's wordHeaders, for the same reason); elsewhere (mips,
// riscv64, loong64, 32-bit arm) an unaligned word store traps or is
// emulated by the kernel, so the arguments go byte-wise.
const unalignedWords = runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64"

// EncodeImmediate writes the header of an immediate request to handler with
// args (at most MaxArgs) into b, which must hold ImmediateHeaderLen+8*len(args)
// bytes, and returns the bytes written; the payload follows in the same
// packet. It does not allocate.
func EncodeImmediate(b []byte, handler uint8, args []uint64) int {
	n := ImmediateHeaderLen + 8*len(args)
	a := b[ImmediateHeaderLen:n]
	binary.LittleEndian.PutUint32(b, uint32(immediateTag)|uint32(handler)<<16|uint32(len(args))<<24)
	if nativeLittleEndian && unalignedWords {
		// The words as they are in memory, stored one by one (a few
		// arguments cost less so than a call to copy), no per-word bounds
		// checks: a holds them all. a starts 4 bytes into b, so these
		// stores are unaligned when b is: only where that is allowed at
		// full speed (unalignedWords).
		d := unsafe.Pointer(unsafe.SliceData(a))
		for i, v := range args {
			*(*uint64)(unsafe.Add(d, 8*i)) = v
		}
		return n
	}
	for i, v := range args {
		binary.LittleEndian.PutUint64(a[8*i:], v)
	}
	return n
}

// DecodeImmediate parses an immediate request: its handler index, its
// arguments and its payload (the rest of pkt). On a little-endian machine,
// when the arguments sit 8-byte aligned in pkt (a shared-memory ring's
// records put them so), args aliases pkt and is valid as long as pkt is;
// otherwise the arguments are copied into scratch and args is a slice of
// it. Errors (wrapped with detail): ErrShort, ErrVersion, ErrKind (not an
// immediate request), ErrArgs. It never panics and does not allocate.
func DecodeImmediate(pkt []byte, scratch *[MaxArgs]uint64) (handler uint8, args []uint64, payload []byte, err error) {
	if len(pkt) >= ImmediateHeaderLen {
		// Every check at once on the common path; decodeImmediateErr says
		// which failed.
		w0 := binary.LittleEndian.Uint32(pkt)
		nargs := uint8(w0 >> 24)
		n := ImmediateHeaderLen + 8*int(nargs)
		if uint16(w0) == immediateTag && nargs <= MaxArgs && n <= len(pkt) {
			if nargs == 0 {
				return uint8(w0 >> 16), nil, pkt[n:], nil
			}
			if h, args, payload, ok := DecodeImmediateInPlace(pkt); ok {
				return h, args, payload, nil
			}
			a := pkt[ImmediateHeaderLen:n]
			for i := range scratch[:nargs] {
				scratch[i] = binary.LittleEndian.Uint64(a[8*i : 8*i+8])
			}
			return uint8(w0 >> 16), scratch[:nargs], pkt[n:], nil
		}
	}
	return 0, nil, nil, decodeImmediateErr(pkt)
}

// DecodeImmediateInPlace is DecodeImmediate's common case, small enough to
// inline into a packet loop: a well-formed immediate request with at least
// one argument, the arguments 8-byte aligned in pkt, on a little-endian
// machine; args aliases pkt. ok is false for everything else, which
// DecodeImmediate then decodes (or refuses, saying why).
func DecodeImmediateInPlace(pkt []byte) (handler uint8, args []uint64, payload []byte, ok bool) {
	p := unsafe.Pointer(unsafe.SliceData(pkt))
	if nativeLittleEndian && len(pkt) >= ImmediateHeaderLen+8 && uintptr(p)&7 == 8-ImmediateHeaderLen {
		w0 := *(*uint32)(p) // little-endian, as the wire; aligned
		nargs := uint8(w0 >> 24)
		// The arguments end at n, at most len(pkt): neither term wraps.
		n := ImmediateHeaderLen + 8*uint64(nargs)
		if uint16(w0) == immediateTag && nargs <= MaxArgs && n <= uint64(len(pkt)) {
			return uint8(w0 >> 16), unsafe.Slice((*uint64)(unsafe.Add(p, ImmediateHeaderLen)), nargs), pkt[n:], true
		}
	}
	return
}

// immediateTag is an immediate request header's first two bytes, read as a
// little-endian 16-bit word: the version and the kind.
const immediateTag = uint16(Version) | uint16(KindRequestImmediate)<<8

// decodeImmediateErr is the error DecodeImmediate returns for pkt, which
// failed one of its checks.
func decodeImmediateErr(pkt []byte) error {
	if len(pkt) < ImmediateHeaderLen {
		return fmt.Errorf("%w: %d bytes, need %d", ErrShort, len(pkt), ImmediateHeaderLen)
	}
	if pkt[0] != Version {
		return fmt.Errorf("%w: %d (want %d)", ErrVersion, pkt[0], Version)
	}
	if Kind(pkt[1]) != KindRequestImmediate {
		return fmt.Errorf("%w: %d, not an immediate request", ErrKind, pkt[1])
	}
	nargs := pkt[3]
	if nargs > MaxArgs {
		return fmt.Errorf("%w: %d (max %d)", ErrArgs, nargs, MaxArgs)
	}
	n := ImmediateHeaderLen + 8*int(nargs)
	return fmt.Errorf("%w: %d bytes, an immediate request with %d arguments needs %d", ErrShort, len(pkt), nargs, n)
}
