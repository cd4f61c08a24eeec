// Package nettest holds amgo's tests on a real lossy network (root only):
// two network namespaces joined by a veth pair, a TCX ingress program on both
// ends (cilium/ebpf, hand-written asm) that drops 5% of IPv4 packets at random
// with bpf_get_prandom_u32 and counts the drops in a map, and an MPI job of
// two ranks, one in each namespace, over tcp and udp: a ring and a 64 MiB
// exchange, with every byte checked and the drop counter required to be
// non-zero. Kernels without the netem queueing discipline are common in
// containers and CI machines: the TCX program is its substitute for loss.
//
// The test skips, saying why, when not run as root, when the ip command is
// missing, or when BPF or TCX is not permitted. Run it with
//
//	sudo go test ./internal/nettest/ -v
//
// The ranks are child processes of the test binary started by the launcher
// (internal/launch, as amrun does) through a helper that re-execs the binary
// with `ip netns exec NS` and sets AMGO_IFACE to the rank's veth address; the
// launcher's PMI socket (fd 3) is inherited across ip netns exec.
package nettest
