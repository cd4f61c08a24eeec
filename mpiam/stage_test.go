package mpiam

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/amgo-hpc/amgo/mpiam/internal/proto"
)

// stageFiles lists the shared stages' files in dir.
func stageFiles(t testing.TB, dir string) []string {
	m, err := filepath.Glob(filepath.Join(dir, "amgo-stage-*"))
	require.NoError(t, err)
	return m
}

// exchangeColumns sends iters messages of a strided column of n float64s
// (1.2 MB packed for n = 150000, ten pieces) each way between ranks 0 and
// 1, then two at once from 0 to 1 (the second stages privately while the
// first holds the stage), checking every element; after the first message
// each rank has received, no stage file of dir is left.
func exchangeColumns(r *rk, w *Comm, dir string, n, iters int) {
	col, err := TypeVector(n, 1, 2, Float64)
	r.NoError(err)
	r.NoError(col.Commit())
	fill := func(buf []float64, k int) {
		for i := range n {
			buf[2*i] = float64(i + k)
		}
	}
	check := func(buf []float64, k int, what string) {
		for i := range n {
			if buf[2*i] != float64(i+k) || buf[2*i+1] != 0 {
				r.Failf("wrong data", "%s: element %d is %v (gap %v), want %d", what, i, buf[2*i], buf[2*i+1], i+k)
			}
		}
	}
	me, other := w.Rank(), 1-w.Rank()
	for it := range iters {
		for from := range 2 {
			buf := make([]float64, 2*n)
			k := 10*it + from
			if me == from {
				fill(buf, k)
				r.NoError(SendTyped(w, buf, 1, col, other, k))
				continue
			}
			st, err := RecvTyped(w, buf, 1, col, other, k)
			r.NoError(err)
			r.Equal(8*n, st.Bytes)
			check(buf, k, fmt.Sprintf("message %d", k))
			r.Empty(stageFiles(r.t, dir), "a stage's name outlives its first piece")
		}
	}
	bufs := [2][]float64{make([]float64, 2*n), make([]float64, 2*n)}
	var reqs [2]Request
	for j := range 2 {
		if me == 0 {
			fill(bufs[j], 100+j)
			reqs[j], err = IsendTyped(w, bufs[j], 1, col, 1, 100+j)
		} else {
			reqs[j], err = IrecvTyped(w, bufs[j], 1, col, 0, 100+j)
		}
		r.NoError(err)
	}
	r.NoError(Waitall(reqs[:], nil))
	if me == 1 {
		check(bufs[0], 100, "first of two at once")
		check(bufs[1], 101, "second of two at once")
	}
}

// A strided rendezvous between ranks that share memory packs straight into
// the receiver's shared stage, on every network that reaches a peer through
// shared memory; the stage is reused, its file unlinked once the sender has
// mapped it, and nothing is left after the job.
func TestTypedSharedStage(t *testing.T) {
	for _, nw := range []string{"loop", "shm"} {
		t.Run(nw, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("AMGO_JOB_DIR", dir)
			runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) {
				exchangeColumns(r, w, dir, 150000, 3)
				p := w.p
				r.Positive(p.stages.packed.Load(), "nothing packed into a shared stage")
				p.mu.Lock()
				st := p.stages.in[w.world(1-w.Rank())]
				p.mu.Unlock()
				r.NotNil(st)
				r.False(st.busy || st.dead || st.linked)
				r.NoError(w.Barrier()) // the peer's stage untouched from here
			})
			require.Empty(t, stageFiles(t, dir))
		})
	}
}

