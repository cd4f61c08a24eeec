//go:build linux

package xdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// ProgramName is the name the XDP program is loaded under (bpftool prog
// shows it), by which an interface's program is recognised as amgo's.
const ProgramName = "amgo_xdp"

// mapEntries bounds the queue index option.
const mapEntries = 256

// maxRanks is the largest job the XSKMAP (one entry per rank) is made for.
const maxRanks = 1 << 20

// Offsets into struct xdp_md (include/uapi/linux/bpf.h).
const (
	xdpMdData    = 0
	xdpMdDataEnd = 4
)

// dstOffset is where a frame names its destination rank: after the
// Ethernet header, the magic and the source rank.
const dstOffset = EthHeader + 8

// program returns the XDP program: a frame of EtherType etherType, long
// enough to name its destination rank, is redirected to the socket in xsks
// at that rank's index (the sockets of the job's ranks on this interface),
// or passed to the kernel's stack when no socket is there
// (bpf_redirect_map's fallback action: a frame for no rank of this
// interface, which the stack drops as of an unknown protocol); every other
// frame passes, so that ARP, IP and the rest of the host's traffic are
// untouched. The kernel delivers a redirected frame only to a socket bound
// to the queue it arrived on: the ranks bind one queue, to which the NIC
// must steer the EtherType (a veth has one queue).
func program(xsks *ebpf.Map, etherType uint16) asm.Instructions {
	const xdpPass = 2
	// The EtherType as a little-endian 16-bit load reads network order.
	le := int32(etherType>>8 | etherType<<8&0xff00)
	return asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, xdpMdData, asm.Word),
		asm.LoadMem(asm.R3, asm.R1, xdpMdDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, dstOffset+4),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
		asm.JNE.Imm(asm.R5, le, "pass"),
		asm.LoadMem(asm.R2, asm.R2, dstOffset, asm.Word),
		asm.LoadMapPtr(asm.R1, xsks.FD()),
		asm.Mov.Imm(asm.R3, xdpPass),
		asm.FnRedirectMap.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"),
		asm.Return(),
	}
}

// attachment is the XDP program on one interface and its socket map.
type attachment struct {
	xsks *ebpf.Map
	prog *ebpf.Program
	lnk  link.Link
	mode string // "driver" or "generic"
}

// errNeedPrivilege marks failures for want of a capability.
var errNeedPrivilege = errors.New("needs CAP_BPF, CAP_NET_ADMIN and CAP_NET_RAW (run as root)")

// errTaken marks an interface that already has an XDP program.
var errTaken = errors.New("the interface already has an XDP program (another job's)")

// attach loads the program and attaches it to interface ifindex through a
// BPF link, which the kernel detaches when its last descriptor closes: when
// the process exits, however it exits. mode is "auto", "driver" or
// "generic"; auto is generic mode on a veth (its driver mode adds a hop
// through the veth's own NAPI ring and never offers zero-copy: generic
// measured faster), else driver mode when the driver has it, else
// generic.
//
// The program is loaded without BPF_F_XDP_HAS_FRAGS even where frames
// span several chunks: generic XDP then hands it a frame made linear
// (the kernel's xsk_rcv still spreads it over several chunks), which
// costs a copy of a large frame but spares every small one the slower
// path of frags-aware programs (docs/performance.md). A driver that will
// not run such a program on a jumbo MTU refuses the driver-mode attach,
// and auto mode then attaches in generic mode.
func attach(ifindex int, ifname string, etherType uint16, mode string, ranks int) (*attachment, error) {
	if mode == "auto" && driverName(ifname) == "veth" {
		mode = "generic"
	}
	if ranks > maxRanks {
		return nil, fmt.Errorf("a job of %d ranks: the XSKMAP holds at most %d", ranks, maxRanks)
	}
	xsks, err := ebpf.NewMap(&ebpf.MapSpec{Name: "amgo_xsks", Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(ranks)})
	if err != nil {
		return nil, privileged("create the XSKMAP", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: ProgramName, Type: ebpf.XDP, License: "Dual BSD/GPL",
		Instructions: program(xsks, etherType)})
	if err != nil {
		xsks.Close()
		return nil, privileged("load the XDP program", err)
	}
	a := &attachment{xsks: xsks, prog: prog}
	modes := map[string][]link.XDPAttachFlags{"auto": {link.XDPDriverMode, link.XDPGenericMode},
		"driver": {link.XDPDriverMode}, "generic": {link.XDPGenericMode}}[mode]
	replaced := false
	for i := 0; i < len(modes); i++ {
		m := modes[i]
		a.lnk, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: m})
		if err == nil {
			a.mode = map[link.XDPAttachFlags]string{link.XDPDriverMode: "driver", link.XDPGenericMode: "generic"}[m]
			return a, nil
		}
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
			if !replaced && removeLeftover(ifindex) {
				replaced = true
				i-- // the slot is free now: this mode again
				continue
			}
			break
		}
		// Otherwise the next mode may work where this one does not (no
		// driver XDP, an MTU too large for it): auto tries generic.
	}
	a.close()
	if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("attach the XDP program to %s: %w: %w", ifname, errTaken, err)
	}
	return nil, privileged("attach the XDP program to "+ifname, err)
}

// removeLeftover detaches the XDP program on interface ifindex when it is
// a leftover of amgo's: a program of ProgramName attached through netlink,
// which no process holds (one attached through a BPF link belongs to a
// running job, and the kernel refuses to detach it through netlink). It
// reports whether the slot is free now.
func removeLeftover(ifindex int) bool {
	id, mode, err := xdpQuery(ifindex)
	if err != nil || id == 0 {
		return false
	}
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return false
	}
	info, err := p.Info()
	p.Close()
	if err != nil || info.Name != ProgramName {
		return false
	}
	flags := map[uint8]uint32{xdpAttachedDriver: unix.XDP_FLAGS_DRV_MODE, xdpAttachedGeneric: unix.XDP_FLAGS_SKB_MODE,
		xdpAttachedHW: unix.XDP_FLAGS_HW_MODE}[mode]
	if flags == 0 {
		return false
	}
	return xdpSet(ifindex, -1, flags) == nil
}

// multiBuffer reports whether the kernel takes AF_XDP frames over several
// chunks (XDP_USE_SG, Linux 6.6).
func multiBuffer() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 6 || major == 6 && minor >= 6
}

// driverName is the name of interface ifname's driver (ethtool's), or ""
// when the kernel does not say.
func driverName(ifname string) string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, ifname)
	if err != nil {
		return ""
	}
	return unix.ByteSliceToString(info.Driver[:])
}

// privileged words a BPF failure, naming the capabilities when the kernel
// refused them.
func privileged(what string, err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("%s: %w (%w)", what, err, errNeedPrivilege)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// close releases this process's hold on the link (the program is detached
// when the last holder lets go), the program and the map.
func (a *attachment) close() {
	if a.lnk != nil {
		a.lnk.Close()
	}
	if a.prog != nil {
		a.prog.Close()
	}
	if a.xsks != nil {
		a.xsks.Close()
	}
}
