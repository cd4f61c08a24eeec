package ring

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func newRing(t testing.TB, capacity int) (*Producer, *Consumer, []byte) {
	mem, err := Alloc(capacity)
	require.NoError(t, err)
	p, err := NewProducer(mem)
	require.NoError(t, err)
	c, err := NewConsumer(mem)
	require.NoError(t, err)
	return p, c, mem
}

func TestInitAndAttach(t *testing.T) {
	mem := make([]byte, RegionSize(1000)) // data area rounds down to 512
	require.NoError(t, Init(mem))
	c, err := Capacity(mem)
	require.NoError(t, err)
	require.Equal(t, 512, c)
	require.Equal(t, MaxRecord(512), 208)

	_, err = NewConsumer(make([]byte, 1024))
	require.ErrorIs(t, err, ErrRegion, "uninitialized region")
	require.ErrorIs(t, Init(make([]byte, ControlLen+8)), ErrRegion, "too small")
	require.ErrorIs(t, Init(nil), ErrRegion)
	require.ErrorIs(t, Init(mem[1:]), ErrRegion, "misaligned")

	mem2, err := Alloc(100)
	require.NoError(t, err)
	require.Len(t, mem2, RegionSize(MinCapacity))
	_, err = Alloc(MaxCapacity + 1)
	require.ErrorIs(t, err, ErrRegion)
}

// InitZeroed formats a zeroed region as Init does, writing only the
// control block: a ring formatted either way carries the same records.
func TestInitZeroed(t *testing.T) {
	require.Equal(t, 512, FitCapacity(RegionSize(1000)))
	require.Equal(t, 0, FitCapacity(ControlLen+MinCapacity-1))
	require.Equal(t, MinCapacity, FitCapacity(ControlLen+MinCapacity))
	mem := make([]byte, RegionSize(4096)+100)
	require.NoError(t, InitZeroed(mem))
	for i := ControlLen; i < len(mem); i++ {
		require.Zero(t, mem[i], "InitZeroed wrote byte %d of the data area", i)
	}
	c, err := Capacity(mem)
	require.NoError(t, err)
	require.Equal(t, 4096, c)
	p, err := NewProducer(mem)
	require.NoError(t, err)
	q, err := NewConsumer(mem)
	require.NoError(t, err)
	for i := range 200 { // wraps several times
		require.True(t, p.Push([]byte{byte(i)}, make([]byte, 100)))
		rec, ok := q.Peek()
		require.True(t, ok)
		require.Equal(t, byte(i), rec[0])
		q.Advance()
	}
	require.ErrorIs(t, InitZeroed(make([]byte, ControlLen+8)), ErrRegion)
	require.ErrorIs(t, InitZeroed(mem[1:]), ErrRegion)
}

func TestSingleGoroutine(t *testing.T) {
	p, c, _ := newRing(t, 1024)
	_, ok := c.Peek()
	require.False(t, ok)
	require.NoError(t, c.Err())
	c.Advance() // nothing peeked: no effect

	require.True(t, p.Push([]byte("hello "), []byte("world")))
	require.True(t, p.Push(nil, nil)) // empty record
	require.True(t, p.Push([]byte{1, 2, 3}, nil))

	rec, ok := c.Peek()
	require.True(t, ok)
	require.Equal(t, "hello world", string(rec))
	rec2, ok := c.Peek() // Peek is idempotent until Advance
	require.True(t, ok)
	require.Equal(t, rec, rec2)
	c.Advance()
	rec, ok = c.Peek()
	require.True(t, ok)
	require.Len(t, rec, 0)
	c.Advance()
	rec, ok = c.Peek()
	require.True(t, ok)
	require.Equal(t, []byte{1, 2, 3}, rec)
	c.Advance()
	_, ok = c.Peek()
	require.False(t, ok)
}

