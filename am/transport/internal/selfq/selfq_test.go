package selfq

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// rec records what is handed up and pushes more from inside a handler, as
// a handler that sends to its own rank does.
type rec struct {
	q    *Queue
	got  []string
	push int
}

func (r *rec) Deliver(src int, pkt []byte) {
	r.got = append(r.got, fmt.Sprintf("%d:%s", src, pkt))
	if r.push > 0 {
		r.push--
		r.q.Push([]byte("late"), []byte(fmt.Sprint(r.push)), 1<<20)
	}
	copy(pkt, "XXXX") // a packet is the poller's while its handler runs
}

// Packets come out in order and intact, a partial Deliver keeps the rest
// for the next, packets pushed while others are handed up wait their turn,
// and the limit refuses a packet only when the queue is not empty.
func TestOrderIntactAndBounded(t *testing.T) {
	var q Queue
	require.False(t, q.Pending())
	require.True(t, q.Push([]byte("ab"), []byte("cd"), 1<<20))
	require.True(t, q.Push([]byte("ef"), nil, 1<<20))
	require.True(t, q.Pending())
	r := &rec{q: &q, push: 2}
	n, bytes := q.Deliver(r, 3, 1)
	require.Equal(t, 1, n)
	require.Equal(t, 4, bytes)
	n, _ = q.Deliver(r, 3, 10)
	require.Equal(t, 1, n)
	n, _ = q.Deliver(r, 3, 10)
	require.Equal(t, 2, n)
	require.Equal(t, []string{"3:abcd", "3:ef", "3:late1", "3:late0"}, r.got)
	require.True(t, q.Push(make([]byte, 100), nil, 10), "an empty queue takes any packet")
	require.False(t, q.Push([]byte("x"), nil, 10))
}
