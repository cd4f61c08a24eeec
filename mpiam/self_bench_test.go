package mpiam

import (
	"fmt"
	"testing"
)

// BenchmarkSelfSendRecv measures the CPU cost of one eager message through the
// whole MPI path with no core crossing: a rank sends 8 bytes to itself and
// receives them (send, handler, matching, copy, completion).
func BenchmarkSelfSendRecv(b *testing.B) { byLevel(b, benchSelfSendRecv) }

func benchSelfSendRecv(b *testing.B, cfg Config) {
	err := RunLocal(1, cfg, func(w *Comm) error {
		buf := make([]byte, 8)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := Send(w, buf, 0, 1); err != nil {
				return err
			}
			if _, err := Recv(w, buf, 0, 1); err != nil {
				return err
			}
		}
		b.StopTimer()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSelfSendrecv measures the CPU cost of one Sendrecv of 8 bytes
// with no core crossing: a rank sends to itself and receives its own
// message in one call (a ring shift's step, the halo exchange's call).
func BenchmarkSelfSendrecv(b *testing.B) { byLevel(b, benchSelfSendrecv) }

func benchSelfSendrecv(b *testing.B, cfg Config) {
	out := make([]byte, 8)
	in := make([]byte, 8)
	selfLoop(b, cfg, func(w *Comm) error {
		_, err := Sendrecv(w, out, 0, 1, in, 0, 1)
		return err
	})
}

// selfLoop runs op b.N times, timed, on the one rank of an in-process job.
func selfLoop(b *testing.B, cfg Config, op func(w *Comm) error) {
	err := RunLocal(1, cfg, func(w *Comm) error {
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := op(w); err != nil {
				return err
			}
		}
		b.StopTimer()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSelfTest measures the CPU cost of one eager message whose
// receive is completed by Test rather than Wait, with no core crossing: a
// rank posts an Irecv from itself, sends 8 bytes to itself and tests the
// receive until it completes (MPI_Test, as a loop that overlaps work does).
func BenchmarkSelfTest(b *testing.B) { byLevel(b, benchSelfTest) }

func benchSelfTest(b *testing.B, cfg Config) {
	out := make([]byte, 8)
	in := make([]byte, 8)
	selfLoop(b, cfg, func(w *Comm) error {
		r, err := Irecv(w, in, 0, 1)
		if err != nil {
			return err
		}
		if err := Send(w, out, 0, 1); err != nil {
			return err
		}
		for {
			done, st, err := r.Test()
			if err != nil || done && st.Bytes != 8 {
				return fmt.Errorf("status %+v: %w", st, err)
			}
			if done {
				return nil
			}
		}
	})
}

// BenchmarkSelfWaitany measures the CPU cost of one eager message whose
// receive is completed by Waitany (a rank posts an Irecv from itself, sends
// 8 bytes to itself and waits for any of a list of one request), as a
// server loop that serves whichever request finishes first does.
func BenchmarkSelfWaitany(b *testing.B) { byLevel(b, benchSelfWaitany) }

func benchSelfWaitany(b *testing.B, cfg Config) {
	out := make([]byte, 8)
	in := make([]byte, 8)
	reqs := make([]Request, 1)
	selfLoop(b, cfg, func(w *Comm) error {
		var err error
		if reqs[0], err = Irecv(w, in, 0, 1); err != nil {
			return err
		}
		if err := Send(w, out, 0, 1); err != nil {
			return err
		}
		i, st, err := Waitany(reqs)
		if err != nil || i != 0 || st.Bytes != 8 {
			return fmt.Errorf("index %d, status %+v: %w", i, st, err)
		}
		return nil
	})
}

// BenchmarkSelfPosted measures the CPU cost of one eager message that finds its
// receive posted (a ping-pong's path) with no core crossing: a persistent
// receive is started, the rank sends 8 bytes to itself and waits.
func BenchmarkSelfPosted(b *testing.B) { byLevel(b, benchSelfPosted) }

func benchSelfPosted(b *testing.B, cfg Config) {
	err := RunLocal(1, cfg, func(w *Comm) error {
		buf := make([]byte, 8)
		rbuf := make([]byte, 8)
		r, err := RecvInit(w, rbuf, 0, 1)
		if err != nil {
			return err
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := r.Start(); err != nil {
				return err
			}
			if err := Send(w, buf, 0, 1); err != nil {
				return err
			}
			if _, err := r.Wait(); err != nil {
				return err
			}
		}
		b.StopTimer()
		return r.Free()
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSelfWindow measures the CPU cost per message of osu_bw's pattern
// with no core crossing: a rank posts a window of 64 receives from itself,
// starts 64 eager sends of 8 bytes to itself, and waits for all of them
// (Irecv, Isend, handler, matching, copy, Waitall). ns/op is per message.
func BenchmarkSelfWindow(b *testing.B) { byLevel(b, benchSelfWindow) }

func benchSelfWindow(b *testing.B, cfg Config) {
	const window = 64
	err := RunLocal(1, cfg, func(w *Comm) error {
		sbuf := make([]byte, 8)
		rbuf := make([]byte, 8*window)
		sreqs := make([]Request, window)
		rreqs := make([]Request, window)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i += window {
			for j := range rreqs {
				var err error
				if rreqs[j], err = Irecv(w, rbuf[8*j:8*j+8], 0, 1); err != nil {
					return err
				}
			}
			for j := range sreqs {
				var err error
				if sreqs[j], err = Isend(w, sbuf, 0, 1); err != nil {
					return err
				}
			}
			if err := Waitall(rreqs, nil); err != nil {
				return err
			}
			if err := Waitall(sreqs, nil); err != nil {
				return err
			}
		}
		b.StopTimer()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSelfUnexpected measures the CPU cost of one eager message that
// arrives before its receive is posted (a collective's root running ahead, a
// flood), with no core crossing: a rank sends 8 bytes to itself, polls it in
// (queued as unexpected), then receives it. tag=fixed reuses one tag;
// tag=fresh uses a new tag per message, as collective calls and programs
// that tag by iteration do.
func BenchmarkSelfUnexpected(b *testing.B) {
	for _, fresh := range []bool{false, true} {
		name := "tag=fixed"
		if fresh {
			name = "tag=fresh"
		}
		b.Run(name, func(b *testing.B) {
			err := RunLocal(1, Config{}, func(w *Comm) error {
				buf := make([]byte, 8)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					tag := 1
					if fresh {
						tag = i % TagUB
					}
					if err := Send(w, buf, 0, tag); err != nil {
						return err
					}
					if _, err := w.p.ep.Poll(); err != nil {
						return err
					}
					if _, err := Recv(w, buf, 0, tag); err != nil {
						return err
					}
				}
				b.StopTimer()
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// byLevel runs a benchmark at ThreadSingle (the lock-free path) and at
// ThreadMultiple (the default), as sub-benchmarks level=single and
// level=multiple.
func byLevel(b *testing.B, f func(*testing.B, Config)) {
	for _, l := range []ThreadLevel{ThreadSingle, ThreadMultiple} {
		b.Run("level="+l.String(), func(b *testing.B) { f(b, Config{Thread: l}) })
	}
}

// BenchmarkSelfPutFlush measures the CPU cost of one 8-byte Put and Flush
// into a window in the node mapping (osu put_latency's loop) with no core
// crossing: the rank puts into its own window.
func BenchmarkSelfPutFlush(b *testing.B) { benchSelfRMA(b, true) }

// BenchmarkSelfGetFlush is BenchmarkSelfPutFlush for Get.
func BenchmarkSelfGetFlush(b *testing.B) { benchSelfRMA(b, false) }

func benchSelfRMA(b *testing.B, put bool) {
	err := RunLocal(1, Config{}, func(c *Comm) error {
		w, _, err := WinAllocate[byte](c, 4096, 1)
		if err != nil {
			return err
		}
		if err := w.Lock(LockShared, 0, 0); err != nil {
			return err
		}
		buf := make([]byte, 8)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if put {
				err = Put(w, buf, 0, 0)
			} else {
				err = Get(w, buf, 0, 0)
			}
			if err == nil {
				err = w.Flush(0)
			}
			if err != nil {
				return err
			}
		}
		b.StopTimer()
		if err := w.Unlock(0); err != nil {
			return err
		}
		return w.Free()
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkIdlePoll measures one look of a blocked call at the network when
// nothing has arrived: what a waiting rank repeats until a message lands, so
// that its cost bounds how late an arrival is noticed. Rank 0 waits for a
// condition that holds after 32 looks (the hot polls of a wait), with an
// inbound ring from rank 1 attached; ns/op is per look.
func BenchmarkIdlePoll(b *testing.B) { byLevel(b, benchIdlePoll) }

func benchIdlePoll(b *testing.B, cfg Config) {
	err := RunLocal(2, cfg, func(w *Comm) error {
		buf := make([]byte, 1)
		if w.Rank() == 1 {
			if err := Send(w, buf, 0, 1); err != nil {
				return err
			}
			return w.Barrier()
		}
		if _, err := Recv(w, buf, 1, 1); err != nil {
			return err
		}
		b.ResetTimer()
		for i := 0; i < b.N; i += 32 {
			n := 0
			if err := w.p.waitFor(func() bool { n++; return n > 32 }); err != nil {
				return err
			}
		}
		b.StopTimer()
		return w.Barrier()
	})
	if err != nil {
		b.Fatal(err)
	}
}
