package transporttest

import (
	"sync/atomic"

	"github.com/amgo-hpc/amgo/am/transport"
)

// Batching wraps a network as a transport.Batcher that counts the Holds and
// Flushes it is given (its Sends still go at once), for the tests of layers
// that pass batching on to the network under them.
type Batching struct {
	transport.Transport
	Holds, Flushes atomic.Int32
}

// Hold counts a Hold.
func (b *Batching) Hold() { b.Holds.Add(1) }

// Flush counts a Flush and returns nil.
func (b *Batching) Flush() error { b.Flushes.Add(1); return nil }
