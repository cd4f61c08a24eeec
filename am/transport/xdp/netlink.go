//go:build linux

package xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// The XDP attachment of an interface as rtnetlink reports and changes it
// (include/uapi/linux/if_link.h: IFLA_XDP and its nested attributes). The
// program is attached through a BPF link, which the kernel detaches with
// its last descriptor; a program attached through netlink instead (by an
// older tool, or by hand) stays after its loader exits. A leftover amgo
// program of that kind is recognised by name and replaced (attach).

// Attach modes reported in IFLA_XDP_ATTACHED.
const (
	xdpAttachedDriver  = 1
	xdpAttachedGeneric = 2
	xdpAttachedHW      = 3
)

// rtnl sends one request to rtnetlink and returns the replies up to the
// acknowledgement (or the one reply of a request without NLM_F_ACK). An
// error reply becomes the error.
func rtnl(req []byte) ([][]byte, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 1<<16)
	var out [][]byte
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("netlink reply: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("netlink: short error reply")
				}
				if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
					return nil, unix.Errno(-code)
				}
				return out, nil // the acknowledgement
			case unix.NLMSG_DONE:
				return out, nil
			default:
				out = append(out, m.Data)
				if m.Header.Flags&unix.NLM_F_MULTI == 0 && binary.NativeEndian.Uint16(req[6:])&unix.NLM_F_ACK == 0 {
					return out, nil
				}
			}
		}
	}
}

// linkRequest builds an rtnetlink request of type typ about interface
// ifindex carrying attrs (already encoded).
func linkRequest(typ, flags uint16, ifindex int, attrs []byte) []byte {
	n := unix.SizeofNlMsghdr + unix.SizeofIfInfomsg + len(attrs)
	b := make([]byte, n)
	binary.NativeEndian.PutUint32(b[0:], uint32(n))
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint16(b[6:], flags|unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(b[8:], 1) // sequence number
	ifi := b[unix.SizeofNlMsghdr:]
	ifi[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(ifi[4:], uint32(int32(ifindex)))
	copy(b[unix.SizeofNlMsghdr+unix.SizeofIfInfomsg:], attrs)
	return b
}

// attr encodes one netlink attribute, padded to 4 bytes.
func attr(typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	b := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint16(b[0:], uint16(l))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofRtAttr:], data)
	return b
}

// forAttrs calls f for each attribute in b.
func forAttrs(b []byte, f func(typ uint16, data []byte)) {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return
		}
		f(binary.NativeEndian.Uint16(b[2:])&^unix.NLA_F_NESTED, b[unix.SizeofRtAttr:l])
		b = b[min((l+3)&^3, len(b)):]
	}
}

// xdpQuery returns the id of the XDP program attached to interface
// ifindex and its attach mode (xdpAttached*); id 0 when there is none.
func xdpQuery(ifindex int) (id uint32, mode uint8, err error) {
	replies, err := rtnl(linkRequest(unix.RTM_GETLINK, 0, ifindex, nil))
	if err != nil {
		return 0, 0, err
	}
	for _, r := range replies {
		if len(r) < unix.SizeofIfInfomsg {
			continue
		}
		forAttrs(r[unix.SizeofIfInfomsg:], func(typ uint16, data []byte) {
			if typ != unix.IFLA_XDP {
				return
			}
			forAttrs(data, func(typ uint16, v []byte) {
				switch {
				case typ == unix.IFLA_XDP_ATTACHED && len(v) >= 1:
					mode = v[0]
				case typ == unix.IFLA_XDP_PROG_ID && len(v) >= 4:
					id = binary.NativeEndian.Uint32(v)
				}
			})
		})
	}
	return id, mode, nil
}

// xdpSet attaches program fd (or, with fd -1, detaches the program) on
// interface ifindex through netlink, in generic or driver mode (flags
// XDP_FLAGS_SKB_MODE or XDP_FLAGS_DRV_MODE). The kernel refuses (EBUSY) to
// touch a program attached through a BPF link.
func xdpSet(ifindex, fd int, flags uint32) error {
	var v [4]byte
	binary.NativeEndian.PutUint32(v[:], uint32(int32(fd)))
	var fl [4]byte
	binary.NativeEndian.PutUint32(fl[:], flags)
	nested := append(attr(unix.IFLA_XDP_FD, v[:]), attr(unix.IFLA_XDP_FLAGS, fl[:])...)
	_, err := rtnl(linkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK, ifindex, attr(unix.IFLA_XDP|unix.NLA_F_NESTED, nested)))
	return err
}