// A sender that cannot map the receiver's stage stores into it instead, and
// AMGO_TYPED_STAGE=0 stages privately: the data arrives the same either way.
func TestTypedSharedStageFallback(t *testing.T) {
	t.Run("unmappable", func(t *testing.T) {
		dir := t.TempDir()
		t.Setenv("AMGO_JOB_DIR", dir)
		open := stageOpen
		stageOpen = func(string, int) ([]byte, error) { return nil, errors.New("refused by the test") }
		t.Cleanup(func() { stageOpen = open })
		runJob(t, "shm", 2, Config{}, func(r *rk, w *Comm) {
			exchangeColumns(r, w, dir, 150000, 2)
			r.Zero(w.p.stages.packed.Load())
		})
		require.Empty(t, stageFiles(t, dir))
	})
	t.Run("off", func(t *testing.T) {
		dir := t.TempDir()
		t.Setenv("AMGO_JOB_DIR", dir)
		t.Setenv(EnvTypedStage, "0")
		runJob(t, "shm", 2, Config{}, func(r *rk, w *Comm) {
			exchangeColumns(r, w, dir, 150000, 2)
			r.Zero(w.p.stages.packed.Load())
			w.p.mu.Lock()
			defer w.p.mu.Unlock()
			r.Empty(w.p.stages.in)
		})
	})
	t.Run("bad setting", func(t *testing.T) {
		t.Setenv(EnvTypedStage, "yes")
		err := runJobErr(t, "loop", 2, Config{}, func(*rk, *Comm) {})
		require.ErrorIs(t, err, ErrArg)
	})
}

// A stage file of a process that died (same name: process ids are reused)
// is replaced.
func TestStageFileReplaced(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AMGO_JOB_DIR", dir)
	gen := stageGen.Load() + 1
	path := stagePath(uint32(os.Getpid()), gen)
	require.NoError(t, os.WriteFile(path, []byte("left by a dead rank"), 0o600))
	runJob(t, "loop", 2, Config{}, func(r *rk, w *Comm) {
		if w.Rank() != 0 {
			return
		}
		w.p.mu.Lock()
		st := w.p.makeStage()
		w.p.mu.Unlock()
		r.False(st.dead)
		r.Len(st.mem, stageBytes)
		w.p.mu.Lock()
		if w.p.stages.in == nil {
			w.p.stages.in = map[int]*stageIn{}
		}
		w.p.stages.in[-1] = st // closed at Finalize
		w.p.mu.Unlock()
	})
	require.Empty(t, stageFiles(t, dir))
}

// A persistent strided receive of many pieces, started again, asks for its
// pieces afresh each round (no piece state of the last round carries over),
// through a shared stage and through stores alike.
func TestTypedPersistentStaged(t *testing.T) {
	const n = 150000 // 1.2 MB packed: ten pieces
	for _, nw := range []string{"shm", "loop+noget"} {
		t.Run(nw, func(t *testing.T) {
			runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) { persistentColumn(r, w, n, 4, 7) })
		})
	}
}

// A stray piece notice (for no receive) is dropped and counted; strided
// traffic goes on.
func TestPieceNoticeMalformed(t *testing.T) {
	runJob(t, "loop", 2, Config{}, func(r *rk, w *Comm) {
		p := w.p
		peer := 1 - w.Rank()
		r.NoError(p.ep.RequestShort(peer, hDataPiece, 999999, 0))
		r.NoError(w.Barrier())
		r.NoError(p.waitFor(func() bool { return p.drops.Load() >= 1 }))
		exchangeColumns(r, w, t.TempDir(), 40000, 1)
		r.NoError(w.Barrier())
		r.EqualValues(1, p.drops.Load())
	})
}

// Goroutines of a ThreadMultiple rank exchange strided messages with the
// other rank at once, with a progress goroutine beside them: one receive at
// a time holds the shared stage, the others stage privately, clear-to-sends
// of one receive may be sent by two goroutines in either order, and every
// element arrives.
func TestTypedSharedStageConcurrent(t *testing.T) {
	t.Setenv("AMGO_PROGRESS", "20us")
	const n, goroutines, iters = 60000, 3, 4 // 480 KB packed: pieces of 128 KiB
	for _, nw := range []string{"shm", "loop", "loop+noget"} {
		t.Run(nw, func(t *testing.T) { stageConcurrent(t, nw, n, goroutines, iters) })
	}
}

