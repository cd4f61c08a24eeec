// Command pingpong is the MPI ping-pong benchmark over mpiam: rank 0 sends a
// message of each size from 1 byte to 4 MiB (powers of 4) to rank 1 with
// Send, rank 1 receives it with Recv and sends it straight back, and rank 0
// reports the half round-trip time (latency, us) and the bandwidth (MB/s,
// 10^6 bytes per second) per size. Every message's length is checked on
// both sides and the content of each size's last round trip is compared
// with what was sent. Small messages travel eagerly, large ones by
// rendezvous (the switch is at the AM transport's medium limit). Ranks other
// than 0 and 1 only wait at the final barrier.
//
//	amrun -n 2 ./pingpong                     # two processes over shared memory
//	amrun -n 2 ./pingpong -max 65536 -i 500   # a shorter run
//	amrun -n 2 --transport loop ./pingpong    # two goroutine ranks
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/amgo-hpc/amgo/mpiam"
)

const tagPing, tagPong = 1, 2

func main() {
	iters := flag.Int("i", 1000, "round trips per size up to 64 KiB; fewer above (at least 20)")
	minSize := flag.Int("min", 1, "smallest message in bytes")
	maxSize := flag.Int("max", 4<<20, "largest message in bytes")
	flag.Parse()
	if *iters < 1 || *minSize < 1 || *maxSize < *minSize {
		fmt.Fprintln(os.Stderr, "pingpong: need -i >= 1 and 1 <= -min <= -max")
		os.Exit(2)
	}
	err := mpiam.Run(mpiam.Config{}, func(world *mpiam.Comm) error {
		return pingpong(world, *iters, *minSize, *maxSize)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "pingpong:", err)
		os.Exit(1)
	}
}

// roundTrips is the number of timed round trips for a size: iters up to
// 64 KiB, then scaled down so that every size moves about as many bytes.
func roundTrips(iters, size int) int {
	if size <= 64<<10 {
		return iters
	}
	return max(20, iters*(64<<10)/size)
}

func pingpong(world *mpiam.Comm, iters, minSize, maxSize int) error {
	if world.Size() < 2 {
		return fmt.Errorf("needs at least 2 ranks, job has %d", world.Size())
	}
	me := world.Rank()
	if me == 0 {
		fmt.Printf("# amgo MPI ping-pong, %d ranks, ranks 0 and 1\n", world.Size())
		fmt.Printf("# %10s %10s %14s %12s\n", "bytes", "trips", "latency(us)", "MB/s")
	}
	buf := make([]byte, maxSize)
	want := make([]byte, maxSize)
	for size := minSize; size <= maxSize; size *= 4 {
		n := roundTrips(iters, size)
		warm := min(10, n)
		msg, ref := buf[:size], want[:size]
		for i := range ref {
			ref[i] = byte(i*7 + size)
		}
		if err := world.Barrier(); err != nil {
			return err
		}
		var start time.Time
		for it := -warm; it < n; it++ {
			if it == 0 {
				start = time.Now()
			}
			switch me {
			case 0:
				if it == n-1 {
					copy(msg, ref)
					msg[size-1] ^= byte(it) // the last trip's content differs from the warm-up's
					ref[size-1] = msg[size-1]
				}
				if err := mpiam.Send(world, msg, 1, tagPing); err != nil {
					return err
				}
				if it == n-1 {
					clear(msg) // so that an echo that did not arrive cannot pass
				}
				st, err := mpiam.Recv(world, msg, 1, tagPong)
				if err != nil {
					return err
				}
				if st.Bytes != size {
					return fmt.Errorf("size %d: pong of %d bytes", size, st.Bytes)
				}
			case 1:
				st, err := mpiam.Recv(world, msg, 0, tagPing)
				if err != nil {
					return err
				}
				if st.Bytes != size || st.Source != 0 || st.Tag != tagPing {
					return fmt.Errorf("size %d: ping of %d bytes from %d tag %d", size, st.Bytes, st.Source, st.Tag)
				}
				if err := mpiam.Send(world, msg, 0, tagPong); err != nil {
					return err
				}
			}
		}
		if me == 0 {
			d := time.Since(start)
			if !bytes.Equal(msg, ref) {
				return fmt.Errorf("size %d: echoed content differs from what was sent", size)
			}
			half := d.Seconds() / float64(n) / 2
			fmt.Printf("  %10d %10d %14.3f %12.2f\n", size, n, half*1e6, float64(size)/half/1e6)
		}
		if size > maxSize/4 {
			break // avoid overflow of size*4 near the int limit
		}
	}
	if err := world.Barrier(); err != nil {
		return err
	}
	if me == 0 {
		fmt.Println("pingpong: OK")
	}
	return nil
}