func TestTooLarge(t *testing.T) {
	p, c, _ := newRing(t, 1024)
	max := p.MaxRecord()
	require.Equal(t, max, c.MaxRecord())
	require.False(t, p.Push(make([]byte, max+1), nil))
	require.False(t, p.Push(make([]byte, max), []byte{1}))
	require.NoError(t, p.Err())
	require.True(t, p.Push(make([]byte, max/2), make([]byte, max-max/2)))
}

// A record of MaxRecord bytes always fits in a drained ring, whatever the
// position of the wrap.
func TestMaxRecordAtEveryOffset(t *testing.T) {
	p, c, _ := newRing(t, 256)
	max := make([]byte, p.MaxRecord())
	for shift := 0; shift < 64; shift++ {
		require.True(t, p.Push(make([]byte, shift%8), nil)) // move the position by a slot
		rec, ok := c.Peek()
		require.True(t, ok)
		require.Len(t, rec, shift%8)
		c.Advance()
		max[0] = byte(shift)
		require.True(t, p.Push(max, nil), "shift %d", shift)
		rec, ok = c.Peek()
		require.True(t, ok)
		require.Equal(t, max, rec)
		c.Advance()
	}
}

func TestFullRing(t *testing.T) {
	for _, c := range []struct {
		n, want int
		what    string
	}{
		{24, 7, "7 records of a slot each"}, // 8-byte header and 24 bytes: 32
		{56, 3, "3 records of a line each"}, // 8-byte header and 56 bytes: 64
	} {
		p, q, _ := newRing(t, 256)
		rec := make([]byte, c.n)
		pushed := 0
		for p.Push(rec, nil) {
			pushed++
			require.Less(t, pushed, 100)
		}
		require.NoError(t, p.Err())
		require.Equal(t, c.want, pushed, "256 bytes hold %s plus the slack for the next header", c.what)
		_, ok := q.Peek()
		require.True(t, ok)
		q.Advance()
		require.True(t, p.Push(rec, nil), "room after one Advance")
		require.False(t, p.Push(rec, nil))
		for i := 0; i < c.want; i++ {
			_, ok := q.Peek()
			require.True(t, ok)
			q.Advance()
		}
		_, ok = q.Peek()
		require.False(t, ok)
	}
}

// Where records go: a header part of 4 mod 8 bytes starts the data 4 bytes
// into the record, any other 8 bytes in, so the payload after it is 8-byte
// aligned either way; a record of one slot (32 bytes) shares a line with
// the next, and one of an even number of slots starts a line, behind a slot
// of pad when the position is mid-line, where one of an odd number does
// not need to. The layout is docs/wire.md's ("Record").
func TestRecordPlacement(t *testing.T) {
	p, c, mem := newRing(t, 1024)
	data := mem[ControlLen:]
	hdr32 := func(off int) uint32 { return binary.LittleEndian.Uint32(data[off:]) }
	imm := make([]byte, 4+16) // an immediate request's header and two arguments
	imm[0] = 0xa1
	require.True(t, p.Push(imm, []byte("8 bytes!"))) // 28 bytes: one slot at 0
	require.True(t, p.Push(imm, []byte("8 bytes!"))) // the second slot of line 0, at 32
	require.Equal(t, uint32(validBit|28), hdr32(0))
	require.Equal(t, uint32(validBit|28), hdr32(32))
	require.Equal(t, byte(0xa1), data[4], "data 4 bytes in")
	require.Equal(t, "8 bytes!", string(data[24:32]), "payload 8-byte aligned")

	core := make([]byte, 24)                     // a 24-byte core: data 8 bytes in
	require.True(t, p.Push(core, []byte("abc"))) // 8+27 = 35: two slots, at line 1
	require.Equal(t, uint32(validBit|wideBit|27), hdr32(64))
	require.Zero(t, hdr32(68), "the 4 bytes after a wide header stay zero")
	require.Equal(t, "abc", string(data[64+8+24:64+8+27]))
	require.True(t, p.Push(imm, nil))               // one slot at 128
	require.True(t, p.Push(core, make([]byte, 20))) // 52: a slot of pad at 160, the record at line 3
	require.Equal(t, uint32(validBit|padBit|slotLen), hdr32(160))
	require.Equal(t, uint32(validBit|wideBit|44), hdr32(192))
	require.True(t, p.Push(nil, nil)) // an empty record: one slot at 256
	require.Equal(t, uint32(validBit|wideBit), hdr32(256))
	require.True(t, p.Push(core, make([]byte, 60))) // 8+84 = 92: three slots, mid-line at 288 without a pad
	require.Equal(t, uint32(validBit|wideBit|84), hdr32(288))

	for i, want := range []int{28, 28, 27, 20, 44, 0, 84} {
		rec, ok := c.Peek()
		require.True(t, ok, "record %d", i)
		require.Len(t, rec, want, "record %d", i)
		c.Advance()
	}
	_, ok := c.Peek()
	require.False(t, ok)
	require.NoError(t, c.Err())
}