// stageConcurrent is TestTypedSharedStageConcurrent on network nw.
func stageConcurrent(t *testing.T, nw string, n, goroutines, iters int) {
	runJob(t, nw, 2, Config{Thread: ThreadMultiple}, func(r *rk, w *Comm) {
		col, err := TypeVector(n, 1, 2, Float64)
		r.NoError(err)
		r.NoError(col.Commit())
		other := 1 - w.Rank()
		errs := make(chan error, goroutines)
		for g := range goroutines {
			go func() {
				errs <- func() error {
					for it := range iters {
						out, in := make([]float64, 2*n), make([]float64, 2*n)
						k := 100*g + it
						for i := range n {
							out[2*i] = float64(w.Rank()*1_000_000 + k*1000 + i)
						}
						rq, err := IrecvTyped(w, in, 1, col, other, k)
						if err != nil {
							return err
						}
						if err := SendTyped(w, out, 1, col, other, k); err != nil {
							return err
						}
						if _, err := rq.Wait(); err != nil {
							return err
						}
						for i := range n {
							if want := float64(other*1_000_000 + k*1000 + i); in[2*i] != want || in[2*i+1] != 0 {
								return fmt.Errorf("goroutine %d, message %d: element %d is %v, want %v", g, it, i, in[2*i], want)
							}
						}
					}
					return nil
				}()
			}()
		}
		for range goroutines {
			r.NoError(<-errs)
		}
	})
}

// A sender that dies in the middle of a strided rendezvous into a shared
// stage fails the receive with ErrProcFailed naming it, within the
// detection promise; strided traffic from another rank goes on.
func TestTypedSharedStageSenderDies(t *testing.T) {
	t.Setenv("AMGO_JOB_DIR", t.TempDir())
	const n = 150000 // 1.2 MB packed: ten pieces
	col := func(w *Comm) *Datatype {
		d, err := TypeVector(n, 1, 2, Float64)
		require.NoError(t, err)
		require.NoError(t, d.Commit())
		return d
	}
	runDeadJob(t, 3, 0, func(w *Comm) error {
		// The request-to-send goes; the rank dies before it sends the data.
		_, err := IsendTyped(w, make([]float64, 2*n), 1, col(w), 1, 5)
		return err
	}, func(w *Comm, died func() time.Time) error {
		d := col(w)
		buf := make([]float64, 2*n)
		switch w.Rank() {
		case 1:
			_, err := RecvTyped(w, buf, 1, d, 0, 5)
			requireProcFailed(t, err, 0)
			since(t, died, "strided receive from the dead rank")
			st, err := RecvTyped(w, buf, 1, d, 2, 6)
			require.NoError(t, err)
			require.Equal(t, 8*n, st.Bytes)
			for i := range n {
				if buf[2*i] != float64(i) {
					return fmt.Errorf("element %d is %v after the death", i, buf[2*i])
				}
			}
		case 2:
			for i := range n {
				buf[2*i] = float64(i)
			}
			return SendTyped(w, buf, 1, d, 1, 6)
		}
		return nil
	})
}

// A contiguous sender copies the pieces a strided receiver asks for into
// the receiver's shared stage (with non-temporal stores, fenced before the
// piece's notice): every element lands, odd sizes included.
func TestTypedSharedStageContiguousSender(t *testing.T) {
	for _, nw := range []string{"loop", "shm"} {
		t.Run(nw, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("AMGO_JOB_DIR", dir)
			runJob(t, nw, 2, Config{}, func(r *rk, w *Comm) {
				for k, n := range []int{150000, 70001} {
					col, err := TypeVector(n, 1, 2, Float64)
					r.NoError(err)
					r.NoError(col.Commit())
					if w.Rank() == 0 {
						src := make([]float64, n)
						for i := range src {
							src[i] = float64(i + k)
						}
						r.NoError(Send(w, src, 1, k))
						r.Positive(w.p.stages.packed.Load(), "nothing copied into a shared stage")
						continue
					}
					buf := make([]float64, 2*n)
					st, err := RecvTyped(w, buf, 1, col, 0, k)
					r.NoError(err)
					r.Equal(8*n, st.Bytes)
					for i := range n {
						if buf[2*i] != float64(i+k) || buf[2*i+1] != 0 {
							r.Failf("wrong data", "size %d: element %d is %v (gap %v)", n, i, buf[2*i], buf[2*i+1])
							break
						}
					}
				}
			})
			require.Empty(t, stageFiles(t, dir))
		})
	}
}

// A stage's pieces go through it in turn, each after the one before it
// (rounded up to the clear-to-send's offset unit), back at the start when
// one would pass the end.
func TestStagePlace(t *testing.T) {
	st := &stageIn{mem: make([]byte, stageBytes)}
	h := typedChunk / 2
	for i := range 2*stageBytes/h + 1 {
		off := st.place(h)
		require.Equal(t, i%(stageBytes/h)*h, off, "piece %d of %d bytes", i, h)
		st.take(off, h)
	}
	st.next = 0
	odd := 40000 // not a multiple of the unit: the next starts at 40960
	want := 0
	for i := range 60 {
		if want+odd > stageBytes {
			want = 0
		}
		off := st.place(odd)
		require.Equal(t, want, off, "piece %d of %d bytes", i, odd)
		st.take(off, odd)
		want += 40960
	}
}

