// Package opts reads a transport's settings: from the options map am passes
// it, else from an AMGO_* environment variable.
package opts

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Get returns opts[key] if present, else the environment variable env.
func Get(opts map[string]string, key, env string) string {
	if v, ok := opts[key]; ok {
		return v
	}
	return os.Getenv(env)
}

// Bytes reads a byte count ("65536", "64k", "4m") from opts[key] or env,
// within [lo, hi] (0 only when lo is 0); def when neither is set. The error names the setting and
// the accepted range.
func Bytes(opts map[string]string, key, env string, def, lo, hi int) (int, error) {
	raw := Get(opts, key, env)
	s := strings.TrimSpace(raw)
	if s == "" {
		return def, nil
	}
	mul := 1
	switch {
	case strings.HasSuffix(s, "k"), strings.HasSuffix(s, "K"):
		mul, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "m"), strings.HasSuffix(s, "M"):
		mul, s = 1<<20, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n == 0 && lo > 0 || n > hi/mul || n*mul < lo {
		return 0, fmt.Errorf("bad %s %q: want a byte count such as 65536 or 64k, in [%d, %d]", key, raw, lo, hi)
	}
	return n * mul, nil
}

// Duration reads a non-negative Go duration (such as 20us) for key: opts[key]
// if present, else the environment variable env; def when neither is set.
// Errors: a value that is not such a duration.
func Duration(opts map[string]string, key, env string, def time.Duration) (time.Duration, error) {
	s := strings.TrimSpace(Get(opts, key, env))
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("bad %s %q: want a non-negative duration such as 20us", key, s)
	}
	return d, nil
}

// Port reads a TCP or UDP port number for key (opts, then env): 1..65535, or
// 0 (any) when unset. Errors: anything else.
func Port(opts map[string]string, key, env string) (int, error) {
	s := strings.TrimSpace(Get(opts, key, env))
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 65535 {
		return 0, fmt.Errorf("bad %s %q: want a port number 0..65535", key, s)
	}
	return n, nil
}