func TestWrapAround(t *testing.T) {
	p, c, _ := newRing(t, 256) // max record 80
	var seq uint32
	var want uint32
	buf := make([]byte, 48)
	for round := 0; round < 2000; round++ {
		// push a few records of sizes that do not divide the capacity
		for k := 0; k < 1+round%3; k++ {
			n := 4 + int(seq*7)%45
			binary.LittleEndian.PutUint32(buf, seq)
			if !p.Push(buf[:4], buf[4:n]) {
				break
			}
			seq++
		}
		for {
			rec, ok := c.Peek()
			if !ok {
				break
			}
			require.Equal(t, want, binary.LittleEndian.Uint32(rec))
			require.Equal(t, 4+int(want*7)%45, len(rec))
			want++
			c.Advance()
		}
	}
	require.NoError(t, c.Err())
	require.Equal(t, seq, want)
	require.Greater(t, seq, uint32(2000))
}

func TestCorruptHeader(t *testing.T) {
	p, c, mem := newRing(t, 256)
	require.True(t, p.Push([]byte("abc"), nil))
	word(mem, ControlLen).Store(validBit | 10000) // longer than the ring
	_, ok := c.Peek()
	require.False(t, ok)
	require.ErrorIs(t, c.Err(), ErrCorrupt)
	_, ok = c.Peek()
	require.False(t, ok, "stays corrupt")
	word(mem, ControlLen).Store(validBit | 3) // a well-formed header again
	_, ok = c.Peek()
	require.False(t, ok, "stays corrupt, whatever the head now holds")
	streak := true
	require.Zero(t, Take(c, nopReceiver{}, 0, &streak, 8), "Take hands over nothing from a corrupt ring")

	for _, w := range []uint64{
		wideBit | 3,                      // no valid bit
		validBit | wideBit | 1<<28 | 3,   // a length far over max record
		validBit | padBit | 8,            // a pad neither a slot nor to the end
		validBit | padBit | 256,          // past the end
		validBit | padBit | wideBit | 32, // a pad with the wide bit
		validBit | 120,                   // over max record 80
		validBit | padBit | gapLen,       // a gap past the end
	} {
		p, c, mem := newRing(t, 256)
		require.True(t, p.Push(make([]byte, 8), nil))
		c.Peek()
		c.Advance()
		// offset 32 now: pads must be one slot or reach the end exactly
		word(mem, ControlLen+32).Store(w)
		_, ok := c.Peek()
		require.False(t, ok, "%#x", w)
		require.ErrorIs(t, c.Err(), ErrCorrupt, "%#x", w)
	}

	// Three pads in a row: a correct producer writes at most a gap and
	// then a slot or the end.
	_, c, mem = newRing(t, 16<<10)
	for i := range 3 {
		word(mem, ControlLen+uint64(i)*gapLen).Store(validBit | padBit | gapLen)
	}
	_, ok = c.Peek()
	require.False(t, ok)
	require.ErrorIs(t, c.Err(), ErrCorrupt)

	p, _, mem = newRing(t, 256)
	word(mem, offTail).Store(1 << 20) // a tail ahead of the producer
	for p.Push(make([]byte, 64), nil) {
	}
	require.ErrorIs(t, p.Err(), ErrCorrupt)
}