// The stage writer takes ordinary stores until they take more than
// stageNTRatio times as long as non-temporal ones, and goes back when they
// no longer do; a new writer, which knows neither, takes ordinary ones.
func TestStageWriterChooses(t *testing.T) {
	var w stageWriter
	require.False(t, w.useNT(), "a new writer")
	w.record(false, 42)
	require.False(t, w.useNT(), "non-temporal stores not measured yet")
	w.record(true, 40)
	require.False(t, w.useNT(), "ordinary stores as fast")
	for range 3 {
		w.record(false, 340) // the cores share no cache now
	}
	require.True(t, w.useNT(), "ordinary stores at %d ns/KiB against %d", w.plain.Load(), w.nt.Load())
	var back int
	for back = 1; back < 20 && w.useNT(); back++ {
		w.record(false, 44) // explored: they share one again
	}
	require.False(t, w.useNT())
	require.LessOrEqual(t, back, 8, "pieces explored before going back")
}

// Every stageExplore-th piece (the first among them) writes its first
// stageProbe bytes the other way and the rest the chosen way; every byte of
// every piece is written once, in order; pieces too short to split go
// whole.
func TestStageWriterExplores(t *testing.T) {
	type part struct {
		at, n int
		nt    bool
	}
	var w stageWriter
	dst := make([]byte, typedChunk/2)
	for piece := 1; piece <= 2*stageExplore+1; piece++ {
		var parts []part
		chosen := w.useNT()
		w.write(dst, func(p []byte, at int, nt bool) { parts = append(parts, part{at, len(p), nt}) })
		if piece%stageExplore == 1 {
			require.Equal(t, []part{{0, stageProbe, !chosen}, {stageProbe, len(dst) - stageProbe, chosen}}, parts, "piece %d", piece)
		} else {
			require.Equal(t, []part{{0, len(dst), chosen}}, parts, "piece %d", piece)
		}
	}
	small := make([]byte, stageProbe)
	for range stageExplore {
		var parts []part
		w.write(small, func(p []byte, at int, nt bool) { parts = append(parts, part{at, len(p), nt}) })
		require.Len(t, parts, 1)
		require.Equal(t, len(small), parts[0].n)
	}
}

