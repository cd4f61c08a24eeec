package transporttest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/amgo-hpc/amgo/am/transport"
)

// ErrNoKey is returned by the bootstraps' Get for a key nobody put.
var ErrNoKey = errors.New("transporttest: no such key")

// memJob is the state that the n in-memory bootstraps of one job share.
type memJob struct {
	id   string
	size int

	mu      sync.Mutex
	cond    *sync.Cond
	kv      map[string]string
	arrived int // ranks at the current fence
	gen     int // fences completed
}

type memBootstrap struct {
	job  *memJob
	rank int
}

// NewBootstraps returns the bootstraps of n ranks of one job in this process:
// a shared key-value map and a barrier. Each rank's transport must be opened on
// its own goroutine, since Fence blocks until all n ranks have called it.
func NewBootstraps(n int, jobID string) []transport.Bootstrap {
	j := &memJob{id: jobID, size: n, kv: map[string]string{}}
	j.cond = sync.NewCond(&j.mu)
	bs := make([]transport.Bootstrap, n)
	for i := range bs {
		bs[i] = &memBootstrap{job: j, rank: i}
	}
	return bs
}

func (b *memBootstrap) Rank() int     { return b.rank }
func (b *memBootstrap) Size() int     { return b.job.size }
func (b *memBootstrap) JobID() string { return b.job.id }

func (b *memBootstrap) Put(key, value string) error {
	b.job.mu.Lock()
	defer b.job.mu.Unlock()
	b.job.kv[key] = value
	return nil
}

func (b *memBootstrap) Fence() error {
	j := b.job
	j.mu.Lock()
	defer j.mu.Unlock()
	gen := j.gen
	if j.arrived++; j.arrived == j.size {
		j.arrived = 0
		j.gen++
		j.cond.Broadcast()
		return nil
	}
	for j.gen == gen {
		j.cond.Wait()
	}
	return nil
}

func (b *memBootstrap) Get(key string) (string, error) {
	b.job.mu.Lock()
	defer b.job.mu.Unlock()
	v, ok := b.job.kv[key]
	if !ok {
		return "", fmt.Errorf("%w: %q", ErrNoKey, key)
	}
	return v, nil
}

// FileBootstrap is a transport.Bootstrap for ranks in separate processes that
// share a directory: each Put is a file, each Fence a set of marker files. It is
// meant for tests that re-execute the test binary, not for production.
type FileBootstrap struct {
	Dir     string        // shared directory; must exist
	ID      string        // job id
	R, N    int           // this rank and the job size
	Timeout time.Duration // how long Fence waits for the others; 0 means 30 s
	fences  int
}

// Rank returns R.
func (b *FileBootstrap) Rank() int { return b.R }

// Size returns N.
func (b *FileBootstrap) Size() int { return b.N }

// JobID returns ID.
func (b *FileBootstrap) JobID() string { return b.ID }

// Put writes key=value as the file kv.<key>, atomically.
func (b *FileBootstrap) Put(key, value string) error {
	tmp := filepath.Join(b.Dir, fmt.Sprintf(".tmp.%d.%s", b.R, key))
	if err := os.WriteFile(tmp, []byte(value), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(b.Dir, "kv."+key))
}

// Fence creates this rank's marker for the next fence and waits until every
// rank's marker exists. Errors: a timeout naming the missing rank.
func (b *FileBootstrap) Fence() error {
	b.fences++
	name := func(r int) string {
		return filepath.Join(b.Dir, "fence."+strconv.Itoa(b.fences)+"."+strconv.Itoa(r))
	}
	if err := os.WriteFile(name(b.R), nil, 0o600); err != nil {
		return err
	}
	timeout := b.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for r := 0; r < b.N; r++ {
		for {
			if _, err := os.Stat(name(r)); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("transporttest: fence %d: rank %d missing after %v", b.fences, r, timeout)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// Get reads the value of key. Errors: ErrNoKey.
func (b *FileBootstrap) Get(key string) (string, error) {
	v, err := os.ReadFile(filepath.Join(b.Dir, "kv."+key))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%w: %q", ErrNoKey, key)
	}
	return string(v), err
}