func TestNoAllocs(t *testing.T) {
	p, c, _ := newRing(t, 4096)
	hdr, payload := make([]byte, 56), make([]byte, 100)
	allocs := testing.AllocsPerRun(1000, func() {
		p.Push(hdr, payload)
		if _, ok := c.Peek(); ok {
			c.Advance()
		}
	})
	require.Zero(t, allocs)
}

// TestStream sends 10^6 records of random sizes from one goroutine to another
// and checks content and order, with and without the short lap, and as a
// stream (Streaming: no zeroing ahead for mid-sized records, a gap after
// some).
func TestStream(t *testing.T) {
	for _, lap := range []int{0, 4 << 10} {
		for _, streaming := range []bool{false, true} {
			t.Run(fmt.Sprintf("lap%d/streaming=%v", lap, streaming), func(t *testing.T) { testStream(t, lap, streaming) })
		}
	}
}

func testStream(t *testing.T, lap int, streaming bool) {
	n := 1_000_000
	if testing.Short() || raceEnabled {
		n = 200_000
	}
	p, c, _ := newRing(t, 16<<10)
	p.SetLap(lap)
	p.Streaming(streaming)
	max := p.MaxRecord()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := rand.New(rand.NewPCG(1, 2))
		buf := make([]byte, max)
		for i := 0; i < n; i++ {
			size := 8 + r.IntN(64)
			if r.IntN(50) == 0 {
				size = 8 + r.IntN(max-8)
			}
			binary.LittleEndian.PutUint64(buf, uint64(i))
			for j := 8; j < size; j++ {
				buf[j] = byte(i + j)
			}
			split := r.IntN(size + 1)
			for !p.Push(buf[:split], buf[split:size]) {
				runtime.Gosched()
			}
		}
	}()
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < n; i++ {
		size := 8 + r.IntN(64)
		if r.IntN(50) == 0 {
			size = 8 + r.IntN(max-8)
		}
		r.IntN(size + 1)
		var rec []byte
		for {
			var ok bool
			if rec, ok = c.Peek(); ok {
				break
			}
			require.NoError(t, c.Err())
			runtime.Gosched()
		}
		if len(rec) != size || binary.LittleEndian.Uint64(rec) != uint64(i) {
			require.Equal(t, size, len(rec), "record %d", i)
			require.Equal(t, uint64(i), binary.LittleEndian.Uint64(rec))
		}
		for j := 8; j < size; j++ {
			if rec[j] != byte(i+j) {
				require.Equal(t, byte(i+j), rec[j], "record %d byte %d", i, j)
			}
		}
		c.Advance()
	}
	<-done
	_, ok := c.Peek()
	require.False(t, ok)
}

