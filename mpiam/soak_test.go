package mpiam

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// EnvSoak sets the number of messages of TestSoak (a count such as 1e6; `make
// soak` runs 10^6). Without it the test runs 10^4 messages, and none with
// -short.
const EnvSoak = "AMGO_SOAK"

// soakRanks, soakTags and soakBatch shape TestSoak: every rank sends
// soakBatch messages to every other rank per round, their tags cycling
// through soakTags values.
const soakRanks, soakTags, soakBatch = 3, 4, 32

// soakPerJob bounds the messages of one soak job: a longer soak runs several
// jobs at once, each with its own seed, since a job's pace is set by the
// reliability layer's retransmission timeouts rather than by the processor.
const soakPerJob = 25_000

// soakHeader is what each soak message starts with: source, destination
// and the message's number k on its (source, destination) stream.
const soakHeader = 16

// soakSize is the size of message k from src to dst: mostly eager, some
// exactly around the eager limit e, some rendezvous up to 64 KiB.
func soakSize(src, dst int, k uint64, e int) int {
	sizes := [...]int{soakHeader, 40, 200, 1000, soakHeader, max(e-1, soakHeader), max(e, soakHeader), e + 1,
		3 * e, 64<<10 + 7, 100, soakHeader, 5000, soakHeader, 300, 2*e + 13}
	h := (k*0x9e3779b97f4a7c15 ^ uint64(src)*0xbf58476d1ce4e5b9 ^ uint64(dst)*0x94d049bb133111eb) >> 33
	return sizes[h%uint64(len(sizes))]
}

func soakFill(b []byte, src, dst int, k uint64) {
	binary.LittleEndian.PutUint32(b[0:], uint32(src))
	binary.LittleEndian.PutUint32(b[4:], uint32(dst))
	binary.LittleEndian.PutUint64(b[8:], k)
	pattern(b[soakHeader:], int(k)*7919+src*31+dst)
}

