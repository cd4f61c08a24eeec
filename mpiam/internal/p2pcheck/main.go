// Command p2pcheck checks MPI point-to-point semantics between processes (and
// InitThread's answers, with one rank per process): the
// mpiam tests launch it with amrun over shared memory. Every rank runs the
// same checks; rank 0 prints "p2pcheck: OK" when all passed, and any failure
// exits non-zero with a message naming the rank.
package main

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"os"

	"github.com/amgo-hpc/amgo/mpiam"
)

func main() {
	w, provided, err := mpiam.InitThread(mpiam.Config{}, mpiam.ThreadFunneled)
	if err != nil {
		fmt.Fprintln(os.Stderr, "p2pcheck: init:", err)
		os.Exit(1)
	}
	if err := checkThread(w, provided); err != nil {
		fmt.Fprintf(os.Stderr, "p2pcheck: rank %d: %v\n", w.Rank(), err)
		os.Exit(1)
	}
	if err := checkShared(w); err != nil {
		fmt.Fprintf(os.Stderr, "p2pcheck: rank %d: %v\n", w.Rank(), err)
		os.Exit(1)
	}
	if err := run(w); err != nil {
		fmt.Fprintf(os.Stderr, "p2pcheck: rank %d: %v\n", w.Rank(), err)
		os.Exit(1)
	}
	if err := mpiam.Finalize(w); err != nil {
		fmt.Fprintf(os.Stderr, "p2pcheck: rank %d: finalize: %v\n", w.Rank(), err)
		os.Exit(1)
	}
	if w.Rank() == 0 {
		fmt.Printf("p2pcheck: %d ranks: OK\n", w.Size())
	}
}

// checkThread checks MPI_Init_thread's answers in a process-per-rank job:
// the level provided is the one required, QueryThread reports it, and only
// the goroutine that called InitThread is the main one.
func checkThread(w *mpiam.Comm, provided mpiam.ThreadLevel) error {
	q, err := w.QueryThread()
	if err != nil || provided != mpiam.ThreadFunneled || q != provided {
		return fmt.Errorf("thread level: provided %v, QueryThread %v, %v (want funneled)", provided, q, err)
	}
	main, err := w.IsThreadMain()
	if err != nil || !main {
		return fmt.Errorf("IsThreadMain on the goroutine that called InitThread: %v, %v", main, err)
	}
	other := make(chan bool)
	go func() { m, _ := w.IsThreadMain(); other <- m }()
	if <-other {
		return fmt.Errorf("IsThreadMain is true on another goroutine")
	}
	return nil
}

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed*13 + i>>8)
	}
	return b
}

// checkShared checks SplitType(CommTypeShared): its members are exactly the
// ranks with this rank's AMGO_NODE (a node emulated by name), or without it
// this rank's host name (the nodes of a cluster, emulated or not).
func checkShared(w *mpiam.Comm) error {
	node := os.Getenv("AMGO_NODE")
	if node == "" {
		node, _ = os.Hostname()
	}
	h := fnv.New64a()
	h.Write([]byte(node))
	mine := int64(h.Sum64() >> 1)
	all := make([]int64, w.Size())
	if err := mpiam.Allgather(w, []int64{mine}, all); err != nil {
		return err
	}
	var want []int64 // world ranks on this node
	for r, v := range all {
		if v == mine {
			want = append(want, int64(r))
		}
	}
	s, err := w.SplitType(mpiam.CommTypeShared, 0)
	if err != nil {
		return fmt.Errorf("SplitType: %w", err)
	}
	got := make([]int64, s.Size())
	if err := mpiam.Allgather(s, []int64{int64(w.Rank())}, got); err != nil {
		return err
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("SplitType(CommTypeShared) has world ranks %v, want %v (node %q)", got, want, node)
	}
	return s.Free()
}