// Payloads made of words that look like valid headers must never be taken for
// records in a later lap: before a record is published, the word after it is
// zero, whether the producer zeroed the area ahead of itself or, in a stream
// of records too large to be worth it (Streaming), wrote that word alone.
func TestStalePayloadLooksLikeHeaders(t *testing.T) {
	for _, tc := range []struct {
		name      string
		capacity  int
		streaming func(r *rand.Rand) bool
	}{
		{"small", 256, func(*rand.Rand) bool { return false }},
		{"stream", 16 << 10, func(*rand.Rand) bool { return true }},
		{"mixed", 16 << 10, func(r *rand.Rand) bool { return r.IntN(2) == 0 }},
		{"lap", 16 << 10, func(r *rand.Rand) bool { return r.IntN(2) == 0 }},
		{"lapsmall", 16 << 10, func(r *rand.Rand) bool { return r.IntN(2) == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, c, _ := newRing(t, tc.capacity)
			fake := make([]byte, p.MaxRecord())
			switch tc.name {
			case "lap":
				p.SetLap(2 << 10)
			case "lapsmall": // mostly records within the lap
				p.SetLap(4 << 10)
				fake = fake[:600]
			}
			for i := 0; i+8 <= len(fake); i += 8 {
				binary.LittleEndian.PutUint64(fake[i:], (validBit|8)<<32|validBit|wideBit|8)
			}
			r := rand.New(rand.NewPCG(7, 8))
			var sent, got uint32
			for round := 0; round < 5000; round++ {
				for k := r.IntN(4); k >= 0; k-- {
					size := 4 + r.IntN(len(fake)-4)
					buf := append(binary.LittleEndian.AppendUint32(nil, sent), fake[:size-4]...)
					p.Streaming(tc.streaming(r))
					if !p.Push(buf, nil) {
						break
					}
					sent++
				}
				for k := r.IntN(5); k >= 0; k-- {
					rec, ok := c.Peek()
					if !ok {
						break
					}
					require.GreaterOrEqual(t, len(rec), 4)
					require.Equal(t, got, binary.LittleEndian.Uint32(rec))
					got++
					c.Advance()
				}
			}
			require.NoError(t, c.Err())
			require.Greater(t, got, uint32(1000))
		})
	}
}

type collect [][]byte

func (c *collect) Deliver(src int, rec []byte) { *c = append(*c, append([]byte(nil), rec...)) }

// Take hands over one record after an empty look and a burst of up to
// BurstMax while records stream in, in order, and never more than max.
func TestTakeStreaksAndBursts(t *testing.T) {
	mem, err := Alloc(64 << 10)
	require.NoError(t, err)
	p, err := NewProducer(mem)
	require.NoError(t, err)
	c, err := NewConsumer(mem)
	require.NoError(t, err)
	var got collect
	streak := false
	require.Zero(t, Take(c, &got, 0, &streak, 100))
	require.False(t, streak)
	total := 2*BurstMax + 4
	for i := 0; i < total; i++ {
		require.True(t, p.Push([]byte{byte(i)}, nil))
	}
	require.Equal(t, 1, Take(c, &got, 0, &streak, 1000), "after an empty look: one")
	require.True(t, streak)
	require.Equal(t, BurstMax, Take(c, &got, 0, &streak, 1000), "streaming: a burst")
	require.Equal(t, 3, Take(c, &got, 0, &streak, 3), "never more than max")
	require.Equal(t, BurstMax, Take(c, &got, 0, &streak, 1000), "another burst")
	require.True(t, streak)
	require.Zero(t, Take(c, &got, 0, &streak, 1000))
	require.False(t, streak, "an empty look ends the streak")
	require.Len(t, got, total)
	for i, rec := range got {
		require.Equal(t, []byte{byte(i)}, rec)
	}
}

// nopReceiver takes records and does nothing with them.
type nopReceiver struct{}

func (nopReceiver) Deliver(int, []byte) {}

