package mpiam

import (
	"errors"
	"fmt"
)

// Class is an MPI error class (MPI-4.1 §9.4, Table 9.1); the numbers are the
// values MPICH gives the MPI_ERR_* constants (the standard leaves them to
// the implementation; Open MPI's differ from MPI_ERR_REQUEST on), except
// ClassProcFail, Open MPI's value of ULFM's MPI_ERR_PROC_FAILED.
type Class int

// Error classes used by amgo.
const (
	ClassSuccess   Class = 0  // MPI_SUCCESS
	ClassBuffer    Class = 1  // MPI_ERR_BUFFER
	ClassCount     Class = 2  // MPI_ERR_COUNT
	ClassType      Class = 3  // MPI_ERR_TYPE
	ClassTag       Class = 4  // MPI_ERR_TAG
	ClassComm      Class = 5  // MPI_ERR_COMM
	ClassRank      Class = 6  // MPI_ERR_RANK
	ClassRequest   Class = 19 // MPI_ERR_REQUEST
	ClassRoot      Class = 7  // MPI_ERR_ROOT
	ClassGroup     Class = 8  // MPI_ERR_GROUP
	ClassOp        Class = 9  // MPI_ERR_OP
	ClassTopology  Class = 10 // MPI_ERR_TOPOLOGY
	ClassDims      Class = 11 // MPI_ERR_DIMS
	ClassArg       Class = 12 // MPI_ERR_ARG
	ClassUnknown   Class = 13 // MPI_ERR_UNKNOWN
	ClassTruncate  Class = 14 // MPI_ERR_TRUNCATE
	ClassOther     Class = 15 // MPI_ERR_OTHER
	ClassIntern    Class = 16 // MPI_ERR_INTERN
	ClassInStatus  Class = 17 // MPI_ERR_IN_STATUS
	ClassPending   Class = 18 // MPI_ERR_PENDING
	ClassProcFail  Class = 75 // MPI_ERR_PROC_FAILED (ULFM)
	ClassNoMem     Class = 34 // MPI_ERR_NO_MEM
	ClassNotSame   Class = 35 // MPI_ERR_NOT_SAME
	ClassUnsupport Class = 44 // MPI_ERR_UNSUPPORTED_OPERATION
	ClassWin       Class = 45 // MPI_ERR_WIN
	ClassLocktype  Class = 47 // MPI_ERR_LOCKTYPE
	ClassRMASync   Class = 50 // MPI_ERR_RMA_SYNC
	ClassSize      Class = 51 // MPI_ERR_SIZE
	ClassDisp      Class = 52 // MPI_ERR_DISP
	ClassAssert    Class = 53 // MPI_ERR_ASSERT
	ClassRMARange  Class = 55 // MPI_ERR_RMA_RANGE
	ClassRMAShared Class = 57 // MPI_ERR_RMA_SHARED
	ClassRMAAttach Class = 56 // MPI_ERR_RMA_ATTACH
	ClassRMAFlavor Class = 58 // MPI_ERR_RMA_FLAVOR
)

var classNames = map[Class]string{
	ClassSuccess: "MPI_SUCCESS", ClassBuffer: "MPI_ERR_BUFFER", ClassCount: "MPI_ERR_COUNT", ClassType: "MPI_ERR_TYPE",
	ClassTag: "MPI_ERR_TAG", ClassComm: "MPI_ERR_COMM", ClassRank: "MPI_ERR_RANK", ClassRequest: "MPI_ERR_REQUEST",
	ClassRoot: "MPI_ERR_ROOT", ClassGroup: "MPI_ERR_GROUP", ClassOp: "MPI_ERR_OP", ClassTopology: "MPI_ERR_TOPOLOGY",
	ClassDims: "MPI_ERR_DIMS", ClassArg: "MPI_ERR_ARG",
	ClassUnknown: "MPI_ERR_UNKNOWN", ClassTruncate: "MPI_ERR_TRUNCATE", ClassOther: "MPI_ERR_OTHER",
	ClassIntern: "MPI_ERR_INTERN", ClassInStatus: "MPI_ERR_IN_STATUS", ClassPending: "MPI_ERR_PENDING",
	ClassProcFail: "MPI_ERR_PROC_FAILED", ClassNoMem: "MPI_ERR_NO_MEM", ClassNotSame: "MPI_ERR_NOT_SAME",
	ClassUnsupport: "MPI_ERR_UNSUPPORTED_OPERATION", ClassWin: "MPI_ERR_WIN", ClassLocktype: "MPI_ERR_LOCKTYPE",
	ClassRMASync: "MPI_ERR_RMA_SYNC", ClassSize: "MPI_ERR_SIZE", ClassDisp: "MPI_ERR_DISP", ClassAssert: "MPI_ERR_ASSERT",
	ClassRMARange: "MPI_ERR_RMA_RANGE", ClassRMAShared: "MPI_ERR_RMA_SHARED",
	ClassRMAAttach: "MPI_ERR_RMA_ATTACH", ClassRMAFlavor: "MPI_ERR_RMA_FLAVOR",
}

