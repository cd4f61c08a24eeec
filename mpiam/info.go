package mpiam

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
)

// Version and Subversion are the version of the MPI standard whose
// semantics mpiam follows (MPI_VERSION, MPI_SUBVERSION): 4.1. mpiam
// implements part of it; docs/mpi.md lists what.
const (
	Version    = 4
	Subversion = 1
)

// GetVersion returns the MPI standard's version and subversion that mpiam
// follows (MPI_Get_version, MPI-4.1 §9.1.1): 4, 1. It may be called at any
// time.
func GetVersion() (version, subversion int) { return Version, Subversion }

// GetLibraryVersion describes the library (MPI_Get_library_version, MPI-4.1
// §9.1.1): "amgo <module version> (MPI over Active Messages, <Go version>)",
// the module version as the build recorded it ("(devel)" in a checkout).
// It may be called at any time.
func GetLibraryVersion() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range append([]*debug.Module{&bi.Main}, bi.Deps...) {
			if m.Path == "github.com/amgo-hpc/amgo" && m.Version != "" {
				v = m.Version
				break
			}
		}
	}
	return fmt.Sprintf("amgo %s (MPI over Active Messages, %s)", v, runtime.Version())
}

// GetProcessorName names the machine the calling process runs on
// (MPI_Get_processor_name, MPI-4.1 §9.1.1): its host name, which on a
// cluster tells nodes apart (the node identity that decides shared memory
// is finer: docs/launch.md). Errors: ErrOther when the host name cannot be
// read.
func GetProcessorName() (string, error) {
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("%w: processor name: %w", ErrOther, err)
	}
	return h, nil
}

// SetName names c (MPI_Comm_set_name, MPI-4.1 §7.10): a local label for
// tools and error messages, not collective; names of any length are kept.
// Errors: ErrComm for a freed or nil communicator.
func (c *Comm) SetName(name string) error {
	if err := c.valid(); err != nil {
		return err
	}
	c.name.Store(&name)
	return nil
}

// Name returns c's name (MPI_Comm_get_name, MPI-4.1 §7.10):
// "MPI_COMM_WORLD" for the world communicator until renamed, "" for a
// communicator never named. Errors: ErrComm for a freed or nil
// communicator.
func (c *Comm) Name() (string, error) {
	if err := c.valid(); err != nil {
		return "", err
	}
	if v := c.name.Load(); v != nil {
		return *v, nil
	}
	if c == c.p.world {
		return "MPI_COMM_WORLD", nil
	}
	return "", nil
}