// soakCount is the number of messages TestSoak sends in all.
func soakCount(t *testing.T) int {
	v := os.Getenv(EnvSoak)
	if v == "" {
		if testing.Short() {
			t.Skip("-short; " + EnvSoak + "=N runs N messages")
		}
		if raceEnabled {
			return 10_000 // the race detector's run repeats a reduced soak
		}
		return 100_000
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 1 || f > 1e9 {
		t.Fatalf("%s=%q: want a message count such as 1e6", EnvSoak, v)
	}
	return int(f)
}

// TestSoak sends many MPI messages among 3 ranks over the sim network with
// 10% loss, 30% reordering and 1% duplication (seed printed; AMGO_SIM_SEED
// replays it): mixed eager and rendezvous sizes, tags cycling through 4
// values, received by wildcard receives. Rounds rotate through four kinds of
// receive: AnySource with AnyTag, a given source with AnyTag, AnySource with a
// given tag, and both given. Every message is checked by content (its source,
// destination, number and a pattern derived from them, and its size), and its
// number must be the next one expected on its (source, tag) stream: so
// nothing is lost, duplicated, corrupted or out of order. A barrier ends each
// round. 10^5 messages by default (10^4 under the race detector); AMGO_SOAK=1e6
// (make soak) for the full run.
func TestSoak(t *testing.T) {
	total := soakCount(t)
	jobs := (total + soakPerJob - 1) / soakPerJob
	perPeer := max(1, total/(jobs*soakRanks*(soakRanks-1))) // messages per (src, dst) stream and job
	rounds := (perPeer + soakBatch - 1) / soakBatch
	perPeer = rounds * soakBatch
	msgs := jobs * perPeer * soakRanks * (soakRanks - 1)
	t.Logf("soak: %d messages: %d job(s) of %d ranks over sim, %d rounds each", msgs, jobs, soakRanks, rounds)
	old := jobTimeout
	jobTimeout = max(jobTimeout, time.Duration(perPeer)*40*time.Millisecond)
	start := time.Now()
	if jobs == 1 {
		soakJob(t, "sim", rounds)
	} else {
		t.Run("jobs", func(t *testing.T) {
			for j := range jobs {
				t.Run(fmt.Sprintf("job=%d", j), func(t *testing.T) {
					t.Parallel()
					soakJob(t, fmt.Sprintf("sim+%d", j), rounds)
				})
			}
		})
	}
	jobTimeout = old
	el := time.Since(start)
	t.Logf("soak: %d messages in %v (%.0f messages/s)", msgs, el.Round(time.Millisecond), float64(msgs)/el.Seconds())
}

// soakJob runs rounds of TestSoak on one job over network nw.
func soakJob(t *testing.T, nw string, rounds int) {
	runJob(t, nw, soakRanks, Config{}, func(r *rk, w *Comm) {
		me, n := w.Rank(), w.Size()
		e := r.eagerLimit(w)
		maxSize := 0
		for k := uint64(0); k < 64; k++ {
			maxSize = max(maxSize, soakSize(0, 1, k, e))
		}
		maxSize = max(maxSize, 64<<10+7, 3*e, 2*e+13)
		recvBufs := make([][]byte, soakBatch*(n-1))
		for i := range recvBufs {
			recvBufs[i] = make([]byte, maxSize)
		}
		sendBufs := make([][]byte, soakBatch*(n-1))
		for i := range sendBufs {
			sendBufs[i] = make([]byte, maxSize)
		}
		next := make([][soakTags]uint64, n) // next k expected per (source, tag)
		for s := range next {
			for tag := range soakTags {
				next[s][tag] = uint64(tag)
			}
		}
		reqs := make([]Request, 0, 2*soakBatch*(n-1))
		sts := make([]Status, 2*soakBatch*(n-1))
		received := 0
		for round := 0; round < rounds; round++ {
			reqs = reqs[:0]
			kind := round % 4
			// Receives: soakBatch from every other rank, by kind.
			i := 0
			for s := 0; s < n; s++ {
				if s == me {
					continue
				}
				for b := 0; b < soakBatch; b++ {
					src, tag := AnySource, AnyTag
					k := uint64(round*soakBatch + b) // the k this slot corresponds to for source s
					switch kind {
					case 1:
						src = s
					case 2:
						tag = int(k % soakTags)
					case 3:
						src, tag = s, int(k%soakTags)
					}
					q, err := Irecv(w, recvBufs[i], src, tag)
					r.NoError(err)
					reqs = append(reqs, q)
					i++
				}
			}
			nRecv := len(reqs)
			i = 0
			for d := 0; d < n; d++ {
				if d == me {
					continue
				}
				for b := 0; b < soakBatch; b++ {
					k := uint64(round*soakBatch + b)
					m := sendBufs[i][:soakSize(me, d, k, e)]
					soakFill(m, me, d, k)
					q, err := Isend(w, m, d, int(k%soakTags))
					r.NoError(err)
					reqs = append(reqs, q)
					i++
				}
			}
			r.NoError(Waitall(reqs, sts[:len(reqs)]), "round %d", round)
			// Completion order of a Waitall says nothing about matching order:
			// check each (source, tag) stream in the order its receives were
			// posted, which is the order they matched.
			for j := 0; j < nRecv; j++ {
				st := sts[j]
				r.NoError(st.Err)
				buf := recvBufs[j][:st.Bytes]
				r.GreaterOrEqual(st.Bytes, soakHeader, "round %d: message of %d bytes from %d", round, st.Bytes, st.Source)
				src := int(binary.LittleEndian.Uint32(buf[0:]))
				dst := int(binary.LittleEndian.Uint32(buf[4:]))
				k := binary.LittleEndian.Uint64(buf[8:])
				r.Equal(st.Source, src, "round %d: status source vs content", round)
				r.Equal(me, dst, "round %d: message for %d delivered to %d", round, dst, me)
				r.Equal(int(k%soakTags), st.Tag, "round %d: tag of message %d from %d", round, k, src)
				r.Equal(soakSize(src, me, k, e), st.Bytes, "round %d: size of message %d from %d", round, k, src)
				tag := st.Tag
				r.Equal(next[src][tag], k, "round %d: from %d tag %d: got message %d, want %d (lost, duplicated or out of order)",
					round, src, tag, k, next[src][tag])
				next[src][tag] += soakTags
				if err := checkPattern(buf[soakHeader:], int(k)*7919+src*31+me); err != nil {
					r.NoError(err, "round %d: message %d from %d corrupted", round, k, src)
				}
				received++
			}
			r.NoError(w.Barrier())
		}
		r.Equal(rounds*soakBatch*(n-1), received)
	})
}