// withStagedRecv runs body on a one-rank job with p.mu held and the state
// of a staged receive of n packed bytes (through a shared stage of its own
// when stage is set, else a private staging buffer), filed under a new id;
// afterwards the state is unfiled and the work it queued dropped.
func withStagedRecv(t *testing.T, n int, stage bool, body func(rr *rk, p *proc, r *reqState)) {
	runJob(t, "loop", 1, Config{}, func(rr *rk, w *Comm) {
		p := w.p
		r := &reqState{}
		r.useCold()
		r.kind, r.lay, r.end, r.parts = kindRecv, &layout{n: n}, n, 1
		if stage {
			r.stage = &stageIn{mem: make([]byte, stageBytes)}
			r.bounce = r.stage.mem
		} else {
			r.bounce = make([]byte, typedChunk)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.nextID++
		r.id = p.nextID
		p.fileReqLocked(r)
		defer func() {
			p.unfileReqLocked(r.id)
			p.work, p.workHead = p.work[:0], 0
			p.hasWork.Store(false)
		}()
		body(rr, p, r)
	})
}

// A staged receive asks for its last piece as soon as the clear-to-send of
// every other piece has gone, not once they have landed: while one is only
// queued the last waits (it ends the sender's bookkeeping, so it must reach
// the sender after the others), and once that one is marked sent the last
// is queued at once, without the more flag.
func TestStagedLastPieceAskedOnceOthersSent(t *testing.T) {
	n := 128 << 10
	withStagedRecv(t, n, false, func(rr *rk, p *proc, r *reqState) {
		var first ctsArgs
		rr.True(p.askPieceLocked(r, &first))
		rr.Equal(uint64(0), first.Off)
		rr.Equal(uint64(n/2), first.N)
		rr.NotZero(first.Flags&ctsMore, "more pieces follow")
		rr.NotZero(first.Flags & proto.CTSPiece)

		var last ctsArgs
		rr.False(p.askPieceLocked(r, &last), "the last piece while the first's clear-to-send is only queued")

		queued := len(p.work)
		p.ctsSentLocked(r, 0, &first)
		rr.Len(p.work, queued+1, "the last piece asked for once the first's clear-to-send has gone")
		d := p.work[len(p.work)-1]
		rr.Equal(workCTS, d.kind)
		rr.Equal(uint64(n/2), d.cts.Off)
		rr.Equal(uint64(n/2), d.cts.N)
		rr.Zero(d.cts.Flags&ctsMore, "the last clear-to-send ends the sender's bookkeeping")
		rr.Equal([]uint8{slotSent, slotAsked}, r.hstate[:2], "a private buffer's two halves")
		rr.False(p.askPieceLocked(r, &last), "nothing left to ask for")
	})
}

// A piece is never placed over one still in flight in a shared stage: while
// one lags (its sender's goroutine slow, its unpacking not done), the other
// half's pieces go round the stage, and the one that would land on it is
// asked for only once it has been unpacked.
func TestStagedPieceNotPlacedOverOneInFlight(t *testing.T) {
	h := typedChunk / 2
	withStagedRecv(t, 2<<20, true, func(rr *rk, p *proc, r *reqState) {
		var a ctsArgs
		rr.True(p.askPieceLocked(r, &a))
		rr.Equal(0, r.pieceOff(0), "the first piece")
		rr.Equal(h, r.pieceAt(0))
		r.hstate[0] = slotSent // and it lags
		for i := 1; i < stageBytes/h; i++ {
			rr.True(p.askPieceLocked(r, &a), "piece %d", i)
			rr.Equal(i*h, r.pieceOff(1), "piece %d", i)
			r.hstate[1] = slotFree // landed and unpacked
		}
		rr.False(p.askPieceLocked(r, &a), "the next piece would land on the first, still in flight")
		r.hstate[0] = slotFree
		rr.True(p.askPieceLocked(r, &a), "once the first has been unpacked")
		rr.Equal(0, r.pieceOff(0))
		rr.Equal(uint64(stageBytes), a.Off, "the piece after the stage's worth")
	})
}

// A receive through a shared stage has up to stageSlots pieces in flight,
// a quarter of the message each: once the first clear-to-send has gone the
// two after it are asked for at once, and the last once a slot is free and
// the others' clear-to-sends have gone.
func TestStagedPiecesInFlight(t *testing.T) {
	n := 128 << 10
	withStagedRecv(t, n, true, func(rr *rk, p *proc, r *reqState) {

		var first ctsArgs
		rr.True(p.askPieceLocked(r, &first))
		rr.Equal(uint64(n/4), first.N, "a quarter of the message")
		queued := len(p.work)
		p.ctsSentLocked(r, 0, &first)
		rr.Len(p.work, queued+2, "the second and third pieces, not the last while they are only queued")
		for i, d := range p.work[queued:] {
			rr.Equal(uint64((i+1)*n/4), d.cts.Off)
			rr.NotZero(d.cts.Flags & ctsMore)
			rr.Equal(int(d.cts.Off), r.pfrom[i+1])
			rr.Equal(int(d.cts.Addr), r.pieceOff(i+1), "in turn through the stage")
			rr.Equal((i+1)*n/4, r.pieceOff(i+1))
		}
		p.ctsSentLocked(r, 0, &p.work[queued].cts)
		p.ctsSentLocked(r, 0, &p.work[queued+1].cts)
		rr.Len(p.work, queued+2, "no slot free for the last")
		rr.Equal([stageSlots]uint8{slotSent, slotSent, slotSent}, r.hstate)
		r.hstate[0] = slotFree // the first piece landed and was unpacked
		p.queueAsksLocked(r, 0)
		rr.Len(p.work, queued+3)
		last := p.work[queued+2].cts
		rr.Equal(uint64(3*n/4), last.Off)
		rr.Zero(last.Flags & ctsMore)
		rr.Equal(uint64(3*n/4), uint64(r.pieceOff(0)), "in turn, after the third")
	})
}
