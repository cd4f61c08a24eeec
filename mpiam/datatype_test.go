package mpiam

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// A struct of mixed fields with padding (24 bytes, 18 of data).
type particle struct {
	X    float64
	ID   int32
	Tags [3]int16
}

// must commits what a constructor returned, failing t on its error.
func must(t testing.TB) func(*Datatype, error) *Datatype {
	return func(d *Datatype, err error) *Datatype {
		t.Helper()
		require.NoError(t, err)
		require.NoError(t, d.Commit())
		return d
	}
}

func TestDatatypeQueriesAndErrors(t *testing.T) {
	col, err := TypeVector(4, 1, 5, Float64) // a column of a 4 x 5 matrix
	require.NoError(t, err)
	require.Equal(t, 32, col.Size())
	lb, ext, err := col.Extent()
	require.NoError(t, err)
	require.Equal(t, [2]int{0, (3*5 + 1) * 8}, [2]int{lb, ext})

	m := make([]float64, 20)
	// Not committed yet.
	_, err = Pack(m, 1, col, make([]byte, 32), 0)
	require.ErrorIs(t, err, ErrType)
	require.Equal(t, ClassType, ErrorClass(err))
	require.NoError(t, col.Commit())

	// Data outside the buffer, a negative count, a buffer of pointers.
	_, err = Pack(m[:15], 1, col, make([]byte, 32), 0)
	require.ErrorIs(t, err, ErrBuffer)
	_, err = Pack(m, -1, col, make([]byte, 32), 0)
	require.ErrorIs(t, err, ErrCount)
	_, err = Pack([]*int{nil}, 1, Byte, make([]byte, 8), 0)
	require.ErrorIs(t, err, ErrBuffer)
	// Output too small: ErrTruncate, nothing written.
	out := make([]byte, 31)
	_, err = Pack(m, 1, col, out, 0)
	require.ErrorIs(t, err, ErrTruncate)

	// Bad constructor arguments.
	_, err = TypeContiguous(-1, Float64)
	require.ErrorIs(t, err, ErrArg)
	_, err = TypeIndexed([]int{1, 2}, []int{0}, Float64)
	require.ErrorIs(t, err, ErrArg)
	_, err = TypeCreateSubarray([]int{4, 4}, []int{5, 1}, []int{0, 0}, OrderC, Float64)
	require.ErrorIs(t, err, ErrArg)
	_, err = TypeContiguous(2, nil)
	require.ErrorIs(t, err, ErrType)

	// Free: once, never a predefined one, and the freed handle is unusable
	// while a type built from it lives on.
	row, err := TypeContiguous(2, col)
	require.NoError(t, err)
	require.NoError(t, col.Free())
	require.ErrorIs(t, col.Free(), ErrType)
	require.ErrorIs(t, Float64.Free(), ErrType)
	_, err = Pack(m, 1, col, make([]byte, 32), 0)
	require.ErrorIs(t, err, ErrType)
	require.NoError(t, row.Commit())
	require.Equal(t, 64, row.Size())

	// Names.
	require.Equal(t, "MPI_DOUBLE", Float64.Name())
	row.SetName("two columns")
	require.Equal(t, "two columns", row.Name())

	// Go types: structs with their padding, and refusals.
	pd, err := DatatypeOf[particle]()
	require.NoError(t, err)
	require.Equal(t, 18, pd.Size())
	_, ext, _ = pd.Extent()
	require.Equal(t, int(unsafe.Sizeof(particle{})), ext)
	again, _ := DatatypeOf[particle]()
	require.Same(t, pd, again)
	_, err = DatatypeOf[struct{ P *int }]()
	require.ErrorIs(t, err, ErrType)
	_, err = DatatypeOf[string]()
	require.ErrorIs(t, err, ErrType)
	f, err := DatatypeOf[float64]()
	require.NoError(t, err)
	require.Same(t, Float64, f)
	i, err := DatatypeOf[int]()
	require.NoError(t, err)
	require.Equal(t, 8, i.Size())

	// Get_count and Get_elements on a status.
	st := Status{Bytes: 18 + 8 + 4}
	require.Equal(t, Undefined, st.GetCount(pd))
	require.Equal(t, 7, st.GetElements(pd)) // X, ID, 3 Tags; then X and ID of the next
	st.Bytes = 18 + 9
	require.Equal(t, Undefined, st.GetElements(pd))
	st.Bytes = 36
	require.Equal(t, 2, st.GetCount(pd))
	require.Equal(t, 10, st.GetElements(pd))
}

