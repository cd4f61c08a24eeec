package mpiam

import (
	"testing"
)

// BenchmarkAllreduce8B measures a 2-rank in-process Allreduce of one float64
// (recursive doubling: one exchange), per call.
func BenchmarkAllreduce8B(b *testing.B) {
	err := RunLocal(2, Config{}, func(w *Comm) error {
		s, r := []float64{1}, []float64{0}
		if w.Rank() == 0 {
			b.ReportAllocs()
			b.ResetTimer()
		}
		for i := 0; i < b.N; i++ {
			if err := Allreduce(w, s, r, Sum[float64]()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkIallreduce8B is BenchmarkAllreduce8B started and waited for
// (the schedule engine's cost per call).
func BenchmarkIallreduce8B(b *testing.B) { benchStartWait(b, false, iallreduce8B) }

// BenchmarkIallreduce8BArea is BenchmarkIallreduce8B through the
// communicator's shared area (coll_shm_nb.go), made by a Barrier first.
func BenchmarkIallreduce8BArea(b *testing.B) { benchStartWait(b, true, iallreduce8B) }

// iallreduce8B starts an Iallreduce of one float64 on buffers of its own.
func iallreduce8B() func(w *Comm) (Request, error) {
	s, r := []float64{1}, []float64{0}
	return func(w *Comm) (Request, error) { return Iallreduce(w, s, r, Sum[float64]()) }
}

// BenchmarkIalltoall8BArea is an Ialltoall of 8 bytes per rank through
// the shared area, started and waited for.
func BenchmarkIalltoall8BArea(b *testing.B) {
	benchStartWait(b, true, func() func(w *Comm) (Request, error) {
		s, r := []float64{1, 2}, []float64{0, 0}
		return func(w *Comm) (Request, error) { return Ialltoall(w, s, r) }
	})
}

// benchStartWait times a call followed by a Wait on 2 in-process ranks,
// after a Barrier that makes the shared area when area; mk gives each rank
// its call, with buffers of its own.
func benchStartWait(b *testing.B, area bool, mk func() func(w *Comm) (Request, error)) {
	err := RunLocal(2, Config{}, func(w *Comm) error {
		start := mk()
		if area {
			if err := w.Barrier(); err != nil {
				return err
			}
		}
		if w.Rank() == 0 {
			b.ReportAllocs()
			b.ResetTimer()
		}
		for i := 0; i < b.N; i++ {
			req, err := start(w)
			if err != nil {
				return err
			}
			if _, err := req.Wait(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAllreduceInit8B is BenchmarkIallreduce8B with a persistent
// request started again each time.
func BenchmarkAllreduceInit8B(b *testing.B) {
	err := RunLocal(2, Config{}, func(w *Comm) error {
		s, r := []float64{1}, []float64{0}
		req, err := AllreduceInit(w, s, r, Sum[float64]())
		if err != nil {
			return err
		}
		if w.Rank() == 0 {
			b.ReportAllocs()
			b.ResetTimer()
		}
		for i := 0; i < b.N; i++ {
			if err := req.Start(); err != nil {
				return err
			}
			if _, err := req.Wait(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