// Pending may run on a goroutine other than the consumer's while the producer
// laps the ring with large records: it reads the control block only, so the
// race detector (race builds) finds no read of data the producer is writing.
// Reading the header word at a tail that the consumer had meanwhile moved
// past raced with the producer's copy of a later record into that space (this
// test failed under -race that way).
func TestPendingWhileLapping(t *testing.T) {
	p, c, _ := newRing(t, 4096)
	payload := make([]byte, p.MaxRecord())
	const records = 50000
	stop := make(chan struct{})
	var hints sync.WaitGroup
	hints.Add(1)
	go func() {
		defer hints.Done()
		for {
			select {
			case <-stop:
				return
			default:
				_ = c.Pending()
			}
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < records; {
			if p.Push(nil, payload[:len(payload)-i%64]) {
				i++
			}
		}
	}()
	for got := 0; got < records; {
		if _, ok := c.Peek(); ok {
			c.Advance()
			got++
		}
	}
	<-done
	close(stop)
	hints.Wait()
	require.False(t, c.Pending(), "drained")
}

// callerReceiver is a caller's own receiver interface with Receiver's method,
// as transport.Receiver is.
type callerReceiver interface{ Deliver(src int, rec []byte) }

// ReceiverOf converts a caller's receiver once and again only when it
// changes, and the Receiver it returns delivers to that receiver.
func TestReceiverOf(t *testing.T) {
	var o ReceiverOf[callerReceiver]
	var a, b collect
	ra := o.Of(&a)
	require.Same(t, &a, ra.(*collect))
	require.Equal(t, ra, o.Of(&a), "the same receiver: the kept conversion")
	rb := o.Of(&b)
	require.Same(t, &b, rb.(*collect), "another receiver: converted anew")
	rb.Deliver(0, []byte("x"))
	require.Len(t, b, 1)
	require.Empty(t, a)
}

// sliceReceiver is a receiver whose type is not comparable.
type sliceReceiver []int

func (sliceReceiver) Deliver(int, []byte) {}

// ReceiverOf never compares receivers with ==: a receiver of a type that
// is not comparable does not panic.
func TestReceiverOfUncomparable(t *testing.T) {
	var o ReceiverOf[callerReceiver]
	require.NotPanics(t, func() {
		o.Of(sliceReceiver{1}).Deliver(0, nil)
		o.Of(sliceReceiver{2}).Deliver(0, nil)
	})
}

// seqFiller fills a payload with bytes counting up from start.
type seqFiller struct {
	start byte
	calls int
}

func (f *seqFiller) Fill(p []byte) {
	f.calls++
	for i := range p {
		p[i] = f.start + byte(i)
	}
}

// PushFill's records wrap around the ring as Push's do, interleaved with
// them: the header copied, the payload written in place by the filler, the
// length exact; a record that does not fit leaves the filler uncalled.
func TestPushFillWrapAround(t *testing.T) {
	p, c, _ := newRing(t, 256) // max record 80
	var pushed, got int
	hdr := make([]byte, 8)
	for round := 0; round < 3000; round++ {
		n := round * 7 % 60
		binary.LittleEndian.PutUint32(hdr, uint32(pushed))
		f := &seqFiller{start: byte(round)}
		var ok bool
		if round%2 == 0 {
			ok = p.PushFill(hdr, n, f)
		} else {
			pay := make([]byte, n)
			(&seqFiller{start: byte(round)}).Fill(pay)
			ok = p.Push(hdr, pay)
		}
		if !ok {
			require.Zero(t, f.calls, "no room: the filler is not called")
		} else {
			pushed++
		}
		for {
			rec, ok := c.Peek()
			if !ok {
				break
			}
			require.Equal(t, uint32(got), binary.LittleEndian.Uint32(rec))
			for i, b := range rec[8:] {
				require.Equal(t, rec[8]+byte(i), b)
			}
			got++
			c.Advance()
		}
	}
	require.NoError(t, c.Err())
	require.Equal(t, pushed, got)
	require.False(t, p.PushFill(hdr, 100, &seqFiller{}), "over MaxRecord")
	require.False(t, p.PushFill(hdr, -1, &seqFiller{}), "a negative length")
	require.False(t, p.PushFill(hdr, 4, nil), "no filler")
}

// A filler that panics publishes nothing: the consumer sees no record, and
// the next push goes where the failed one would have.
func TestPushFillPanics(t *testing.T) {
	p, c, _ := newRing(t, 4096)
	require.Panics(t, func() { p.PushFill(make([]byte, 8), 200, panicFiller{}) })
	_, ok := c.Peek()
	require.False(t, ok)
	require.True(t, p.Push([]byte("abcdefgh"), []byte("x")))
	rec, ok := c.Peek()
	require.True(t, ok)
	require.Equal(t, "abcdefghx", string(rec))
	c.Advance()
	_, ok = c.Peek()
	require.False(t, ok, "what the filler wrote past the short record is not a record")
	require.NoError(t, c.Err())
}

type panicFiller struct{}

// Fill writes what looks like valid record headers everywhere, then panics.
func (panicFiller) Fill(p []byte) {
	for i := 0; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], (validBit|16)<<32|validBit|16)
	}
	panic("fill")
}

