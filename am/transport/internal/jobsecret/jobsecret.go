// Package jobsecret gives socket transports (tcp, udp) the per-job secret
// that proves membership of the job (docs/launch.md): AMGO_JOB_SECRET as
// the launcher set it, or else one that rank 0 draws and shares through the
// bootstrap's key-value space.
package jobsecret

import (
	"crypto/rand"
	"errors"
	"fmt"

	"encoding/hex"

	"github.com/amgo-hpc/amgo/am/transport"
	settings "github.com/amgo-hpc/amgo/am/transport/internal/opts"
)

// MinLen is the shortest secret accepted, in bytes.
const MinLen = 16

// ErrBad reports a secret that is not hex of MinLen bytes or more.
var ErrBad = errors.New("job secret must be at least 16 bytes in hex")

// Before runs before the bootstrap's fence: it returns the secret from option
// "secret" or AMGO_JOB_SECRET; without one, rank 0 draws 16 random bytes and
// publishes them under key (other ranks get nil and call After).
func Before(b transport.Bootstrap, opts map[string]string, key string) ([]byte, error) {
	if s := settings.Get(opts, "secret", "AMGO_JOB_SECRET"); s != "" {
		secret, err := hex.DecodeString(s)
		if err != nil || len(secret) < MinLen {
			return nil, fmt.Errorf("AMGO_JOB_SECRET: %w", ErrBad)
		}
		return secret, nil
	}
	if b.Rank() != 0 {
		return nil, nil
	}
	secret := make([]byte, MinLen)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("draw job secret: %w", err)
	}
	if err := b.Put(key, hex.EncodeToString(secret)); err != nil {
		return nil, fmt.Errorf("publish job secret: %w", err)
	}
	return secret, nil
}

// After runs after the fence on a rank that Before gave nil: it reads the
// secret rank 0 published under key.
func After(b transport.Bootstrap, key string) ([]byte, error) {
	s, err := b.Get(key)
	if err != nil {
		return nil, fmt.Errorf("look up the job secret: %w", err)
	}
	secret, err := hex.DecodeString(s)
	if err != nil || len(secret) < MinLen {
		return nil, fmt.Errorf("job secret from rank 0: %w", ErrBad)
	}
	return secret, nil
}