func TestPackUnpackRoundTrip(t *testing.T) {
	// The interior 2 x 3 block of a 4 x 5 matrix, as a subarray.
	sub := must(t)(TypeCreateSubarray([]int{4, 5}, []int{2, 3}, []int{1, 1}, OrderC, Float64))
	m := make([]float64, 20)
	for i := range m {
		m[i] = float64(i)
	}
	n, err := PackSize(2, Float64)
	require.NoError(t, err)
	require.Equal(t, 16, n)
	buf := make([]byte, 8+48)
	pos, err := Pack([]float64{-1}, 1, Float64, buf, 0)
	require.NoError(t, err)
	pos, err = Pack(m, 1, sub, buf, pos)
	require.NoError(t, err)
	require.Equal(t, 56, pos)
	got := unsafe.Slice((*float64)(unsafe.Pointer(&buf[0])), 7)
	require.Equal(t, []float64{-1, 6, 7, 8, 11, 12, 13}, got)

	back := make([]float64, 20)
	var one [1]float64
	pos, err = Unpack(buf, 0, one[:], 1, Float64)
	require.NoError(t, err)
	_, err = Unpack(buf, pos, back, 1, sub)
	require.NoError(t, err)
	for i, v := range back {
		r, c := i/5, i%5
		if r >= 1 && r <= 2 && c >= 1 && c <= 3 {
			require.Equal(t, m[i], v)
		} else {
			require.Zero(t, v)
		}
	}
	_, err = Unpack(buf[:50], 8, back, 1, sub)
	require.ErrorIs(t, err, ErrTruncate)
}

// column is every other element of a buffer of 2n: n float64s, strided.
func column(t testing.TB, n int) (*Datatype, int, int) {
	return must(t)(TypeVector(n, 1, 2, Float64)), 1, 2 * n
}

// persistentColumn starts a persistent send of a strided column of n
// float64s (every other one of 2n) from rank 0 to rank 1 and its
// persistent receive rounds times, and checks each round's data at rank 1
// (a round's values, the gaps untouched).
func persistentColumn(r *rk, w *Comm, n, rounds, tag int) {
	col, _, _ := column(r.t, n)
	buf := make([]float64, 2*n)
	var req Request
	var err error
	if w.Rank() == 0 {
		req, err = SendInitTyped(w, buf, 1, col, 1, tag, Standard)
	} else {
		req, err = RecvInitTyped(w, buf, 1, col, 0, tag)
	}
	r.NoError(err)
	for round := range rounds {
		if w.Rank() == 0 {
			for i := range n {
				buf[2*i] = float64(round*1_000_000 + i)
			}
		}
		r.NoError(req.Start())
		_, err := req.Wait()
		r.NoError(err)
		if w.Rank() != 1 {
			continue
		}
		for i := range n {
			if buf[2*i] != float64(round*1_000_000+i) || buf[2*i+1] != 0 {
				r.Failf("wrong data", "round %d: element %d is %v (gap %v)", round, i, buf[2*i], buf[2*i+1])
			}
		}
	}
	r.NoError(req.Free())
}

// reversed is n float64s in reverse order (an indexed type).
func reversed(t testing.TB, n int) (*Datatype, int, int) {
	bl, dl := make([]int, n), make([]int, n)
	for i := range n {
		bl[i], dl[i] = 1, n-1-i
	}
	return must(t)(TypeIndexed(bl, dl, Float64)), 1, n
}

// plain is n contiguous float64s.
func plainF(t testing.TB, n int) (*Datatype, int, int) { return Float64, n, n }

// resizedPairs is n/2 pairs of float64s, each pair 3 float64s apart: a
// contiguous pair resized, count instances.
func resizedPairs(t testing.TB, n int) (*Datatype, int, int) {
	pair, err := TypeContiguous(2, Float64)
	require.NoError(t, err)
	return must(t)(TypeCreateResized(pair, 0, 24)), n / 2, 3 * (n / 2)
}