func TestPushFillNoAllocs(t *testing.T) {
	p, c, _ := newRing(t, 4096)
	hdr := make([]byte, 56)
	f := &seqFiller{}
	allocs := testing.AllocsPerRun(1000, func() {
		p.PushFill(hdr, 100, f)
		if _, ok := c.Peek(); ok {
			c.Advance()
		}
	})
	require.Zero(t, allocs)
}

// In a stream of mid-sized records, the producer asks for the lines of the
// record takeRecords ahead (takeAhead): the whole record's lines when they
// are known free, clipped at the end of the data area, and none when the
// consumer may still be reading them.
func TestTakeSpan(t *testing.T) {
	p, _, _ := newRing(t, 1<<14)
	const size = 1000 // not a whole number of lines
	lap := 3 * p.cap  // positions count on across laps

	p.tail = lap // an empty ring: everything past end is free
	end := lap + 40
	first, lines := p.takeSpan(end, size)
	from := 40 + (takeRecords-1)*size
	require.Equal(t, uint64(from)&^(lineLen-1), first, "the line holding the record takeRecords ahead")
	require.Equal(t, int((uint64(from+size)-first+lineLen-1)/lineLen), lines, "up to its last byte's line")

	// A record that would run past the end of the data area: its lines up
	// to that end.
	p.tail = lap + p.cap/2
	end = lap + p.cap - (takeRecords-1)*size - size/2
	first, lines = p.takeSpan(end, size)
	require.Equal(t, (p.cap-size/2)&^(lineLen-1), first)
	require.Equal(t, p.cap, first+uint64(lines)*lineLen, "clipped at the end")

	// Space the producer does not know to be free: nothing.
	p.tail = lap
	_, lines = p.takeSpan(lap+p.cap-takeRecords*size+1, size)
	require.Zero(t, lines, "one byte past the known-free space")
	_, lines = p.takeSpan(lap+p.cap-takeRecords*size, size)
	require.NotZero(t, lines, "up to it")
}

// With a short lap (SetLap), small records keep to the lap's first bytes of
// the data area while the consumer keeps up; a consumer more than half a lap
// behind lets them run on past it into the whole ring, and larger records
// always may.
func TestShortLap(t *testing.T) {
	p, c, mem := newRing(t, 64<<10)
	const lap = 4 << 10
	p.SetLap(lap)
	base := uintptr(unsafe.Pointer(&mem[ControlLen]))
	offOf := func(rec []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(rec))) - base }
	msg := make([]byte, 1<<10)
	var seq uint32
	push := func(n int) {
		t.Helper()
		binary.LittleEndian.PutUint32(msg, seq)
		require.True(t, p.Push(msg[:n], nil), "record %d of %d bytes", seq, n)
		seq++
	}
	var got uint32
	pop := func() []byte {
		t.Helper()
		rec, ok := c.Peek()
		require.True(t, ok)
		require.Equal(t, got, binary.LittleEndian.Uint32(rec))
		got++
		c.Advance()
		return rec
	}

	// A consumer that keeps up: ten laps of the ring's capacity, every
	// small record within the lap.
	for i := 0; i < 10*(64<<10)/64; i++ {
		push(4 + i%60)
		require.Less(t, offOf(pop()), uintptr(lap))
	}
	for i := 0; i < 200; i++ {
		push(lap/4 - 8) // the largest that keeps to the lap (header and rounding included)
		require.LessOrEqual(t, offOf(pop())+lap/4-8, uintptr(lap))
	}
	// A larger one goes on into the ring past the lap in time.
	far := false
	for i := 0; i < 100 && !far; i++ {
		push(1 << 10)
		far = offOf(pop()) >= lap
	}
	require.True(t, far, "records over a quarter of the lap use the whole ring")

	// A consumer that lags from a lap's start: 40 KiB of small records
	// queue up, ten laps' worth, on past the lap.
	for {
		push(60)
		if offOf(pop()) < 128 {
			break
		}
	}
	for i := 0; i < 40<<10/64; i++ {
		push(60)
	}
	maxOff := uintptr(0)
	for got < seq {
		maxOff = max(maxOff, offOf(pop()))
	}
	require.Greater(t, maxOff, uintptr(lap), "the queue ran on past the lap")
	// And back into the lap once it has caught up.
	for i := 0; i < 2*(64<<10)/64; i++ {
		push(60)
		pop()
	}
	push(60)
	require.Less(t, offOf(pop()), uintptr(lap))

	// Paused (PauseLap), records march on through the whole ring; resumed,
	// they keep to the lap again.
	p.PauseLap(true)
	maxOff = 0
	for i := 0; i < 2*lap/64; i++ {
		push(60)
		maxOff = max(maxOff, offOf(pop()))
	}
	require.Greater(t, maxOff, uintptr(lap), "paused")
	p.PauseLap(false)
	for i := 0; i < 2*(64<<10)/64; i++ {
		push(60)
		pop()
	}
	for i := 0; i < 2*lap/64; i++ {
		push(60)
		require.Less(t, offOf(pop()), uintptr(lap), "resumed")
	}
	require.NoError(t, c.Err())
	require.NoError(t, p.Err())
}

