package mpiam

import "time"

// wtimeOrigin is the moment Wtime counts from: when the package was loaded.
var wtimeOrigin = time.Now()

// Wtime returns the elapsed wall-clock time in seconds since an arbitrary
// moment in the past, fixed for the life of the process (MPI_Wtime, MPI-4.1
// §9.6.1): the difference of two calls is the time between them. It reads
// Go's monotonic clock, so it never jumps when the system clock is set.
// Clocks of different ranks are not synchronized (MPI_WTIME_IS_GLOBAL is
// false). It may be called before Init and after Finalize.
func Wtime() float64 { return time.Since(wtimeOrigin).Seconds() }

// Wtick returns the resolution of Wtime in seconds (MPI_Wtick, MPI-4.1
// §9.6.1): 1e-9, the unit of Go's monotonic clock (what a reading can
// resolve; a call costs tens of nanoseconds).
func Wtick() float64 { return 1e-9 }