// The value a layout puts in packed position i, and where it lies.
func fillLayout(t testing.TB, d *Datatype, count, length int, seed float64) ([]float64, []float64) {
	buf := make([]float64, length)
	n := count * d.Size() / 8
	packed := make([]float64, n)
	for i := range packed {
		packed[i] = seed + float64(i)
	}
	_, err := Unpack(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(packed))), n*8), 0, buf, count, d)
	require.NoError(t, err)
	return buf, packed
}

func TestTypedSendRecv(t *testing.T) {
	layouts := []struct {
		name string
		f    func(testing.TB, int) (*Datatype, int, int)
	}{{"column", column}, {"reversed", reversed}, {"contiguous", plainF}, {"pairs", resizedPairs}}
	for _, nw := range append(networks, "loop+noget") {
		t.Run(nw, func(t *testing.T) {
			skipOn(t, nw)
			// Below the eager limit (an immediate request; a medium one
			// packed in the rank's buffer; one of 16 KB packed in place in
			// the ring over shm and loop, in a scratch buffer elsewhere), and
			// rendezvous of a few chunks, the last one partial; the simulated
			// networks, slow with their faults, move fewer.
			sizes, lays := []int{6, 500, 2000, 70001 &^ 1}, layouts
			if strings.Contains(nw, "sim") {
				sizes, lays = []int{6, 2000, 40000}, layouts[:3]
			}
			runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) {
				for _, n := range sizes {
					for _, sl := range lays {
						for _, rl := range lays {
							sd, scount, slen := sl.f(r.t, n)
							rd, rcount, rlen := rl.f(r.t, n)
							what := fmt.Sprintf("%d float64s, %s to %s", n, sl.name, rl.name)
							if w.Rank() == 0 {
								buf, _ := fillLayout(r.t, sd, scount, slen, float64(n))
								r.NoError(SendTyped(w, buf, scount, sd, 1, 3), what)
								// Synchronous and nonblocking forms too.
								r.NoError(SsendTyped(w, buf, scount, sd, 1, 4), what)
								req, err := IsendTyped(w, buf, scount, sd, 1, 5)
								r.NoError(err)
								_, err = req.Wait()
								r.NoError(err, what)
								continue
							}
							_, want := fillLayout(r.t, rd, rcount, rlen, float64(n))
							for tag := 3; tag <= 5; tag++ {
								buf := make([]float64, rlen)
								var st Status
								var err error
								if tag == 5 {
									req, err := IrecvTyped(w, buf, rcount, rd, 0, tag)
									r.NoError(err)
									st, err = req.Wait()
									r.NoError(err)
								} else {
									st, err = RecvTyped(w, buf, rcount, rd, 0, tag)
								}
								r.NoError(err, what)
								r.Equal(n*8, st.Bytes, what)
								r.Equal(rcount, st.GetCount(rd), what)
								got := make([]float64, n)
								_, err = Pack(buf, rcount, rd, unsafe.Slice((*byte)(unsafe.Pointer(&got[0])), n*8), 0)
								r.NoError(err)
								r.Equal(want, got, "%s, tag %d", what, tag)
							}
						}
					}
				}
			})
		})
	}
}

