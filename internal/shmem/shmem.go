// Package shmem makes memory that processes of one node share: a file
// under /dev/shm, mapped MAP_SHARED by each of them. One process creates
// it, tells the others its name, they map it, and the creator removes the
// name once all have (the memory lives on while mapped). mpiam's shared
// windows (WinAllocateShared) are built on it.
package shmem

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// Dir is where the files are made: a tmpfs, so that the memory is RAM and
// never written back to a disk.
const Dir = "/dev/shm"

// Create makes a file of size bytes (size > 0) readable and writable by this
// user only, named prefix and a random suffix, and maps it. It returns the
// name for Open and the mapping. Errors: the file system's and mmap's.
func Create(prefix string, size int) (string, []byte, error) {
	if size <= 0 {
		return "", nil, fmt.Errorf("shmem: size %d", size)
	}
	f, err := os.CreateTemp(Dir, prefix+"*")
	if err != nil {
		return "", nil, fmt.Errorf("shmem: %w", err)
	}
	mem, err := sizeAndMap(f, size)
	if err != nil {
		return "", nil, err
	}
	return f.Name(), mem, nil
}

// CreateAt makes the file path of size bytes (size > 0), readable and
// writable by this user only, and maps it, for a name the other processes
// can work out themselves. A file left at path by a process that died
// (names embed a process id, which the system reuses) is replaced.
// Errors: the file system's and mmap's.
func CreateAt(path string, size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shmem: size %d", size)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		_ = os.Remove(path)
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("shmem: %w", err)
	}
	return sizeAndMap(f, size)
}

// sizeAndMap sizes the new file f to size bytes and maps it; it closes f,
// and removes its name on failure.
func sizeAndMap(f *os.File, size int) ([]byte, error) {
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		_ = os.Remove(f.Name())
		return nil, fmt.Errorf("shmem: %s: %w", f.Name(), err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = os.Remove(f.Name())
		return nil, fmt.Errorf("shmem: mmap %s: %w", f.Name(), err)
	}
	return mem, nil
}

// Open maps the file name that Create or CreateAt made, which must hold size bytes.
// Errors: the file system's, mmap's, and a size that differs.
func Open(name string, size int) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("shmem: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shmem: %w", err)
	}
	if st.Size() != int64(size) {
		return nil, fmt.Errorf("shmem: %s holds %d bytes, want %d", name, st.Size(), size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shmem: mmap %s: %w", name, err)
	}
	return mem, nil
}

// Remove removes name; mappings stay valid until unmapped.
func Remove(name string) error { return os.Remove(name) }

// Unmap releases a mapping Create or Open returned.
func Unmap(mem []byte) error { return unix.Munmap(mem) }
