package mpiam

import "testing"

// Every one-sided call on a nil window, and the typed ones with nil
// datatypes, return an error of MPI's class instead of panicking.
func TestRMANilArguments(t *testing.T) {
	var w *Win
	buf := []int64{1}
	var res int64
	checks := map[string]error{
		"Put":                Put(w, buf, 0, 0),
		"Get":                Get(w, buf, 0, 0),
		"Accumulate":         Accumulate(w, buf, 0, 0, Sum[int64]()),
		"GetAccumulate":      GetAccumulate(w, buf, buf, 0, 0, Sum[int64]()),
		"FetchAndOp":         FetchAndOp(w, 1, &res, 0, 0, Sum[int64]()),
		"CompareAndSwap":     CompareAndSwap(w, 1, 0, &res, 0, 0),
		"Fence":              w.Fence(0),
		"Lock":               w.Lock(LockShared, 0, 0),
		"Unlock":             w.Unlock(0),
		"LockAll":            w.LockAll(0),
		"UnlockAll":          w.UnlockAll(),
		"Flush":              w.Flush(0),
		"FlushAll":           w.FlushAll(),
		"Sync":               w.Sync(),
		"Free":               w.Free(),
		"Post":               w.Post(GroupEmpty, 0),
		"Start":              w.Start(GroupEmpty, 0),
		"Complete":           w.Complete(),
		"Wait":               w.Wait(),
		"PutTyped":           PutTyped(w, buf, 1, Int64, 0, 0, 1, Int64),
		"GetTyped":           GetTyped(w, buf, 1, Int64, 0, 0, 1, Int64),
		"AccumulateTyped":    AccumulateTyped(w, buf, 1, Int64, 0, 0, 1, Int64, Sum[int64]()),
		"WinDetach":          WinDetach(w, buf),
		"GetAccumulateTyped": GetAccumulateTyped(w, buf, 1, Int64, buf, 1, Int64, 0, 0, 1, Int64, Sum[int64]()),
	}
	_, err := w.Test()
	checks["Test"] = err
	_, err = w.Group()
	checks["Group"] = err
	_, err = WinAttach(w, buf)
	checks["WinAttach"] = err
	_, _, err = WinSharedQuery[int64](w, 0)
	checks["WinSharedQuery"] = err
	_, err = Rput(w, buf, 0, 0)
	checks["Rput"] = err
	_, err = Rget(w, buf, 0, 0)
	checks["Rget"] = err
	_, err = RputTyped(w, buf, 1, Int64, 0, 0, 1, Int64)
	checks["RputTyped"] = err
	_, err = RgetTyped(w, buf, 1, Int64, 0, 0, 1, Int64)
	checks["RgetTyped"] = err
	_, err = RaccumulateTyped(w, buf, 1, Int64, 0, 0, 1, Int64, Sum[int64]())
	checks["RaccumulateTyped"] = err
	_, err = RgetAccumulateTyped(w, buf, 1, Int64, buf, 1, Int64, 0, 0, 1, Int64, Sum[int64]())
	checks["RgetAccumulateTyped"] = err
	for name, err := range checks {
		if ErrorClass(err) != ClassWin {
			t.Errorf("%s on a nil window: %v (class %v), want ClassWin", name, err, ErrorClass(err))
		}
	}
	_, err = WinCreate[int64](nil, buf, 8)
	if ErrorClass(err) != ClassComm {
		t.Errorf("WinCreate on a nil communicator: %v", err)
	}
}

// Typed one-sided calls with nil or uncommitted datatypes are ErrType.
func TestRMATypedBadDatatypes(t *testing.T) {
	runJob(t, "loop", 1, Config{}, func(r *rk, c *Comm) {
		w, _, err := WinAllocate[int64](c, 4, 8)
		r.NoError(err)
		r.NoError(w.Fence(0))
		buf := []int64{1, 2}
		raw, err := TypeContiguous(2, Int64) // not committed
		r.NoError(err)
		r.ErrorIs(PutTyped(w, buf, 1, nil, 0, 0, 1, Int64), ErrType)
		r.ErrorIs(PutTyped(w, buf, 2, Int64, 0, 0, 1, nil), ErrType)
		r.ErrorIs(GetTyped(w, buf, 1, raw, 0, 0, 2, Int64), ErrType)
		r.ErrorIs(AccumulateTyped(w, buf, 2, Int64, 0, 0, 1, raw, Sum[int64]()), ErrType)
		r.ErrorIs(PutTyped(w, buf, -1, Int64, 0, 0, 1, Int64), ErrCount)
		r.ErrorIs(GetAccumulateTyped(w, buf, 2, Int64, buf, 2, raw, 0, 0, 2, Int64, Sum[int64]()), ErrType)
		r.ErrorIs(GetAccumulateTyped(w, buf, 2, Int64, buf, 2, Int64, 0, 0, 2, nil, Sum[int64]()), ErrType)
		r.ErrorIs(GetAccumulateTyped(w, buf, 2, Int64, buf, 1, Float64, 0, 0, 2, Int64, Sum[int64]()), ErrType, "kinds differ")
		_, err = RgetTyped(w, buf, 2, Int64, 0, 0, 2, Int64)
		r.ErrorIs(err, ErrRMASync, "request forms need a passive-target epoch")
		r.NoError(w.Fence(ModeNosucceed))
		r.NoError(w.Free())
	})
}
