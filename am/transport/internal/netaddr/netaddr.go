//go:build linux

// Package netaddr chooses the address a socket-based transport (tcp, udp)
// binds to: the interface the job uses, never every interface.
package netaddr

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"
)

// Choose picks the address to bind to: option "iface" or AMGO_IFACE (an IP
// address, or an interface name whose first IPv4 address, else first global
// IPv6 address, is used); otherwise the IPv4 address the host name resolves to
// when it is local, else 127.0.0.1. Never the unspecified address: that is an
// error.
func Choose(opts map[string]string) (netip.Addr, error) {
	s, ok := opts["iface"]
	if !ok {
		s = os.Getenv("AMGO_IFACE")
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return defaultAddr(), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if a.IsUnspecified() {
			return netip.Addr{}, fmt.Errorf("iface %s: refusing to bind to every interface; name one", s)
		}
		return a.Unmap(), nil
	}
	ifi, err := net.InterfaceByName(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("iface %q is neither an IP address nor an interface: %w", s, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("iface %q: %w", s, err)
	}
	var v6 netip.Addr
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() {
			return ip, nil
		}
		if !v6.IsValid() && !ip.IsLinkLocalUnicast() {
			v6 = ip
		}
	}
	if v6.IsValid() {
		return v6, nil
	}
	return netip.Addr{}, fmt.Errorf("iface %q has no usable IP address", s)
}

// defaultAddr is the local IPv4 address the host name resolves to, else
// 127.0.0.1.
func defaultAddr() netip.Addr {
	loopback := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	host, err := os.Hostname()
	if err != nil {
		return loopback
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
	if err != nil {
		return loopback
	}
	local := map[netip.Addr]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
					local[ip.Unmap()] = true
				}
			}
		}
	}
	for _, ip := range ips {
		if ip = ip.Unmap(); ip.IsLoopback() || local[ip] {
			return ip
		}
	}
	return loopback
}
