package mpiam

import (
	"github.com/amgo-hpc/amgo/mpiam/internal/sched"
)

// Persistent collectives beyond the common ones of coll_nb.go (MPI-4.1
// §6.13 and §8.8): the v and w variants, the prefix reductions and the
// neighborhood collectives. Each builds its schedule once, at the init
// call, which every rank of the communicator makes in the same order; Start
// and Startall run it again on the same buffers, Wait and Test complete it
// (docs/collectives.md, "Persistent collectives"). Arguments and errors are
// those of the nonblocking form, reported by the init call.

// GathervInit makes a persistent Gatherv request (MPI_Gatherv_init).
func GathervInit[T any](c *Comm, send, recv []T, counts, displs []int, root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallGathervInit, root, len(raw(send)), gatherSched(send, recv, counts, displs, root, true))
}

// ScattervInit makes a persistent Scatterv request (MPI_Scatterv_init).
func ScattervInit[T any](c *Comm, send []T, counts, displs []int, recv []T, root int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallScattervInit, root, len(raw(recv)), scatterSched(send, counts, displs, recv, root, true))
}

// AllgathervInit makes a persistent Allgatherv request (MPI_Allgatherv_init).
func AllgathervInit[T any](c *Comm, send, recv []T, counts, displs []int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallAllgathervInit, AnySource, len(raw(send)), allgatherSched(send, recv, counts, displs, true))
}

// AlltoallvInit makes a persistent Alltoallv request (MPI_Alltoallv_init).
func AlltoallvInit[T any](c *Comm, send []T, scounts, sdispls []int, recv []T, rcounts, rdispls []int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	if rcounts == nil {
		rcounts = []int{}
	}
	return c.initSched(CallAlltoallvInit, AnySource, len(raw(send)), alltoallSched(send, scounts, sdispls, recv, rcounts, rdispls))
}

// AlltoallwInit makes a persistent Alltoallw request (MPI_Alltoallw_init):
// each Start packs the send blocks anew and unpacks the received ones.
func AlltoallwInit[S, R any](c *Comm, send []S, scounts, sdispls []int, stypes []*Datatype, recv []R, rcounts, rdispls []int, rtypes []*Datatype) (Request, error) {
	if err := c.valid(); err != nil {
		return Request{}, err
	}
	s, r, err := alltoallwArgs(c.size, send, scounts, sdispls, stypes, recv, rcounts, rdispls, rtypes)
	if err != nil {
		return Request{}, err
	}
	return c.initSched(CallAlltoallwInit, AnySource, len(s.st), staged(s, r, alltoallSched(s.st, s.counts, s.displs, r.st, r.counts, r.displs)))
}

// ReduceScatterInit makes a persistent ReduceScatter request
// (MPI_Reduce_scatter_init).
func ReduceScatterInit[T any](c *Comm, send, recv []T, counts []int, op Op[T]) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	if counts == nil {
		counts = []int{}
	}
	return c.initSched(CallReduceScatterInit, AnySource, len(raw(send)), reduceScatterSched(send, recv, counts, op))
}

// ScanInit makes a persistent inclusive prefix reduction request
// (MPI_Scan_init).
func ScanInit[T any](c *Comm, send, recv []T, op Op[T]) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallScanInit, AnySource, len(raw(recv)), checkedSched[T](c, CallScanInit, len(recv), scanSched(send, recv, op, false)))
}

// ExscanInit makes a persistent exclusive prefix reduction request
// (MPI_Exscan_init).
func ExscanInit[T any](c *Comm, send, recv []T, op Op[T]) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initSched(CallExscanInit, AnySource, len(raw(recv)), checkedSched[T](c, CallExscanInit, len(recv), scanSched(send, recv, op, true)))
}

// initNeighbor is initSched for a neighborhood collective: a missing
// topology is reported at once.
func (c *Comm) initNeighbor(call Call, bytes int, build func(x coll, b *sched.Builder) error) (Request, error) {
	if _, _, err := c.neighbors(); err != nil {
		return Request{}, err
	}
	return c.initSched(call, AnySource, bytes, build)
}

// NeighborAllgatherInit makes a persistent NeighborAllgather request
// (MPI_Neighbor_allgather_init, MPI-4.1 §8.8).
func NeighborAllgatherInit[T any](c *Comm, send, recv []T) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initNeighbor(CallNeighborAllgatherInit, len(raw(send)), func(x coll, b *sched.Builder) error {
		return neighborAllgather(c, x, b, send, recv)
	})
}

// NeighborAllgathervInit makes a persistent NeighborAllgatherv request
// (MPI_Neighbor_allgatherv_init).
func NeighborAllgathervInit[T any](c *Comm, send, recv []T, counts, displs []int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initNeighbor(CallNeighborAllgathervInit, len(raw(send)), func(x coll, b *sched.Builder) error {
		return neighborAllgatherv(c, x, b, send, recv, counts, displs)
	})
}

// NeighborAlltoallInit makes a persistent NeighborAlltoall request
// (MPI_Neighbor_alltoall_init).
func NeighborAlltoallInit[T any](c *Comm, send, recv []T) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initNeighbor(CallNeighborAlltoallInit, len(raw(send)), func(x coll, b *sched.Builder) error {
		return neighborAlltoall(c, x, b, send, recv)
	})
}

// NeighborAlltoallvInit makes a persistent NeighborAlltoallv request
// (MPI_Neighbor_alltoallv_init).
func NeighborAlltoallvInit[T any](c *Comm, send []T, scounts, sdispls []int, recv []T, rcounts, rdispls []int) (Request, error) {
	if err := plain[T](); err != nil {
		return Request{}, err
	}
	return c.initNeighbor(CallNeighborAlltoallvInit, len(raw(send)), func(x coll, b *sched.Builder) error {
		return neighborAlltoallv(c, x, b, send, scounts, sdispls, recv, rcounts, rdispls)
	})
}

// NeighborAlltoallwInit makes a persistent NeighborAlltoallw request
// (MPI_Neighbor_alltoallw_init): a halo exchange set up once and started
// every iteration, each face packed into its message and unpacked from it.
func NeighborAlltoallwInit[S, R any](c *Comm, send []S, scounts, sdispls []int, stypes []*Datatype, recv []R, rcounts, rdispls []int, rtypes []*Datatype) (Request, error) {
	s := &nbScratch{}
	in, out, err := neighborWArgs(c, s, send, scounts, sdispls, stypes, recv, rcounts, rdispls, rtypes)
	if err != nil {
		return Request{}, err
	}
	return c.initNeighbor(CallNeighborAlltoallwInit, argsBytes(s.sblocks), func(x coll, b *sched.Builder) error {
		neighborSchedule(b, c, in, s.rblocks, out, s.sblocks)
		return nil
	})
}
