package ring

import (
	"testing"
)

// FuzzConsumer fills the data area with arbitrary bytes, as a buggy producer in
// another process might, and checks that the consumer never reads outside the
// ring, never panics, and stops with ErrCorrupt or an empty ring.
func FuzzConsumer(f *testing.F) {
	f.Add([]byte{}, uint16(0))
	f.Add([]byte{8, 0, 0, 0, 1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, uint16(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0}, uint16(16))
	f.Add([]byte{200, 0, 0, 0, 3, 0, 0, 0}, uint16(56))
	f.Add([]byte{8, 0, 0, 0x60, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, uint16(0))    // a wide record
	f.Add([]byte{28, 0, 0, 0x40, 1, 2, 3, 4, 5, 6, 7, 8}, uint16(0))               // a record of one slot
	f.Add([]byte{32, 0, 0, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, uint16(32))  // a slot of pad
	f.Add([]byte{224, 0, 0, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, uint16(32)) // a pad to the end
	f.Fuzz(func(t *testing.T, data []byte, tail uint16) {
		mem, err := Alloc(256)
		if err != nil {
			t.Fatal(err)
		}
		copy(mem[ControlLen:], data)
		word(mem, offTail).Store(uint64(tail) &^ 7)
		c, err := NewConsumer(mem)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 100; i++ {
			rec, ok := c.Peek()
			if !ok {
				return
			}
			if len(rec) > c.MaxRecord() {
				t.Fatalf("record of %d bytes, max %d", len(rec), c.MaxRecord())
			}
			c.Advance()
			c.Pending()
		}
	})
}