// A receive of fewer elements than sent takes what fits, reports
// ErrTruncate, and writes nothing outside its layout; persistent typed
// requests restart.
func TestTypedTruncateAndPersistent(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		for _, n := range []int{10, 50000} {
			col, _, _ := column(r.t, n)
			half, _, _ := column(r.t, n/2)
			if w.Rank() == 0 {
				buf, _ := fillLayout(r.t, col, 1, 2*n, 1)
				r.NoError(SendTyped(w, buf, 1, col, 1, 1))
				continue
			}
			buf := make([]float64, 2*n)
			for i := range buf {
				buf[i] = -1
			}
			st, err := RecvTyped(w, buf, 1, half, 0, 1)
			r.ErrorIs(err, ErrTruncate)
			r.Equal(n/2*8, st.Bytes)
			for i, v := range buf {
				switch {
				case i < n && i%2 == 0:
					r.Equal(float64(1+i/2), v, "element %d", i)
				default:
					r.Equal(-1.0, v, "element %d written", i)
				}
			}
		}

		// Persistent: the same requests started three times.
		persistentColumn(r, w, 3000, 3, 9)

		col, _, _ := column(r.t, 3000)
		buf := make([]float64, 6000)

		// Sendrecv: each rank sends its column and receives the other's
		// into a plain slice.
		for i := range buf {
			buf[i] = float64(w.Rank()*100000 + i)
		}
		got := make([]float64, 3000)
		st, err := SendrecvTyped(w, buf, 1, col, 1-w.Rank(), 2, got, 3000, Float64, 1-w.Rank(), 2)
		r.NoError(err)
		r.Equal(3000*8, st.Bytes)
		for i, v := range got {
			r.Equal(float64((1-w.Rank())*100000+2*i), v)
		}

		// Head to head by rendezvous, strided on both sides: each rank's
		// send waits for the other's receive, posted first.
		big, _, _ := column(r.t, 50_000)
		out := make([]float64, 100_000)
		for i := range out {
			out[i] = float64(w.Rank()*1_000_000 + i)
		}
		in := make([]float64, 100_000)
		st, err = SendrecvTyped(w, out, 1, big, 1-w.Rank(), 3, in, 1, big, 1-w.Rank(), 3)
		r.NoError(err)
		r.Equal(50_000*8, st.Bytes)
		want := make([]float64, len(in))
		for i := 0; i < len(want); i += 2 {
			want[i] = float64((1-w.Rank())*1_000_000 + i) // the gaps stay 0
		}
		r.Equal(want, in)
	})
}

// Structs go point to point through DatatypeOf, and a probed message is
// received with a datatype.
func TestTypedStructsAndMrecv(t *testing.T) {
	eachNetwork(t, 2, func(r *rk, w *Comm) {
		pd, err := DatatypeOf[particle]()
		r.NoError(err)
		ps := make([]particle, 1000)
		if w.Rank() == 0 {
			for i := range ps {
				ps[i] = particle{X: float64(i) / 2, ID: int32(i), Tags: [3]int16{int16(i), 1, 2}}
			}
			r.NoError(SendTyped(w, ps, len(ps), pd, 1, 0))
			r.NoError(SendTyped(w, ps[:3], 3, pd, 1, 1))
			return
		}
		st, err := RecvTyped(w, ps, len(ps), pd, 0, 0)
		r.NoError(err)
		r.Equal(1000, st.GetCount(pd))
		for i, p := range ps {
			r.Equal(particle{X: float64(i) / 2, ID: int32(i), Tags: [3]int16{int16(i), 1, 2}}, p)
		}
		m, st, err := w.Mprobe(0, 1)
		r.NoError(err)
		r.Equal(3, st.GetCount(pd))
		got := make([]particle, 3)
		_, err = MrecvTyped(m, got, 3, pd)
		r.NoError(err)
		r.Equal(ps[:3], got)
	})
}

// A strided message larger than the sender's staging (so the receiver asks
// for stores, two pieces in flight through the halves of its staging
// buffer) with a progress goroutine polling beside the waiting one: two
// goroutines may then run the receive's deferred work at once, and a
// clear-to-send into a half whose piece is still being unpacked must wait.
// Every element arrives, and the gaps of the layout stay untouched.
func TestTypedStagedReceiveWithProgress(t *testing.T) {
	t.Setenv("AMGO_PROGRESS", "20us")
	const n = 150000 // float64s: 1.2 MB packed, ten 128 KiB pieces
	err := RunLocal(2, Config{}, func(w *Comm) error {
		col, err := TypeVector(n, 1, 2, Float64)
		if err != nil {
			return err
		}
		if err := col.Commit(); err != nil {
			return err
		}
		for it := range 6 {
			buf := make([]float64, 2*n)
			if w.Rank() == 0 {
				for i := range n {
					buf[2*i] = float64(i + it)
				}
				if err := SendTyped(w, buf, 1, col, 1, it); err != nil {
					return err
				}
				continue
			}
			st, err := RecvTyped(w, buf, 1, col, 0, it)
			if err != nil {
				return err
			}
			if st.Bytes != 8*n {
				return fmt.Errorf("iteration %d: %d bytes, want %d", it, st.Bytes, 8*n)
			}
			for i := range n {
				if buf[2*i] != float64(i+it) || buf[2*i+1] != 0 {
					return fmt.Errorf("iteration %d: element %d is %v (gap %v), want %d", it, i, buf[2*i], buf[2*i+1], i+it)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
}
