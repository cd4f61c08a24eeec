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
func BenchmarkIallreduce8B(b *testing.B) { benchIallreduce8B(b, false) }

// BenchmarkIallreduce8BArea is BenchmarkIallreduce8B through the
// communicator's shared area (coll_shm_nb.go), made by a Barrier first.
func BenchmarkIallreduce8BArea(b *testing.B) { benchIallreduce8B(b, true) }

func benchIallreduce8B(b *testing.B, area bool) {
	err := RunLocal(2, Config{}, func(w *Comm) error {
		s, r := []float64{1}, []float64{0}
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
			req, err := Iallreduce(w, s, r, Sum[float64]())
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

// BenchmarkIalltoall8BArea is an Ialltoall of 8 bytes per rank on 2 ranks
// through the communicator's shared area, started and waited for.
func BenchmarkIalltoall8BArea(b *testing.B) {
	err := RunLocal(2, Config{}, func(w *Comm) error {
		s, r := []float64{1, 2}, []float64{0, 0}
		if err := w.Barrier(); err != nil {
			return err
		}
		if w.Rank() == 0 {
			b.ReportAllocs()
			b.ResetTimer()
		}
		for i := 0; i < b.N; i++ {
			req, err := Ialltoall(w, s, r)
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
