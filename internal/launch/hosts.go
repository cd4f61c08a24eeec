package launch

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Host is one host of a job that spans several (Spec.Hosts).
type Host struct {
	// Name is what the launcher command (Spec.LauncherExec, ssh by default)
	// is given to reach the host.
	Name string
	// Slots is how many ranks the host takes before placement moves on to
	// the next host; 0 means a share of the ranks that no host claimed (see
	// Place).
	Slots int
}

// ParseHosts parses a comma-separated host list, "a,b:2,c" (name, or
// name:slots), as amrun's --hosts takes it. Errors wrap ErrSpec: an empty
// name or a slot count that is not a positive integer.
func ParseHosts(list string) ([]Host, error) {
	var hosts []Host
	for _, f := range strings.Split(list, ",") {
		h, err := parseHost(strings.TrimSpace(f), "")
		if err != nil {
			return nil, err
		}
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// ReadHostfile reads a host file: one host per line, as "name", "name:slots"
// (MPICH's Hydra) or "name slots=N" (Open MPI); '#' starts a comment and
// blank lines are skipped. Errors wrap ErrSpec (a malformed line, naming its
// number, or a file without hosts) or are the reader's.
func ReadHostfile(r io.Reader) ([]Host, error) {
	var hosts []Host
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		slots := ""
		for _, opt := range f[1:] {
			k, v, ok := strings.Cut(opt, "=")
			switch {
			case ok && k == "slots":
				slots = v
			case ok && k == "max_slots":
			default:
				return nil, fmt.Errorf("%w: host file line %d: unknown field %q (want name, name:slots or name slots=N)", ErrSpec, n, opt)
			}
		}
		h, err := parseHost(f[0], slots)
		if err != nil {
			return nil, fmt.Errorf("host file line %d: %w", n, err)
		}
		hosts = append(hosts, h)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%w: host file lists no host", ErrSpec)
	}
	return hosts, nil
}

// ReadHostfilePath is ReadHostfile of the named file.
func ReadHostfilePath(path string) ([]Host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSpec, err)
	}
	defer f.Close()
	return ReadHostfile(f)
}

func parseHost(s, slots string) (Host, error) {
	name := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 && slots == "" {
		name, slots = s[:i], s[i+1:]
	}
	if name == "" || strings.ContainsAny(name, " \t'\"\\") || strings.HasPrefix(name, "-") {
		return Host{}, fmt.Errorf("%w: bad host name %q", ErrSpec, name)
	}
	h := Host{Name: name}
	if slots != "" {
		n, err := strconv.Atoi(slots)
		if err != nil || n < 1 {
			return Host{}, fmt.Errorf("%w: host %s: slot count %q is not a positive integer", ErrSpec, name, slots)
		}
		h.Slots = n
	}
	return h, nil
}

// Place returns the host index of each of n ranks on hosts.
//
// A host with Slots takes that many ranks; the ranks that no slot count
// claims are shared evenly among the hosts without one (the first ones
// getting one more when they do not divide). mapBy "" or "slot" places in
// blocks: ranks 0..s0-1 on the first host, the next s1 on the second, and so
// on; "node" places round-robin, rank r on the next host that still has a
// free slot. When every slot is taken (more ranks than slots) placement
// starts over from the first host, oversubscribing, as Hydra does. Errors
// wrap ErrSpec: no hosts, n < 1, an unknown mapBy.
func Place(n int, hosts []Host, mapBy string) ([]int, error) {
	if len(hosts) == 0 || n < 1 {
		return nil, fmt.Errorf("%w: placing %d ranks on %d hosts", ErrSpec, n, len(hosts))
	}
	if mapBy != "" && mapBy != "slot" && mapBy != "node" {
		return nil, fmt.Errorf("%w: bad --map-by %q: want slot or node", ErrSpec, mapBy)
	}
	slots := make([]int, len(hosts))
	claimed, open := 0, 0
	for _, h := range hosts {
		claimed += h.Slots
		if h.Slots == 0 {
			open++
		}
	}
	if open > 0 {
		rest := max(n-claimed, 0)
		q, extra := rest/open, rest%open
		for i, h := range hosts {
			if h.Slots > 0 {
				slots[i] = h.Slots
				continue
			}
			slots[i] = q
			if extra > 0 {
				slots[i]++
				extra--
			}
		}
	} else {
		for i, h := range hosts {
			slots[i] = h.Slots
		}
	}
	out := make([]int, 0, n)
	for len(out) < n {
		free := append([]int(nil), slots...)
		placed := false
		if mapBy == "node" {
			for any := true; any && len(out) < n; {
				any = false
				for i := range hosts {
					if free[i] > 0 && len(out) < n {
						out = append(out, i)
						free[i]--
						any, placed = true, true
					}
				}
			}
		} else {
			for i := range hosts {
				for ; free[i] > 0 && len(out) < n; free[i]-- {
					out = append(out, i)
					placed = true
				}
			}
		}
		if !placed { // every host has 0 slots: one rank each per round
			for i := range hosts {
				if len(out) < n {
					out = append(out, i)
				}
			}
		}
	}
	return out, nil
}