func run(w *mpiam.Comm) error {
	me, n := w.Rank(), w.Size()
	next, prev := (me+1)%n, (me+n-1)%n
	// Ring shifts at eager, rendezvous-by-packets and single-copy sizes.
	for k, size := range []int{0, 8, 20_000, 4 << 20} {
		in := make([]byte, size)
		st, err := mpiam.Sendrecv(w, pattern(size, me+k), next, k, in, prev, k)
		if err != nil {
			return fmt.Errorf("sendrecv %d bytes: %w", size, err)
		}
		if st.Source != prev || st.Bytes != size || !bytes.Equal(in, pattern(size, prev+k)) {
			return fmt.Errorf("sendrecv %d bytes: status %+v or data wrong", size, st)
		}
	}
	// Strided ring shifts of 1.2 MB, three times: a column moves through
	// the receiver's shared stage, reused, packed straight into it by the
	// sender in another process.
	if err := stridedShift(w, next, prev); err != nil {
		return err
	}
	// Non-overtaking: every rank sends a numbered stream of mixed sizes to
	// rank 0, which receives with AnySource and checks each sender's order.
	const msgs = 40
	if me != 0 {
		var reqs []mpiam.Request
		for i := range msgs {
			size := []int{8, 40_000, 100, 0}[i%4]
			b := append([]byte{byte(i)}, pattern(size, i)...)
			req, err := mpiam.Isend(w, b, 0, 1)
			if err != nil {
				return err
			}
			reqs = append(reqs, req)
		}
		if err := mpiam.Waitall(reqs, nil); err != nil {
			return err
		}
	} else {
		next := make([]int, n)
		buf := make([]byte, 50_000)
		for range (n - 1) * msgs {
			st, err := mpiam.Recv(w, buf, mpiam.AnySource, 1)
			if err != nil {
				return err
			}
			i := next[st.Source]
			if int(buf[0]) != i {
				return fmt.Errorf("from rank %d: message %d arrived as number %d", st.Source, buf[0], i)
			}
			size := []int{8, 40_000, 100, 0}[i%4]
			if st.Bytes != size+1 || !bytes.Equal(buf[1:st.Bytes], pattern(size, i)) {
				return fmt.Errorf("from rank %d: message %d: %d bytes or data wrong", st.Source, i, st.Bytes)
			}
			next[st.Source]++
		}
	}
	// Synchronous send and probe across processes.
	if me == 0 {
		for src := 1; src < n; src++ {
			st, err := w.Probe(mpiam.AnySource, 2)
			if err != nil {
				return err
			}
			buf := make([]byte, st.Bytes)
			if _, err := mpiam.Recv(w, buf, st.Source, 2); err != nil {
				return err
			}
		}
	} else if err := mpiam.Ssend(w, pattern(300, me), 0, 2); err != nil {
		return err
	}
	return w.Barrier()
}

// stridedShift sends every other float64 of a buffer to next and receives
// into every other float64 of another from prev, three times, and checks
// what arrived (gaps untouched).
func stridedShift(w *mpiam.Comm, next, prev int) error {
	const n = 150_000
	col, err := mpiam.TypeVector(n, 1, 2, mpiam.Float64)
	if err != nil {
		return err
	}
	if err := col.Commit(); err != nil {
		return err
	}
	for it := range 3 {
		out, in := make([]float64, 2*n), make([]float64, 2*n)
		for i := range n {
			out[2*i] = float64(w.Rank()*1_000_000 + i + it)
		}
		rq, err := mpiam.IrecvTyped(w, in, 1, col, prev, 10+it)
		if err != nil {
			return err
		}
		if err := mpiam.SendTyped(w, out, 1, col, next, 10+it); err != nil {
			return err
		}
		if _, err := rq.Wait(); err != nil {
			return fmt.Errorf("strided shift %d: %w", it, err)
		}
		for i := range n {
			if in[2*i] != float64(prev*1_000_000+i+it) || in[2*i+1] != 0 {
				return fmt.Errorf("strided shift %d: element %d is %v (gap %v)", it, i, in[2*i], in[2*i+1])
			}
		}
	}
	return col.Free()
}
