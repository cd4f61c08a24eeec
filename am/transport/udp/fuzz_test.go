package udp

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// fuzzKey keys the datagrams of the fuzz corpus.
var fuzzKey = DeriveKey([]byte("fuzz-secret-0123"))

// FuzzDatagram feeds arbitrary bytes to DecodeDatagram as rank 1 of a job of
// 4: it must never panic, and whatever it accepts must be exactly the
// datagram that AppendDatagram makes for the source and packet it returned
// and the datagram number in its frame (so nothing but a proved datagram of
// this job gets through). The committed
// corpus (testdata/fuzz/FuzzDatagram) holds valid datagrams of several
// shapes and near misses; `go test -fuzz FuzzDatagram ./am/transport/udp`
// explores further.
func FuzzDatagram(f *testing.F) {
	mac, err := NewProver(fuzzKey)
	if err != nil {
		f.Fatal(err)
	}
	for _, src := range []int{0, 1, 3} {
		f.Add(AppendDatagram(nil, mac, src, 1, uint64(src)<<40+5, []byte("a packet")))
	}
	f.Add(AppendDatagram(nil, mac, 0, 1, 1<<63, nil))
	f.Add([]byte("amU2"))
	f.Fuzz(func(t *testing.T, d []byte) {
		in := bytes.Clone(d)
		var n [NonceLen]byte
		src, pkt, err := DecodeDatagram(d, 1, 4, mac, &n)
		if !bytes.Equal(in, d) {
			t.Fatal("DecodeDatagram modified its input")
		}
		if err != nil {
			if pkt != nil || src != -1 {
				t.Fatalf("error %v with a result", err)
			}
			return
		}
		if src < 0 || src >= 4 {
			t.Fatalf("accepted source rank %d", src)
		}
		seq := binary.LittleEndian.Uint64(d[12:])
		if want := AppendDatagram(nil, mac, src, 1, seq, pkt); !bytes.Equal(want, d) {
			t.Fatalf("accepted %x, which is not the datagram %x", d, want)
		}
	})
}