// TestGapAfterStreamRecord: in a stream, a record of gapFrom to gapTo bytes
// is followed by a pad of gapLen bytes that nothing else is written in;
// the consumer steps over it, and finds nothing past it until the next
// record is published. Outside a stream, or for a smaller record, no gap.
func TestGapAfterStreamRecord(t *testing.T) {
	p, c, mem := newRing(t, 16<<10)
	p.Streaming(true)
	payload := make([]byte, 1008) // with an 8-byte header, a record of 1024 bytes
	for i := range payload {
		payload[i] = byte(i)
	}
	require.True(t, p.Push(make([]byte, 8), payload))
	require.Equal(t, uint64(1024+gapLen), p.pos)
	require.Equal(t, uint64(validBit|padBit|gapLen), word(mem, ControlLen+1024).Load()&(1<<32-1))
	require.Equal(t, make([]byte, gapLen-4), mem[ControlLen+1028:ControlLen+1024+gapLen], "nothing written in the gap")

	rec, ok := c.Peek()
	require.True(t, ok)
	require.Equal(t, payload, rec[8:])
	c.Advance()
	_, ok = c.Peek()
	require.False(t, ok)
	require.NoError(t, c.Err())
	require.Equal(t, uint64(1024+gapLen), c.head, "the consumer is past the gap")

	// A record of an odd number of slots leaves the position mid-line past
	// its gap; one of an even number after it starts the next line: gap,
	// then a slot of pad, then the record (which, placed past a pad, takes
	// no gap of its own).
	require.True(t, p.Push(make([]byte, 8), make([]byte, 1008-32)))
	require.Equal(t, uint64(1024+gapLen+992+gapLen), p.pos)
	require.True(t, p.Push(make([]byte, 8), make([]byte, 1008)))
	require.Equal(t, uint64(1024+gapLen+992+gapLen+32+1024), p.pos)
	for _, want := range []int{1008 - 32, 1008} {
		rec, ok := c.Peek()
		require.True(t, ok)
		require.Len(t, rec, 8+want)
		c.Advance()
	}

	// No gap outside a stream, nor after a record of gapFrom bytes or less.
	for _, tc := range []struct {
		streaming bool
		n         int
	}{{false, 1008}, {true, gapFrom - 16}} {
		p, _, _ := newRing(t, 16<<10)
		p.Streaming(tc.streaming)
		require.True(t, p.Push(make([]byte, 8), make([]byte, tc.n)))
		require.Equal(t, recordSize(uint64(8+tc.n), 8), p.pos, "%+v", tc)
	}
}
