package mpiam

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/amgo-hpc/amgo/internal/memcopy"
)

// BsendOverhead is the bytes of attached buffer each buffered send uses besides
// its data (MPI_BSEND_OVERHEAD): size the buffer for a set of pending Bsends as
// the sum of their sizes plus BsendOverhead each (MPI-4.1 §3.6).
const BsendOverhead = 64

// bsendBuffer is the process's attached buffer for buffered sends (MPI-4.1 §3.6).
type bsendBuffer struct {
	mu     sync.Mutex
	buf    []byte
	blocks []bsendBlock // allocated, sorted by offset
}

type bsendBlock struct{ off, end int }

// errBsendFull marks a buffered send that found the attached buffer full of
// pending ones: the sender polls (for bsendWait at most) and tries again
// before it returns the error.
var errBsendFull = errors.New("attached buffer full")

// bsendWait bounds the polling of a buffered send that finds the buffer
// full: a pending send whose receive is not posted may never free its space.
const bsendWait = 100 * time.Millisecond

// take copies send r's data into the attached buffer and returns an internal
// standard-mode send of the copy, which frees the space when it completes.
func (b *bsendBuffer) take(r *reqState) (*reqState, error) {
	need := r.size() + BsendOverhead
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf == nil {
		return nil, fmt.Errorf("%w: buffered send of %d bytes with no buffer attached (BufferAttach)", ErrBuffer, r.size())
	}
	off := 0
	i := 0
	for ; i < len(b.blocks); i++ {
		if b.blocks[i].off-off >= need {
			break
		}
		off = b.blocks[i].end
	}
	if len(b.buf)-off < need && i == len(b.blocks) {
		err := fmt.Errorf("%w: buffered send of %d bytes (+%d overhead) does not fit the attached buffer of %d bytes (%d blocks pending)",
			ErrBuffer, r.size(), BsendOverhead, len(b.buf), len(b.blocks))
		if len(b.blocks) > 0 {
			err = fmt.Errorf("%w: %w", errBsendFull, err) // polling may free some
		}
		return nil, err
	}
	blk := bsendBlock{off, off + need}
	b.blocks = append(b.blocks, bsendBlock{})
	copy(b.blocks[i+1:], b.blocks[i:])
	b.blocks[i] = blk
	data := b.buf[off+BsendOverhead : off+need : off+need]
	if r.lay != nil {
		r.lay.pack(data, r.buf, 0)
	} else {
		memcopy.Copy(data, r.buf)
	}
	ir, _ := r.comm.newSend(data, r.peer, r.tag, Standard, false)
	ir.useCold()
	ir.bblock = blk
	ir.onDone = b.release
	return ir, nil
}

func (b *bsendBuffer) release(r *reqState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := sort.Search(len(b.blocks), func(i int) bool { return b.blocks[i].off >= r.bblock.off })
	if i < len(b.blocks) && b.blocks[i] == r.bblock {
		b.blocks = append(b.blocks[:i], b.blocks[i+1:]...)
	}
}

func (b *bsendBuffer) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.blocks)
}

// BufferAttach gives the process a buffer for buffered sends (MPI_Buffer_attach,
// MPI-4.1 §3.6). Only one buffer is attached at a time: ErrBuffer if one is.
func (c *Comm) BufferAttach(buf []byte) error {
	if err := c.valid(); err != nil {
		return err
	}
	b := &c.p.bsend
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf != nil {
		return fmt.Errorf("%w: a buffer of %d bytes is already attached", ErrBuffer, len(b.buf))
	}
	if len(buf) == 0 {
		return fmt.Errorf("%w: empty buffer", ErrBuffer)
	}
	b.buf = buf
	return nil
}

// BufferDetach waits until every buffered message has left the attached buffer
// (MPI_Buffer_detach: "blocks until all messages currently in the buffer have
// been transmitted"), detaches it and returns it. ErrBuffer if none is attached.
func (c *Comm) BufferDetach() ([]byte, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	b := &c.p.bsend
	b.mu.Lock()
	if b.buf == nil {
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: no buffer attached", ErrBuffer)
	}
	b.mu.Unlock()
	if err := c.p.waitFor(func() bool { return b.pending() == 0 }); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	buf := b.buf
	b.buf = nil
	return buf, nil
}