// String gives the class's MPI name.
func (c Class) String() string {
	if s, ok := classNames[c]; ok {
		return s
	}
	return fmt.Sprintf("MPI error class %d", int(c))
}

// classError is a sentinel error of one class.
type classError struct {
	class Class
	msg   string
}

func (e *classError) Error() string { return "mpiam: " + e.msg }

// The sentinel errors, one per class amgo reports. Errors returned by mpiam wrap
// one of them with detail (the rank, tag, communicator involved), so test with
// errors.Is and get the class with ErrorClass.
var (
	ErrBuffer      error = &classError{ClassBuffer, "invalid or insufficient buffer"}
	ErrCount       error = &classError{ClassCount, "invalid count"}
	ErrType        error = &classError{ClassType, "invalid datatype"}
	ErrTag         error = &classError{ClassTag, "invalid tag"}
	ErrComm        error = &classError{ClassComm, "invalid communicator"}
	ErrRank        error = &classError{ClassRank, "invalid rank"}
	ErrRequest     error = &classError{ClassRequest, "invalid request"}
	ErrRoot        error = &classError{ClassRoot, "invalid root"}
	ErrGroup       error = &classError{ClassGroup, "invalid group"}
	ErrArg         error = &classError{ClassArg, "invalid argument"}
	ErrTopology    error = &classError{ClassTopology, "invalid topology"}
	ErrDims        error = &classError{ClassDims, "invalid dimension argument"}
	ErrTruncate    error = &classError{ClassTruncate, "message truncated: receive buffer too small"}
	ErrOther       error = &classError{ClassOther, "error"}
	ErrIntern      error = &classError{ClassIntern, "internal error"}
	ErrInStatus    error = &classError{ClassInStatus, "error in status"}
	ErrPending     error = &classError{ClassPending, "request pending"}
	ErrProcFailed  error = &classError{ClassProcFail, "process failed"}
	ErrUnsupported error = &classError{ClassUnsupport, "operation not supported"}
	ErrNotSame     error = &classError{ClassNotSame, "arguments differ across processes"}
	ErrOp          error = &classError{ClassOp, "invalid operation"}
	ErrWin         error = &classError{ClassWin, "invalid window"}
	ErrLocktype    error = &classError{ClassLocktype, "invalid lock type"}
	ErrRMASync     error = &classError{ClassRMASync, "one-sided operation or synchronization outside its epoch"}
	ErrSize        error = &classError{ClassSize, "invalid size"}
	ErrDisp        error = &classError{ClassDisp, "invalid displacement unit"}
	ErrAssert      error = &classError{ClassAssert, "invalid assertion"}
	ErrRMARange    error = &classError{ClassRMARange, "one-sided operation outside the target's window"}
	ErrRMAShared   error = &classError{ClassRMAShared, "memory cannot be shared by these processes"}
	ErrRMAAttach   error = &classError{ClassRMAAttach, "memory cannot be attached to the window"}
	ErrRMAFlavor   error = &classError{ClassRMAFlavor, "the call does not apply to this kind of window"}
	ErrNoMem       error = &classError{ClassNoMem, "out of memory"}

	// ErrReadyNotPosted reports an erroneous ready send (MPI-4.1 §3.4: "may be
	// started only if the matching receive is already posted"): the message was
	// delivered as a standard send would deliver it, and the receive that matched
	// it reports this error. Class MPI_ERR_OTHER.
	ErrReadyNotPosted error = &classError{ClassOther, "ready send arrived before its receive was posted (erroneous program, MPI-4.1 §3.4)"}
	// ErrCancelSend: send requests cannot be cancelled (deprecated in MPI-4.0;
	// Open MPI ob1 and MPICH ch4 do not either); the send completes normally.
	// Class MPI_ERR_UNSUPPORTED_OPERATION.
	ErrCancelSend error = &classError{ClassUnsupport, "send requests cannot be cancelled (deprecated since MPI-4.0); the send will complete normally"}
	// ErrFinalized: the call came after Finalize.
	ErrFinalized error = &classError{ClassOther, "MPI is finalized"}
	// ErrThreadLevel: two goroutines were inside the library at once on a
	// rank whose thread level promised one call at a time (ThreadSingle ..
	// ThreadSerialized); its state may be corrupt, and every later call
	// fails. Declare ThreadMultiple (the default) to call from several
	// goroutines at once.
	ErrThreadLevel error = &classError{ClassOther, "two goroutines called MPI at once at a single-threaded level"}
)

// ErrorClass returns the MPI error class of err: ClassSuccess for nil, the class
// of the mpiam sentinel it wraps, or ClassOther.
func ErrorClass(err error) Class {
	if err == nil {
		return ClassSuccess
	}
	var ce *classError
	if errors.As(err, &ce) {
		return ce.class
	}
	return ClassOther
}
